"""``decode``: prefill, then a ``jax.lax.while_loop`` of rounds (docs/algorithm.md §5).

One round, for every batch row, is the four steps in their files:
``draft.draft_round`` → ``verify.verify_rows`` → ``accept.accept_walk`` →
``commit.keep_rows`` / ``commit.commit``.
Every method is a tree: ``ar`` drafts nothing (one verify row, the bonus), the chain methods
draft a chain, the tree methods a best-first tree. A round commits ``tau = accepted + 1``
tokens per row; rows finish independently on a stop token or ``max_new_tokens``.
Batches are right-padded: row ``b`` holds its prompt in columns ``0 .. prompt_lengths[b]-1``.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.decoding.accept import accept_walk
from dominotree_jax.decoding.commit import PAD, commit, keep_rows
from dominotree_jax.decoding.config import DecodeConfig
from dominotree_jax.tree import TREE_METHODS
from dominotree_jax.decoding.auto_size import AutoPolicy
from dominotree_jax.decoding.draft import (bind_drafter_for, draft_round, first_nodes,
                                           skipped_draft, tap_layers_for)
from dominotree_jax.decoding.verify import verify_in_place, verify_rows
from dominotree_jax.model.cache import KVCache, gather_rows, write_rows
from dominotree_jax.model.drafter import DrafterContext
from dominotree_jax.model.target import bind_target, prefill
from dominotree_jax.precision import check_pair, params_precision
from dominotree_jax.sampling import sample_tokens, sampling_logprobs


class DecodeOutput(NamedTuple):
    """What ``decode`` returns (``B`` batch rows; ``max_new_tokens`` columns)."""
    tokens: jax.Array          # [B, max_new_tokens] int32, PAD (-1) after num_tokens
    num_tokens: jax.Array      # [B] int32 tokens generated (stop token included)
    accept_lengths: jax.Array  # [B, max_new_tokens] int32 tokens committed per round, 0 = none
    num_rounds: jax.Array      # [B] int32 rounds this row took part in
    logprobs: jax.Array        # [B, max_new_tokens] float32 (zeros unless return_logprobs)
    # [B, T + max_new_tokens, F] with return_features (else None): the target's tapped features
    # at absolute positions; known below prompt_length + num_tokens - 1 (the last token has not
    # been through the target), zeros/garbage from there on
    features: Any = None
    # [B, max_new_tokens] int32 draft nodes verified in each round (0 = a plain AR step; the
    # fixed size unless budget="auto"), -1 = no round
    draft_sizes: Any = None
    # budget="auto": the policy's state after the last round (``auto_size.AutoState``); pass it
    # as ``decode(..., auto_state=...)`` to the next call of the same config so that it starts
    # from what these rounds measured instead of the optimistic default
    auto_state: Any = None


class LoopState(NamedTuple):
    """The ``while_loop`` carry. ``S`` cache slots, ``O = max_new_tokens + max_depth + 1``
    output slots (room for the last round's overshoot), ``R`` = 1 + draft nodes.

    Row ``b``'s next round starts from token ``t0 = out_BO[b, n_B[b] - 1]`` at absolute position
    ``prompt_lengths[b] + n_B[b] - 1``; cache slots below that position are committed.
    """
    cache: KVCache        # target K/V [L, B, S, K, D] each
    ctx: Any              # DrafterContext (drafter K/V of committed rows) or None for ``ar``
    out_BO: jax.Array     # [B, O] int32 generated tokens, PAD beyond n_B
    logp_BO: jax.Array    # [B, O] float32 their log-probs (zeros unless return_logprobs)
    n_B: jax.Array        # [B] int32 tokens generated so far (>= 1 after prefill)
    done_B: jax.Array     # [B] bool: stopped (stop id or max_new_tokens)
    rounds_B: jax.Array   # [B] int32 rounds taken
    taus_BX: jax.Array    # [B, max_new_tokens] int32 tokens committed in each round
    key: jax.Array        # PRNG key for sampling
    feats_BWF: Any = None  # [B, T + O, F] tapped features by position (return_features only)
    sizes_BX: Any = None   # [B, max_new_tokens] int32 draft nodes verified in each round, -1 = none
    auto: Any = None       # AutoState (budget="auto" only)


def cache_length(config: DecodeConfig, prompt_len: int) -> int:
    need = prompt_len + config.max_new_tokens + config.num_draft_nodes + 1
    if config.max_len is None:
        return need
    if config.max_len < need:
        raise ValueError(
            f"prompt ({prompt_len} tokens) + max_new_tokens ({config.max_new_tokens}) + "
            f"verify rows ({config.num_draft_nodes + 1}) need {need} cache slots, but "
            f"max_len is {config.max_len}")
    return config.max_len


def _check_inputs(prompt_BT, lengths_B, config: DecodeConfig, key):
    B, T = prompt_BT.shape
    if T == 0 or B == 0:
        raise ValueError(f"empty prompt (shape {prompt_BT.shape})")
    limit = config.target.max_position_embeddings
    if T + config.max_new_tokens > limit:
        raise ValueError(f"prompt ({T}) + max_new_tokens ({config.max_new_tokens}) exceeds the "
                         f"target's max_position_embeddings ({limit})")
    if config.temperature > 0 and key is None:
        raise ValueError("temperature > 0 needs an explicit PRNG key (key=jax.random.key(...))")
    concrete = not any(isinstance(x, jax.core.Tracer) for x in (prompt_BT, lengths_B))
    if concrete:
        p, n = np.asarray(prompt_BT), np.asarray(lengths_B)
        if n.min() < 1 or n.max() > T:
            raise ValueError(f"prompt_lengths must be in [1, {T}], got {n.tolist()}")
        valid = np.arange(T)[None, :] < n[:, None]
        bad = p[valid & ((p < 0) | (p >= config.target.vocab_size))]
        if bad.size:
            raise ValueError(f"token ids outside the vocabulary [0, {config.target.vocab_size}):"
                             f" {sorted(set(bad.tolist()))[:10]}")


def decode(params, prompt, *, config: DecodeConfig, key=None, prompt_lengths=None,
           auto_state=None) -> DecodeOutput:
    """Generate up to ``config.max_new_tokens`` tokens after ``prompt`` (``[T]`` or ``[B, T]``).

    ``params``: ``{"target": state, "drafter": state or None}``. Pure and jittable:
    ``jax.jit(decode, static_argnames="config")``. ``auto_state`` (``budget="auto"`` only): a
    previous call's ``DecodeOutput.auto_state``, to carry the draft-size policy's measurements
    (delivered rate, drafter calibration, probe gap) from call to call.
    """
    prompt_BT = jnp.asarray(prompt)
    if not jnp.issubdtype(prompt_BT.dtype, jnp.integer):
        raise ValueError(f"prompt must hold integer token ids, got dtype {prompt_BT.dtype}")
    prompt_BT = prompt_BT.astype(jnp.int32)
    if prompt_BT.ndim == 1:
        prompt_BT = prompt_BT[None]
    B, T = prompt_BT.shape
    lengths_B = (jnp.full((B,), T, jnp.int32) if prompt_lengths is None
                 else jnp.asarray(prompt_lengths, jnp.int32).reshape(B))
    _check_inputs(prompt_BT, lengths_B, config, key)
    if auto_state is not None and not config.is_auto:
        raise ValueError("auto_state is only for budget='auto' configs")
    key = jax.random.key(0) if key is None else key
    S = cache_length(config, T)
    target = bind_target(config.target, params["target"])
    drafter = bind_drafter_for(config, params.get("drafter"))
    if drafter is not None:   # the precision policy's pairings (precision.py), refused by name
        check_pair(params_precision(params["target"], "target parameters"),
                   params_precision(params["drafter"], "drafter parameters"))
    taps = tap_layers_for(config)
    dtype = jax.tree.leaves(params["target"])[0].dtype

    # prefill: the prompt's K/V and tapped features, and the first token
    pre, last_logits_BV = prefill(target, prompt_BT, lengths_B, S, taps)
    key, sub = jax.random.split(key)
    first_B = sample_tokens(sub, last_logits_BV, config.temperature, config.top_k, config.top_p)
    ctx = None
    if drafter is not None:
        pos_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        ctx_slots = drafter.cfg.context_slots(S)  # a ring of W slots under a drafter window
        ctx = drafter.extend_context(DrafterContext.zeros(drafter.cfg, B, ctx_slots, dtype),
                                     pre.taps, pos_BT, jnp.zeros((B,), jnp.int32), lengths_B)

    O = config.max_new_tokens + config.max_depth + 1
    out_BO = jnp.full((B, O), PAD, jnp.int32).at[:, 0].set(first_B)
    logp_BO = jnp.zeros((B, O), jnp.float32)
    if config.return_logprobs:
        lp_BV = sampling_logprobs(last_logits_BV, config.temperature, config.top_k, config.top_p)
        logp_BO = logp_BO.at[:, 0].set(jnp.take_along_axis(lp_BV, first_B[:, None], 1)[:, 0])
    n_B = jnp.ones((B,), jnp.int32)
    done_B = _finished(out_BO, n_B - 1, n_B, config)
    n_B = jnp.where(done_B, _stop_length(out_BO, jnp.zeros_like(n_B), n_B, config), n_B)
    feats_BWF = None
    if config.return_features:
        feats_BWF = jnp.pad(pre.taps, ((0, 0), (0, O), (0, 0)))
    policy = AutoPolicy(config, B) if config.is_auto else None
    # the draft size when it is static: the budget, or 0 when auto mode can never pay to draft
    fixed_size = (config.num_draft_nodes if policy is None
                  else None if policy.can_pay else 0)
    state = LoopState(pre.cache, ctx, out_BO, logp_BO, n_B, done_B, jnp.zeros((B,), jnp.int32),
                      jnp.zeros((B, config.max_new_tokens), jnp.int32), key, feats_BWF,
                      jnp.full((B, config.max_new_tokens), -1, jnp.int32),
                      None if policy is None else policy.init(auto_state))
    P = config.max_depth + 1

    def verify_and_keep(n: int, draft, cache, t0_B, start_B, sub, in_branch: bool = False):
        """Steps 2-3 on the first ``n`` draft nodes (static ``n``): verify ``n + 1`` rows,
        accept, keep the accepted path's rows (``RoundRows``, ``P`` slots). Inside a
        ``lax.switch`` branch the cache is only read (a branch that writes it makes XLA copy it
        whole every round); otherwise the rows are written in place first. Returns (RoundRows,
        the target's first token [B], the cache)."""
        d = first_nodes(draft, n) if draft.tokens_BN.shape[1] != n else draft
        if in_branch:
            logits_BRV, taps_BRF, rows = verify_rows(target, cache, t0_B, start_B, d.tokens_BN,
                                                     d.depths_BN, d.ancestor_BRR, taps)
        else:
            logits_BRV, taps_BRF, cache, rows = verify_in_place(
                target, cache, t0_B, start_B, d.tokens_BN, d.depths_BN, d.ancestor_BRR, taps)
        post_BR = sample_tokens(sub, logits_BRV, config.temperature, config.top_k, config.top_p)
        acc = accept_walk(d.tokens_BN, d.parents_BN, d.valid_BN, post_BR,
                          min(config.drafter.num_draft_positions, n) if n else 0)
        path_lp_BPV = None
        if config.return_logprobs:
            path_lp_BPV = sampling_logprobs(gather_rows(logits_BRV, acc.rows_BP),
                                            config.temperature, config.top_k, config.top_p)
        kept = keep_rows(d, acc, rows, taps_BRF, path_lp_BPV, P, drafter, start_B)
        return kept, post_BR[:, 0], (None if in_branch else cache)

    def round_fn(s: LoopState) -> LoopState:
        start_B = lengths_B + s.n_B - 1
        t0_B = jnp.take_along_axis(s.out_BO, (s.n_B - 1)[:, None], 1)[:, 0]
        key, sub = jax.random.split(s.key)
        auto = s.auto
        if fixed_size is not None:   # a fixed size: draft, verify, accept, commit
            draft = (draft_round(config, target, drafter, s.ctx, t0_B, start_B) if fixed_size
                     else skipped_draft(B, 0))
            size_B = jnp.full((B,), fixed_size, jnp.int32)
            kept, _, cache = verify_and_keep(fixed_size, draft, s.cache, t0_B, start_B, sub)
            # the rows sit at start + r already; an accepted chain is rows 0 .. a
            in_place = config.method not in TREE_METHODS or fixed_size == 0
        else:   # auto: draft or not, pick a size, run that size's branch
            live_B = ~s.done_B
            drafted = policy.wants_draft(auto)
            draft = jax.lax.cond(
                drafted, lambda: draft_round(config, target, drafter, s.ctx, t0_B, start_B),
                lambda: skipped_draft(B, config.num_draft_nodes))
            choice = policy.choose(auto, draft, live_B)
            index = jnp.where(drafted, choice.index, 0)
            choice = choice._replace(index=index)
            branches = [functools.partial(verify_and_keep, n, in_branch=True)
                        for n in policy.sizes]
            kept, first_B, _ = jax.lax.switch(index, branches, draft, s.cache, t0_B, start_B,
                                              sub)
            cache, in_place = s.cache, False
            size_B = jnp.asarray(policy.sizes, jnp.int32)[index] + jnp.zeros((B,), jnp.int32)
            root_hit_B = jnp.any(draft.valid_BN & (draft.parents_BN < 0)
                                 & (draft.tokens_BN == first_B[:, None]), axis=1)
            auto = policy.update(auto, drafted, choice, kept.num_nodes_B + 1, kept.num_nodes_B,
                                 root_hit_B, live_B)
        # step 4, outside any branch: write the kept rows, extend the drafter context, append
        c = commit(cache, s.ctx, drafter, s.out_BO, s.logp_BO, kept, start_B=start_B,
                   n_B=s.n_B, done_B=s.done_B, in_place=in_place)
        feats_BPF = kept.taps_BPF
        n_new_B = jnp.where(s.done_B, s.n_B, s.n_B + c.tau_B)
        stop_B = _finished(c.out_BO, s.n_B, n_new_B, config) & ~s.done_B
        n_new_B = jnp.where(stop_B, _stop_length(c.out_BO, s.n_B, n_new_B, config), n_new_B)
        # record what was committed (a last round may be cut by a stop or max_new_tokens)
        round_slot_B = jnp.where(s.done_B, config.max_new_tokens, s.rounds_B)
        rows_B = jnp.arange(B)
        taus_BX = s.taus_BX.at[rows_B, round_slot_B].set(n_new_B - s.n_B, mode="drop")
        sizes_BX = s.sizes_BX.at[rows_B, round_slot_B].set(size_B, mode="drop")
        feats_BWF = s.feats_BWF
        if config.return_features:   # the committed rows' features at their positions
            W = feats_BWF.shape[1]
            feats_BWF = write_rows(feats_BWF, feats_BPF, jnp.where(s.done_B, W, start_B))
        return LoopState(c.cache, c.ctx, c.out_BO, c.logp_BO, n_new_B, s.done_B | stop_B,
                         s.rounds_B + (~s.done_B).astype(jnp.int32), taus_BX, key, feats_BWF,
                         sizes_BX, auto)

    final = jax.lax.while_loop(lambda s: ~jnp.all(s.done_B), round_fn, state)
    n_B = jnp.minimum(final.n_B, config.max_new_tokens)
    keep = jnp.arange(config.max_new_tokens)[None] < n_B[:, None]
    tokens = jnp.where(keep, final.out_BO[:, :config.max_new_tokens], PAD)
    logp = jnp.where(keep, final.logp_BO[:, :config.max_new_tokens], 0.0)
    feats = None
    if config.return_features:
        feats = final.feats_BWF[:, :T + config.max_new_tokens]
    return DecodeOutput(tokens, n_B, final.taus_BX, final.rounds_B, logp, feats,
                        final.sizes_BX, final.auto)


def _is_stop(tok, config: DecodeConfig):
    if not config.stop_ids:
        return jnp.zeros(tok.shape, bool)
    return jnp.isin(tok, jnp.asarray(config.stop_ids, jnp.int32))


def _finished(out_BO, lo_B, hi_B, config: DecodeConfig):
    """Whether tokens ``lo..hi-1`` contain a stop id, or ``hi`` reached ``max_new_tokens``."""
    i_O = jnp.arange(out_BO.shape[1])[None]
    in_range = (i_O >= lo_B[:, None]) & (i_O < hi_B[:, None])
    return jnp.any(in_range & _is_stop(out_BO, config), axis=1) | (hi_B >= config.max_new_tokens)


def _stop_length(out_BO, lo_B, hi_B, config: DecodeConfig):
    """Length after truncating at the first stop id in ``lo..hi-1`` (inclusive), else ``hi``."""
    i_O = jnp.arange(out_BO.shape[1])[None]
    hit = (i_O >= lo_B[:, None]) & (i_O < hi_B[:, None]) & _is_stop(out_BO, config)
    first = jnp.where(jnp.any(hit, 1), jnp.argmax(hit, 1) + 1, hi_B)
    return jnp.minimum(first, config.max_new_tokens)
