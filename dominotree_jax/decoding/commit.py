"""Step 4 of a round, commit (docs/algorithm.md §5): make the accepted path permanent.

After verification the tree's rows sit in cache slots ``start .. start + R - 1`` in pop order.
Committing moves the root and the accepted nodes to the contiguous slots ``start .. start + a``
(the rejected rows stay behind as garbage no mask shows), extends the drafter's context with
their tapped features, and appends the new tokens (accepted nodes, then the bonus) and their
log-probabilities to the output buffers.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dominotree_jax.decoding.accept import Accepted
from dominotree_jax.decoding.draft import Draft
from dominotree_jax.model.cache import KVCache, compact_rows, gather_rows

PAD = -1  # token value after ``num_tokens``


class Committed(NamedTuple):
    cache: KVCache
    ctx: object             # the drafter context (None for ``ar``)
    out_BO: jax.Array       # [B, O] tokens, the new ones written at n .. n + tau - 1
    logp_BO: jax.Array      # [B, O] float32 log-probs at the same slots
    tau_B: jax.Array        # [B] tokens this round adds (accepted nodes + the bonus)


def compact_accepted(cache: KVCache, start_B, rows_BP) -> KVCache:
    """Move verify rows ``rows_BP`` (root first) to slots ``start, start + 1, …``."""
    if rows_BP.shape[1] == 1:  # ar: the single root row is already in place
        return cache
    src_BP = start_B[:, None] + rows_BP
    return KVCache(compact_rows(cache.k, start_B, src_BP), compact_rows(cache.v, start_B, src_BP))


def new_tokens(draft: Draft, acc: Accepted):
    """``[B, P]`` tokens this round appends: accepted node tokens then the bonus, PAD after."""
    node_tok_BP = jnp.take_along_axis(draft.tokens_BN, jnp.maximum(acc.rows_BP - 1, 0), 1)
    j_P = jnp.arange(acc.rows_BP.shape[1])
    new_BP = jnp.where(j_P[None] < acc.num_nodes_B[:, None],
                       jnp.roll(node_tok_BP, -1, axis=1), acc.bonus_B[:, None])
    return jnp.where(j_P[None] <= acc.num_nodes_B[:, None], new_BP, PAD)


def commit(cache: KVCache, ctx, drafter, out_BO, logp_BO, *, draft: Draft, acc: Accepted,
           taps_BRF, path_logprobs_BPV, start_B, n_B, done_B) -> Committed:
    """Commit one round for every batch row; rows already ``done`` change nothing visible.

    ``taps_BRF``: the target's tapped features of the verify rows (for the drafter context);
    ``path_logprobs_BPV``: for the accepted path's rows (``acc.rows_BP``), log-probabilities of
    the distribution each successor was drawn from, or None when log-probs are not requested;
    ``n_B``: tokens generated so far.
    """
    cache = compact_accepted(cache, start_B, acc.rows_BP)
    P = acc.rows_BP.shape[1]
    if drafter is not None:
        path_pos_BP = start_B[:, None] + jnp.arange(P)[None]
        ctx = drafter.extend_context(ctx, gather_rows(taps_BRF, acc.rows_BP), path_pos_BP,
                                     start_B, acc.num_nodes_B + 1)
    new_BP = new_tokens(draft, acc)
    j_P = jnp.arange(P)
    keep_BP = (j_P[None] <= acc.num_nodes_B[:, None]) & ~done_B[:, None]
    O = out_BO.shape[1]
    rows_B1 = jnp.arange(out_BO.shape[0])[:, None]
    slot_BP = jnp.where(keep_BP, n_B[:, None] + j_P[None], O)  # O: dropped
    out_BO = out_BO.at[rows_B1, slot_BP].set(new_BP, mode="drop")
    if path_logprobs_BPV is not None:
        lp_BP = jnp.take_along_axis(path_logprobs_BPV, jnp.maximum(new_BP, 0)[..., None],
                                    2)[..., 0]
        logp_BO = logp_BO.at[rows_B1, slot_BP].set(lp_BP, mode="drop")
    return Committed(cache, ctx, out_BO, logp_BO, acc.num_nodes_B + 1)
