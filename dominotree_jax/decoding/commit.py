"""Step 4 of a round, commit (docs/algorithm.md §5): make the accepted path permanent.

Verification returns every verify row's K/V. ``keep_rows`` picks out the root and the accepted
nodes (``RoundRows``, padded to the loop's ``P`` path slots so that every draft size gives the
same shapes; the drafter-context K/V are computed on the path's own rows, one for a plain
step), and ``commit`` writes their K/V to the contiguous slots ``start .. start + a``, writes
their drafter-context rows, and appends the new tokens (accepted nodes, then the bonus) and
their log-probabilities to the output buffers. ``budget="auto"`` runs ``keep_rows`` inside its
``lax.switch`` (one branch per size) and ``commit`` after it: a branch that wrote the cache
would make XLA copy it whole every round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax.numpy as jnp

from dominotree_jax.decoding.accept import Accepted
from dominotree_jax.decoding.draft import Draft
from dominotree_jax.model.cache import KVCache, KVRows, gather_rows, write_layer
from dominotree_jax.model.drafter import DrafterContext
from dominotree_jax.model.gated_deltanet import absorb, gather_path

if TYPE_CHECKING:   # shape annotations only; tests check them (tests/shape_check.py)
    from jaxtyping import Array, Float, Int

PAD = -1  # token value after ``num_tokens``


class RoundRows(NamedTuple):
    """What one round keeps, in ``P`` path slots (root first; slots past the accepted path repeat
    its last row and are never visible)."""
    kv: KVRows              # the kept rows' K/V, per attention layer [B, P, K, D] (and a
    #                         hybrid's recurrent rows, per linear-attention layer)
    taps_BPF: Float[Array, "B P F"]  # their tapped target features
    new_BP: Int[Array, "B P"]        # tokens to append: accepted node tokens, then the bonus; PAD
    logp_BP: Float[Array, "B P"]     # their log-probs (zeros without log-probs)
    num_nodes_B: Int[Array, " B"]    # accepted draft nodes (the round commits num_nodes + 1)
    # the drafter-context K/V of the kept rows, (k, v) per drafter layer [B, P, K', D'] (the
    # drafter's own heads; None without a drafter)
    ctx_kv: tuple | None = None


class Committed(NamedTuple):
    cache: KVCache
    ctx: DrafterContext | None   # the drafter context (None for ``ar``)
    out_BO: Int[Array, "B O"]    # tokens, the new ones written at n .. n + tau - 1
    logp_BO: Float[Array, "B O"]  # float32 log-probs at the same slots
    tau_B: Int[Array, " B"]      # tokens this round adds (accepted nodes + the bonus)


def new_tokens(draft: Draft, acc: Accepted):
    """``[B, P]`` tokens this round appends: accepted node tokens then the bonus, PAD after."""
    node_tok_BP = jnp.take_along_axis(draft.tokens_BN, jnp.maximum(acc.rows_BP - 1, 0), 1)
    j_P = jnp.arange(acc.rows_BP.shape[1])
    new_BP = jnp.where(j_P[None] < acc.num_nodes_B[:, None],
                       jnp.roll(node_tok_BP, -1, axis=1), acc.bonus_B[:, None])
    return jnp.where(j_P[None] <= acc.num_nodes_B[:, None], new_BP, PAD)


def keep_rows(draft: Draft, acc: Accepted, rows: KVRows, taps_BRF, path_logprobs_BPV,
              P: int, drafter=None, start_B=None) -> RoundRows:
    """The accepted path's rows out of one verification, padded to ``P`` slots.

    ``rows``: every verify row's K/V (per layer ``[B, R, K, D]``); ``taps_BRF``: their tapped
    features; ``path_logprobs_BPV``: for the accepted path's rows (``acc.rows_BP``),
    log-probabilities of the distribution each successor was drawn from, or None. With a
    ``drafter``, the drafter-context K/V of the path's rows (at positions ``start ..``) are
    computed here on the path's own ``p`` rows (one for a plain step), before the padding.
    """
    p = acc.rows_BP.shape[1]
    if p > P:
        raise ValueError(f"an accepted path of {p} slots does not fit in P = {P}")

    def pad(x_BpX, **kw):
        return jnp.pad(x_BpX, ((0, 0), (0, P - p)) + ((0, 0),) * (x_BpX.ndim - 2), **kw)

    new_BP = new_tokens(draft, acc)
    logp_BP = jnp.zeros(new_BP.shape, jnp.float32)
    if path_logprobs_BPV is not None:
        logp_BP = jnp.take_along_axis(path_logprobs_BPV, jnp.maximum(new_BP, 0)[..., None],
                                      2)[..., 0]
    ctx_kv = None
    if drafter is not None:
        feats_BpF = gather_rows(taps_BRF, acc.rows_BP)
        k_rows, v_rows = drafter.context_rows(feats_BpF, start_B[:, None] + jnp.arange(p)[None])
        ctx_kv = tuple((pad(k, mode="edge"), pad(v, mode="edge"))
                       for k, v in zip(k_rows, v_rows))
    rows_BP = pad(acc.rows_BP, mode="edge")

    def take(x):
        return gather_rows(x, rows_BP)
    return RoundRows(kv=KVRows(k=tuple(map(take, rows.k)), v=tuple(map(take, rows.v)),
                               recurrent=tuple(gather_path(r, take) for r in rows.recurrent)),
                     taps_BPF=gather_rows(taps_BRF, rows_BP),
                     new_BP=pad(new_BP, constant_values=PAD), logp_BP=pad(logp_BP),
                     num_nodes_B=acc.num_nodes_B, ctx_kv=ctx_kv)


def write_kept(cache: KVCache, kept: RoundRows, start_B) -> KVCache:
    """The target cache with the kept rows' K/V written at slots ``start .. start + P - 1``
    (the accepted path first; the padding slots past it are never visible), and a hybrid's
    recurrent states moved along the accepted path (``absorb_kept``)."""
    return absorb_kept(cache._replace(
        k=tuple(write_layer(c, r, start_B) for c, r in zip(cache.k, kept.kv.k)),
        v=tuple(write_layer(c, r, start_B) for c, r in zip(cache.v, kept.kv.v))), kept)


def absorb_kept(cache: KVCache, kept: RoundRows) -> KVCache:
    """A hybrid target's recurrent states after the kept path's ``num_nodes + 1`` rows (the
    root and the accepted nodes; docs/algorithm.md §5.1); the K/V as they are. Dense targets:
    ``cache`` unchanged. Rows already done absorb rows nobody reads."""
    if not cache.recurrent:
        return cache
    count_B = kept.num_nodes_B + 1
    return cache._replace(recurrent=tuple(absorb(st, rows, count_B) for st, rows in
                                          zip(cache.recurrent, kept.kv.recurrent)))


def commit(cache: KVCache, ctx, drafter, out_BO, logp_BO, kept: RoundRows, *, start_B, n_B,
           done_B, in_place: bool = False) -> Committed:
    """Commit one round for every batch row; rows already ``done`` change nothing visible
    (their cache slots at ``start ..`` are past anything they will read). ``n_B``: tokens
    generated so far. ``in_place``: the verification already wrote every row at ``start + r``
    and the accepted rows are ``0 .. a`` (``ar``, chains), so the cache is left as it is (writing
    the same rows again, unordered with the attention reads, would make XLA copy the cache)."""
    if not in_place:
        cache = write_kept(cache, kept, start_B)
    P = kept.new_BP.shape[1]
    if drafter is not None:
        if kept.ctx_kv is None:
            raise ValueError("commit with a drafter needs keep_rows(..., drafter=...)")
        ctx = drafter.write_context(ctx, tuple(k for k, _ in kept.ctx_kv),
                                    tuple(v for _, v in kept.ctx_kv), start_B,
                                    kept.num_nodes_B + 1)
    j_P = jnp.arange(P)
    keep_BP = (j_P[None] <= kept.num_nodes_B[:, None]) & ~done_B[:, None]
    O = out_BO.shape[1]
    rows_B1 = jnp.arange(out_BO.shape[0])[:, None]
    slot_BP = jnp.where(keep_BP, n_B[:, None] + j_P[None], O)  # O: dropped
    out_BO = out_BO.at[rows_B1, slot_BP].set(kept.new_BP, mode="drop")
    logp_BO = logp_BO.at[rows_B1, slot_BP].set(kept.logp_BP, mode="drop")
    return Committed(cache=cache, ctx=ctx, out_BO=out_BO, logp_BO=logp_BO,
                     tau_B=kept.num_nodes_B + 1)
