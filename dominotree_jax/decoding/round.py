"""One round of ``decode`` as importable functions (docs/algorithm.md §5), and the prefill.

``decode`` is ``prefill_context``, ``first_state`` (the first token; the ``LoopState`` carry),
then ``jax.lax.while_loop`` over ``round_step``. What stays the same from round to round (the
config, the bound models, prompts and prompt lengths, sampling values, the policy...) is one
``LoopConstants``, built once before the loop and passed down whole. A round, for every batch
row, from the ``RoundInput`` (cache, drafter context, root token ``t0`` at position ``start``, a
sampling key, the lookup paths):

1. draft: ``draft.draft_round`` (nothing for ``ar``, a chain, or a best-first tree);
2. verify, accept, keep: ``verify_and_keep`` (one target forward over the root and the first
   ``n`` draft nodes, the target's own tokens after every row, the acceptance walk, the
   accepted path's rows in ``P`` slots);
3. the fork: ``fixed_round`` (one static size) or ``auto_round`` (``budget="auto"``: draft or
   not, pick a size, one ``lax.switch`` branch per size; ``auto_size.py``). Both return a
   ``RoundResult`` whose cache already holds the kept rows at their final slots
   (``sized_round``: one auto size without the policy);
4. commit: ``commit_rows`` (drafter context, output tokens), inside ``commit_round`` (stop
   detection, per-round records). ``round_step`` is the four in order.

Benchmarks and the calibration time these same functions, so they measure what decode runs.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp

from dominotree_jax.decoding.accept import accept_walk
from dominotree_jax.decoding.auto_size import AutoState
from dominotree_jax.decoding.commit import (PAD, Committed, RoundRows, absorb_kept, commit,
                                            keep_rows, write_kept)
from dominotree_jax.decoding import lookup
from dominotree_jax.decoding.config import DecodeConfig
from dominotree_jax.decoding.draft import (Draft, draft_round, first_nodes, lookup_draft,
                                           skipped_draft, tap_layers_for)
from dominotree_jax.decoding.loop_inputs import LoopConstants, RoundInput
from dominotree_jax.decoding.stages import (STAGE_ACCEPT, STAGE_AUTO, STAGE_COMMIT,
                                            STAGE_LOOKUP, STAGE_VERIFY)
from dominotree_jax.decoding.verify import verify_in_place, verify_rows
from dominotree_jax.model.cache import KVCache, gather_rows, write_rows
from dominotree_jax.model.drafter import DrafterContext
from dominotree_jax.model.target import prefill
from dominotree_jax.sampling import Sampling, sample_tokens, sampling_logprobs

if TYPE_CHECKING:   # shape annotations only; tests check them (tests/shape_check.py)
    from jaxtyping import Array, Bool, Float, Int, Key


class Prefilled(NamedTuple):
    """A prompt batch after prefill: the caches hold its ``T`` columns."""
    cache: KVCache                    # target K/V, per layer [B, K, S, D]
    ctx: DrafterContext | None        # drafter context of the prompt rows (None for ``ar``)
    taps_BTF: Float[Array, "B T F"]   # the target's tapped features (F = 0 for ``ar``)
    last_logits_BV: Float[Array, "B V"]  # logits after each row's last prompt token


def prefill_context(*, target, drafter, prompt_BT, lengths_B, max_len: int,
                    tap_layers: tuple[int, ...], dtype=None) -> Prefilled:
    """Forward a right-padded prompt batch into a ``max_len``-slot target cache, and (with a
    ``drafter``) its tapped features into a fresh drafter context of ``dtype`` (default: the
    target's embedding dtype; a ring of ``context_slots(max_len)`` slots)."""
    B, T = prompt_BT.shape
    pre, last_logits_BV = prefill(target, prompt_BT, lengths_B, max_len, tap_layers)
    ctx = None
    if drafter is not None:
        dtype = target.embed_tokens.weight[...].dtype if dtype is None else dtype
        pos_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        empty = DrafterContext.zeros(drafter.cfg, B, drafter.cfg.context_slots(max_len), dtype)
        ctx = drafter.extend_context(empty, pre.taps, pos_BT, jnp.zeros((B,), jnp.int32),
                                     lengths_B)
    return Prefilled(cache=pre.cache, ctx=ctx, taps_BTF=pre.taps, last_logits_BV=last_logits_BV)


def repeat_prefilled(pre: Prefilled, rows_B) -> Prefilled:
    """Row ``b`` of the result is row ``rows_B[b]`` of ``pre`` (one prefill shared by the
    rows continuing the same prompt)."""
    def take(x, axis):
        return jnp.take(x, rows_B, axis=axis)

    ctx = pre.ctx
    if ctx is not None:   # drafter K/V are [L, B, S, K, D]
        ctx = DrafterContext(k=take(ctx.k, 1), v=take(ctx.v, 1), length=take(ctx.length, 0))
    return Prefilled(cache=jax.tree.map(lambda x: take(x, 0), pre.cache), ctx=ctx,
                     taps_BTF=take(pre.taps_BTF, 0),
                     last_logits_BV=take(pre.last_logits_BV, 0))


class Verified(NamedTuple):
    """Steps 2-3 on one draft size."""
    rows: RoundRows                # the accepted path's rows, P slots
    first_B: Int[Array, " B"]       # the target's token after the root
    cache: KVCache | None          # every verify row written at start .. (None: in a branch)


class RoundResult(NamedTuple):
    """A round before its commit: the cache holds the kept rows at ``start .. start + a``."""
    cache: KVCache
    rows: RoundRows
    size_B: Int[Array, " B"]        # draft nodes verified (0 = a plain AR step)
    auto: AutoState | None         # the policy state after this round (budget="auto" only)
    # budget="auto": the policy's expected tokens committed this round (1 at a plain step)
    expected_B: Float[Array, " B"] | None = None


class LoopState(NamedTuple):
    """The ``while_loop`` carry. ``S`` cache slots, ``O = max_new_tokens + max_depth + 1``
    output slots (room for the last round's overshoot), ``Y = max_new_tokens`` (a row takes
    at most that many rounds), ``W = T + O``.

    Row ``b``'s next round starts from token ``t0 = out_BO[b, n_B[b] - 1]`` at absolute position
    ``prompt_lengths[b] + n_B[b] - 1``; cache slots below that position are committed.
    """
    cache: KVCache                  # target K/V, per layer [B, K, S, D]
    ctx: DrafterContext | None      # drafter K/V of the committed rows (None for ``ar``)
    out_BO: Int[Array, "B O"]       # generated tokens, PAD beyond n_B
    logp_BO: Float[Array, "B O"]    # their log-probs (zeros unless return_logprobs)
    n_B: Int[Array, " B"]            # tokens generated so far (>= 1 after prefill)
    done_B: Bool[Array, " B"]        # stopped (stop id or max_new_tokens)
    rounds_B: Int[Array, " B"]       # rounds taken
    taus_BY: Int[Array, "B Y"]      # tokens committed in each round
    sizes_BY: Int[Array, "B Y"]     # draft nodes verified in each round, -1 = no round
    key: Key[Array, ""]             # PRNG key for sampling
    feats_BWF: Float[Array, "B W F"] | None = None  # tapped features by position
    #                                                 (return_features only)
    auto: AutoState | None = None   # policy state (budget="auto" only)
    expected_BY: Float[Array, "B Y"] | None = None  # budget="auto": the policy's expected
    #                                 tokens committed in each round (NaN = no round)


def output_width(config) -> int:
    """``O``: the columns of ``LoopState.out_BO`` (the answer, plus room for a last round's
    ``max_depth + 1`` tokens)."""
    return config.max_new_tokens + config.max_depth + 1


def first_state(pre, key, consts: LoopConstants, *, auto) -> LoopState:
    """The loop carry after the prefill: the first token sampled from the prompt's last
    logits (rows whose first token stops are done already; ``consts.stops_Be``: per-row stop
    ids; ``consts.sampling``: runtime sampling values, else the config's)."""
    config, sampling, stops_Be = consts.config, consts.sampling, consts.stops_Be
    B = pre.last_logits_BV.shape[0]
    Y, O = config.max_new_tokens, output_width(config)
    key, sub = jax.random.split(key)
    first_B = sample_tokens(sub, pre.last_logits_BV, *sampling_settings(config, sampling))
    out_BO = jnp.full((B, O), PAD, jnp.int32).at[:, 0].set(first_B)
    logp_BO = jnp.zeros((B, O), jnp.float32)
    if config.return_logprobs:
        lp_BV = sampling_logprobs(pre.last_logits_BV, *logprob_filter(config, sampling))
        logp_BO = logp_BO.at[:, 0].set(jnp.take_along_axis(lp_BV, first_B[:, None], 1)[:, 0])
    n_B = jnp.ones((B,), jnp.int32)
    done_B = finished(out_BO, n_B - 1, n_B, config, stops_Be)
    n_B = jnp.where(done_B, stop_length(out_BO, jnp.zeros_like(n_B), n_B, config, stops_Be),
                    n_B)
    feats_BWF = (jnp.pad(pre.taps_BTF, ((0, 0), (0, O), (0, 0))) if config.return_features
                 else None)
    return LoopState(cache=pre.cache, ctx=pre.ctx, out_BO=out_BO, logp_BO=logp_BO, n_B=n_B,
                     done_B=done_B, rounds_B=jnp.zeros((B,), jnp.int32),
                     taus_BY=jnp.zeros((B, Y), jnp.int32),
                     sizes_BY=jnp.full((B, Y), -1, jnp.int32), key=key, feats_BWF=feats_BWF,
                     auto=auto,
                     expected_BY=None if auto is None else jnp.full((B, Y), jnp.nan, jnp.float32))


# ------------------------------------------------------------------ steps 2-3 and the fork

def verify_and_keep(inp: RoundInput, draft: Draft, consts: LoopConstants, *, num_nodes: int,
                    in_branch: bool = False) -> Verified:
    """Verify the root and the first ``num_nodes`` draft nodes (static) with ``consts.target``,
    sample the target's token after every row, walk the acceptance path and keep its rows
    (``P`` slots; their drafter-context rows by ``consts.drafter``). Inside a ``lax.switch``
    branch (``in_branch``) the cache is only read (a branch that writes it makes XLA copy it
    whole every round); otherwise every row is written in place first."""
    config, target = consts.config, consts.target
    d = first_nodes(draft, num_nodes) if draft.tokens_BN.shape[1] != num_nodes else draft
    taps = tap_layers_for(config)
    cache = None
    with jax.named_scope(STAGE_VERIFY):
        if in_branch:
            logits_BRV, taps_BRF, kv = verify_rows(target, inp.cache, inp.t0_B, inp.start_B,
                                                   d.tokens_BN, d.depths_BN, d.ancestor_BRR,
                                                   taps, sampled=config.sampled)
        else:
            logits_BRV, taps_BRF, cache, kv = verify_in_place(
                target, inp.cache, inp.t0_B, inp.start_B, d.tokens_BN, d.depths_BN,
                d.ancestor_BRR, taps, sampled=config.sampled)
    with jax.named_scope(STAGE_ACCEPT):
        post_BR = sample_tokens(inp.key, logits_BRV, *sampling_settings(config, consts.sampling))
        depth = min(config.draft_depth, num_nodes) if num_nodes else 0
        acc = accept_walk(d.tokens_BN, d.parents_BN, d.valid_BN, post_BR, depth)
        path_lp_BPV = None
        if config.return_logprobs:
            path_lp_BPV = sampling_logprobs(gather_rows(logits_BRV, acc.rows_BP),
                                            *logprob_filter(config, consts.sampling))
        rows = keep_rows(d, acc, kv, taps_BRF, path_lp_BPV, config.max_depth + 1,
                         consts.drafter, inp.start_B)
    return Verified(rows=rows, first_B=post_BR[:, 0], cache=cache)


def static_size(consts: LoopConstants) -> int | None:
    """The draft size when it is static: the budget, or 0 when auto mode can never pay to
    draft; None when ``auto_round`` picks it every round."""
    policy = consts.policy
    if policy is None:
        return consts.config.num_draft_nodes
    return None if policy.can_pay or policy.lookup_can_pay else 0


def fixed_round(inp: RoundInput, consts: LoopConstants, *, size: int) -> RoundResult:
    """Draft ``size`` nodes (static; 0: a plain step), verify, accept, keep. A chain's (or a
    plain step's) accepted rows are verify rows ``0 .. a``, already at their slots; a tree's
    are written there."""
    B = inp.t0_B.shape[0]
    draft = draft_round(inp, consts) if size else skipped_draft(B, 0)
    v = verify_and_keep(inp, draft, consts, num_nodes=size)
    in_place = not consts.config.is_tree or size == 0
    with jax.named_scope(STAGE_COMMIT):
        cache = (absorb_kept(v.cache, v.rows) if in_place
                 else write_kept(v.cache, v.rows, inp.start_B))
    return RoundResult(cache=cache, rows=v.rows, size_B=jnp.full((B,), size, jnp.int32),
                       auto=None)


def auto_round(inp: RoundInput, auto: AutoState, consts: LoopConstants, *,
               live_B) -> RoundResult:
    """``budget="auto"``: draft or not, pick a size for the batch (``consts.policy``,
    ``auto_size.py``), run that size's ``lax.switch`` branch (the cache only read; the plain
    step's branch on ``consts.for_plain_step()``), then write the kept rows outside it and
    update the policy state. ``live_B``: rows not done (only they count)."""
    config, policy = consts.config, consts.policy
    B = inp.t0_B.shape[0]
    plain = consts.for_plain_step()
    # a round the drafter sits out: a plain step, or (lookup drafting) the lookup paths alone,
    # weighed by the policy against a draft before the drafter runs (the merged tree reuses
    # the same paths: one search a round, in ``round_input``)
    if policy.lookup_can_pay:
        with jax.named_scope(STAGE_LOOKUP):
            looked = lookup_draft(config, inp.lookup)
        with jax.named_scope(STAGE_AUTO):
            alone = policy.choose(auto, looked, live_B, lookup=True)
            drafted = policy.wants_draft(auto, alone, live_B)
    else:
        looked, alone = skipped_draft(B, config.num_draft_nodes), None
        drafted = policy.wants_draft(auto)
    draft = looked if not policy.can_pay else jax.lax.cond(   # no drafter: lookup only
        drafted, lambda: draft_round(inp, consts), lambda: looked)
    with jax.named_scope(STAGE_AUTO):
        choice = policy.choose(auto, draft, live_B)
        if alone is not None:
            choice = jax.tree.map(lambda a, b: jnp.where(drafted, a, b), choice, alone)
        else:
            choice = choice._replace(index=jnp.where(drafted, choice.index, 0))
    branches = [functools.partial(_branch, consts=plain if n == 0 else consts, num_nodes=n)
                for n in policy.sizes]
    rows, first_B = jax.lax.switch(choice.index, branches, inp, draft)
    with jax.named_scope(STAGE_AUTO):
        root_hit_B = jnp.any(draft.valid_BN & (draft.parents_BN < 0)
                             & (draft.tokens_BN == first_B[:, None]), axis=1)
        auto = policy.update(auto, drafted, choice, rows.num_nodes_B + 1, rows.num_nodes_B,
                             root_hit_B, live_B, lookup=alone)
    size_B = jnp.asarray(policy.sizes, jnp.int32)[choice.index] + jnp.zeros((B,), jnp.int32)
    with jax.named_scope(STAGE_COMMIT):
        cache = write_kept(inp.cache, rows, inp.start_B)
    return RoundResult(cache=cache, rows=rows, size_B=size_B, auto=auto,
                       expected_B=jnp.where(size_B > 0, choice.expected_B, 1.0))


def sized_round(inp: RoundInput, draft: Draft, consts: LoopConstants, *,
                num_nodes: int) -> RoundResult:
    """What ``auto_round`` runs once it has picked ``num_nodes`` (static), without the policy:
    verify the first ``num_nodes`` nodes of ``draft`` reading the cache (a plain step on
    ``consts.for_plain_step()``), keep, write the kept rows (the calibration times this per
    size)."""
    B = inp.t0_B.shape[0]
    if num_nodes == 0:
        # a plain step: its one row written in place before the attention reads it, as in an
        # ``ar`` round. Read-then-write (below) would let XLA write the kept row -- which does
        # not depend on the logits here -- before the layer's read, so it copied every layer's
        # cache twice each round (1.33 instead of 1.0x an ``ar`` step at batch 4, Zen 5);
        # decode's auto loop writes after its size switch, which orders the write.
        v = verify_and_keep(inp, draft, consts.for_plain_step(), num_nodes=0)
        return RoundResult(cache=absorb_kept(v.cache, v.rows), rows=v.rows,
                           size_B=jnp.zeros((B,), jnp.int32), auto=None)
    v = verify_and_keep(inp, draft, consts, num_nodes=num_nodes, in_branch=True)
    return RoundResult(cache=write_kept(inp.cache, v.rows, inp.start_B), rows=v.rows,
                       size_B=jnp.full((B,), num_nodes, jnp.int32), auto=None)


def _branch(inp: RoundInput, draft: Draft, *, consts: LoopConstants, num_nodes: int):
    v = verify_and_keep(inp, draft, consts, num_nodes=num_nodes, in_branch=True)
    return v.rows, v.first_B


# ------------------------------------------------------------------ step 4 and the loop body

def commit_rows(inp: RoundInput, result: RoundResult, consts: LoopConstants, *, out_BO,
                logp_BO, n_B, done_B) -> Committed:
    """Step 4 on a ``RoundResult``: extend the drafter context with the kept rows and append
    the new tokens (and log-probs) at ``n ..``; the target cache already holds them."""
    return commit(result.cache, inp.ctx, consts.drafter, out_BO, logp_BO, result.rows,
                  start_B=inp.start_B, n_B=n_B, done_B=done_B, in_place=True)


def commit_round(state: LoopState, inp: RoundInput, result: RoundResult,
                 consts: LoopConstants, *, next_key) -> LoopState:
    """``commit_rows``, then detect stops (a last round may be cut by a stop id or
    ``max_new_tokens``) and record what the round committed."""
    config, stops_Be = consts.config, consts.stops_Be
    c = commit_rows(inp, result, consts, out_BO=state.out_BO, logp_BO=state.logp_BO,
                    n_B=state.n_B, done_B=state.done_B)
    n_new_B = jnp.where(state.done_B, state.n_B, state.n_B + c.tau_B)
    stop_B = finished(c.out_BO, state.n_B, n_new_B, config, stops_Be) & ~state.done_B
    n_new_B = jnp.where(stop_B, stop_length(c.out_BO, state.n_B, n_new_B, config, stops_Be),
                        n_new_B)
    round_slot_B = jnp.where(state.done_B, config.max_new_tokens, state.rounds_B)  # Y: dropped
    rows_B = jnp.arange(inp.t0_B.shape[0])
    feats_BWF = state.feats_BWF
    if config.return_features:   # the committed rows' features at their positions
        W = feats_BWF.shape[1]
        feats_BWF = write_rows(feats_BWF, result.rows.taps_BPF,
                               jnp.where(state.done_B, W, inp.start_B))
    return LoopState(
        cache=c.cache, ctx=c.ctx, out_BO=c.out_BO, logp_BO=c.logp_BO, n_B=n_new_B,
        done_B=state.done_B | stop_B, rounds_B=state.rounds_B + (~state.done_B).astype(jnp.int32),
        taus_BY=state.taus_BY.at[rows_B, round_slot_B].set(n_new_B - state.n_B, mode="drop"),
        sizes_BY=state.sizes_BY.at[rows_B, round_slot_B].set(result.size_B, mode="drop"),
        key=next_key, feats_BWF=feats_BWF, auto=result.auto,
        expected_BY=None if state.expected_BY is None else state.expected_BY.at[
            rows_B, round_slot_B].set(1.0 if result.expected_B is None else result.expected_B,
                                      mode="drop"))   # None: an auto loop of plain steps


def round_input(state: LoopState, consts: LoopConstants, *,
                with_lookup: bool = True) -> tuple[RoundInput, jax.Array]:
    """The round's ``RoundInput`` out of the loop carry (with lookup drafting and
    ``with_lookup``: this round's lookup paths, ``lookup.propose``), and the key of the round
    after it."""
    config, lengths_B = consts.config, consts.lengths_B
    next_key, key = jax.random.split(state.key)
    paths = None
    if config.lookup_paths and with_lookup:
        if consts.prompt_BT is None:
            raise ValueError("lookup drafting needs each row's prompt (LoopConstants.prompt_BT)")
        with jax.named_scope(STAGE_LOOKUP):
            paths = lookup.propose(config, consts.prompt_BT, lengths_B, state.out_BO, state.n_B,
                                   group=consts.group, history_BhW=consts.history_BhW)
    inp = RoundInput(cache=state.cache, ctx=state.ctx,
                     t0_B=jnp.take_along_axis(state.out_BO, (state.n_B - 1)[:, None], 1)[:, 0],
                     start_B=lengths_B + state.n_B - 1, key=key, lookup=paths)
    return inp, next_key


def round_step(state: LoopState, consts: LoopConstants) -> LoopState:
    """One round for every batch row: the body of ``decode``'s ``while_loop``."""
    inp, next_key = round_input(state, consts)
    size = static_size(consts)
    if size is not None:
        result = fixed_round(inp, consts, size=size)
        if consts.policy is not None:   # auto mode that can never pay to draft: state stays
            result = result._replace(auto=state.auto)
    else:
        result = auto_round(inp, state.auto, consts, live_B=~state.done_B)
    with jax.named_scope(STAGE_COMMIT):
        return commit_round(state, inp, result, consts, next_key=next_key)


def plain_step(state: LoopState, consts: LoopConstants) -> LoopState:
    """``budget="auto"``'s round when its policy takes a plain step and has no lookup paths to
    verify (``policy.plain_runs``): what ``round_step`` does then -- the same key, token,
    cache and drafter-context rows, the policy's ``skip`` -- written as an ``ar`` round (the
    row written in place, no draft ``cond`` and no size ``switch``), so that a stretch of plain
    steps costs what ``ar``'s do (``decode`` runs these in an inner loop between rounds the
    policy may draft in)."""
    inp, next_key = round_input(state, consts, with_lookup=False)
    result = fixed_round(inp, consts.for_plain_step(), size=0)
    result = result._replace(auto=consts.policy.skip(state.auto),
                             expected_B=jnp.ones(inp.t0_B.shape, jnp.float32))
    with jax.named_scope(STAGE_COMMIT):
        return commit_round(state, inp, result, consts, next_key=next_key)


# ------------------------------------------------------------------ stops

def sampling_settings(config: DecodeConfig, sampling: Sampling | None = None) -> tuple:
    """``(temperature, top_k, top_p)`` tokens are drawn with: ``(0, 0, 1)`` when greedy (static),
    else the runtime ``sampling`` values, or the config's own when None."""
    if not config.sampled:
        return 0.0, 0, 1.0
    if sampling is None:
        return config.temperature, config.top_k, config.top_p
    return tuple(sampling)


def logprob_filter(config: DecodeConfig, sampling: Sampling | None = None) -> tuple:
    """``(temperature, top_k, top_p)`` of the reported log-probs (``logprobs_filtered``)."""
    temperature, top_k, top_p = sampling_settings(config, sampling)
    if config.logprobs_filtered:
        return temperature, top_k, top_p
    return temperature, 0, 1.0


def is_stop(tok_BO, config: DecodeConfig, stops_Be=None):
    """Whether each token is one of ``config.stop_ids`` or of its row's ``stops_Be`` (ids
    ``>= 0``; -1 pads a row's list)."""
    hit_BO = (jnp.isin(tok_BO, jnp.asarray(config.stop_ids, jnp.int32)) if config.stop_ids
              else jnp.zeros(tok_BO.shape, bool))
    if stops_Be is not None:
        hit_BO |= jnp.any((tok_BO[:, :, None] == stops_Be[:, None, :])
                          & (stops_Be[:, None, :] >= 0), axis=-1)
    return hit_BO


def finished(out_BO, lo_B, hi_B, config: DecodeConfig, stops_Be=None):
    """Whether tokens ``lo..hi-1`` contain a stop id, or ``hi`` reached ``max_new_tokens``."""
    i_O = jnp.arange(out_BO.shape[1])[None]
    in_range = (i_O >= lo_B[:, None]) & (i_O < hi_B[:, None])
    return (jnp.any(in_range & is_stop(out_BO, config, stops_Be), axis=1)
            | (hi_B >= config.max_new_tokens))


def stop_length(out_BO, lo_B, hi_B, config: DecodeConfig, stops_Be=None):
    """Length after truncating at the first stop id in ``lo..hi-1`` (inclusive), else ``hi``."""
    i_O = jnp.arange(out_BO.shape[1])[None]
    hit = (i_O >= lo_B[:, None]) & (i_O < hi_B[:, None]) & is_stop(out_BO, config, stops_Be)
    first = jnp.where(jnp.any(hit, 1), jnp.argmax(hit, 1) + 1, hi_B)
    return jnp.minimum(first, config.max_new_tokens)

