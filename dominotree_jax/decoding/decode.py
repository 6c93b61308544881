"""``decode``: prefill, then a ``jax.lax.while_loop`` of rounds (draft → verify → accept → commit).

Every method is a tree: ``ar`` drafts nothing (one verify row, the bonus), the chain methods
draft a chain, the tree methods a best-first tree. One round commits ``tau = accepted + 1``
tokens per batch row; rows finish independently on a stop token or ``max_new_tokens``.
Batches are right-padded: row ``b`` holds its prompt in columns ``0 .. prompt_lengths[b]-1``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.model.cache import KVCache, compact_rows, gather_rows
from dominotree_jax.model.drafter import DrafterContext
from dominotree_jax.model.target import bind_target, prefill
from dominotree_jax.sampling import sample_tokens, sampling_logprobs
from dominotree_jax.decoding.accept import accept_walk
from dominotree_jax.decoding.config import DecodeConfig
from dominotree_jax.decoding.draft import Draft, bind_drafter_for, draft_round, tap_layers_for
from dominotree_jax.decoding.verify import verify

PAD = -1  # token value after ``num_tokens``


class DecodeOutput(NamedTuple):
    tokens: jax.Array          # [B, max_new_tokens] int32, PAD after num_tokens
    num_tokens: jax.Array      # [B] int32
    accept_lengths: jax.Array  # [B, max_new_tokens] int32 tau per round (0 = no round)
    num_rounds: jax.Array      # [B] int32
    logprobs: jax.Array        # [B, max_new_tokens] float32 (zeros unless return_logprobs)


class _Loop(NamedTuple):
    cache: KVCache
    ctx: Any
    out_BO: jax.Array
    logp_BO: jax.Array
    n_B: jax.Array        # tokens generated so far; t0 = out[n-1] sits at position len + n - 1
    done_B: jax.Array
    rounds_B: jax.Array
    taus_BR: jax.Array
    key: jax.Array


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


def decode(params, prompt, *, config: DecodeConfig, key=None, prompt_lengths=None) -> DecodeOutput:
    """Generate up to ``config.max_new_tokens`` tokens after ``prompt`` (``[T]`` or ``[B, T]``).

    ``params``: ``{"target": state, "drafter": state or None}``. Pure and jittable:
    ``jax.jit(decode, static_argnames="config")``.
    """
    prompt_BT = jnp.asarray(prompt, jnp.int32)
    if prompt_BT.ndim == 1:
        prompt_BT = prompt_BT[None]
    B, T = prompt_BT.shape
    lengths_B = (jnp.full((B,), T, jnp.int32) if prompt_lengths is None
                 else jnp.asarray(prompt_lengths, jnp.int32).reshape(B))
    _check_inputs(prompt_BT, lengths_B, config, key)
    key = jax.random.key(0) if key is None else key
    S = cache_length(config, T)
    tcfg = config.target
    target = bind_target(tcfg, params["target"])
    drafter = bind_drafter_for(config, params.get("drafter"))
    taps = tap_layers_for(config)
    dtype = jax.tree.leaves(params["target"])[0].dtype

    pre, last_logits_BV = prefill(target, prompt_BT, lengths_B, S, taps)
    pos_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    key, sub = jax.random.split(key)
    first_B = sample_tokens(sub, last_logits_BV, config.temperature, config.top_k, config.top_p)
    ctx = None
    if drafter is not None:
        ctx = drafter.extend_context(DrafterContext.zeros(drafter.cfg, B, S, dtype), pre.taps, pos_BT,
                                     jnp.zeros((B,), jnp.int32), lengths_B)

    O = config.max_new_tokens + config.max_depth + 1
    out_BO = jnp.full((B, O), PAD, jnp.int32).at[:, 0].set(first_B)
    logp_BO = jnp.zeros((B, O), jnp.float32)
    if config.return_logprobs:
        lp = sampling_logprobs(last_logits_BV, config.temperature, config.top_k, config.top_p)
        logp_BO = logp_BO.at[:, 0].set(jnp.take_along_axis(lp, first_B[:, None], 1)[:, 0])
    n_B = jnp.ones((B,), jnp.int32)
    done_B = _finished(out_BO, n_B - 1, n_B, config)
    n_B = jnp.where(done_B, _stop_length(out_BO, jnp.zeros_like(n_B), n_B, config), n_B)
    state = _Loop(pre.cache, ctx, out_BO, logp_BO, n_B, done_B, jnp.zeros((B,), jnp.int32),
                  jnp.zeros((B, config.max_new_tokens), jnp.int32), key)

    def round_fn(s: _Loop) -> _Loop:
        start_B = lengths_B + s.n_B - 1
        t0_B = jnp.take_along_axis(s.out_BO, (s.n_B - 1)[:, None], 1)[:, 0]
        draft: Draft = draft_round(config, target, drafter, s.ctx, t0_B, start_B)
        logits_BRV, taps_BRF, cache = verify(target, s.cache, t0_B, start_B, draft.tokens_BN,
                                             draft.depths_BN, draft.ancestor_BRR, taps)
        key, sub = jax.random.split(s.key)
        post_BR = sample_tokens(sub, logits_BRV, config.temperature, config.top_k, config.top_p)
        acc = accept_walk(draft.tokens_BN, draft.parents_BN, draft.valid_BN, post_BR,
                          config.max_depth)
        # commit: the root + accepted path move to contiguous slots start .. start+a
        if acc.rows_BP.shape[1] > 1:  # (ar: the single root row is already in place)
            src_BP = start_B[:, None] + acc.rows_BP
            cache = KVCache(compact_rows(cache.k, start_B, src_BP),
                            compact_rows(cache.v, start_B, src_BP))
        ctx = s.ctx
        if drafter is not None:
            path_pos_BP = start_B[:, None] + jnp.arange(acc.rows_BP.shape[1])[None]
            ctx = drafter.extend_context(ctx, gather_rows(taps_BRF, acc.rows_BP), path_pos_BP,
                                         start_B, acc.num_nodes_B + 1)
        # new tokens: accepted node tokens, then the bonus
        node_tok_BP = jnp.take_along_axis(draft.tokens_BN, jnp.maximum(acc.rows_BP - 1, 0), 1)
        P = acc.rows_BP.shape[1]
        j_P = jnp.arange(P)
        new_BP = jnp.where(j_P[None] < acc.num_nodes_B[:, None],
                           jnp.roll(node_tok_BP, -1, axis=1), acc.bonus_B[:, None])
        new_BP = jnp.where(j_P[None] <= acc.num_nodes_B[:, None], new_BP, PAD)
        idx_BP = s.n_B[:, None] + j_P[None]
        rows_B = jnp.arange(B)[:, None]
        keep_BP = (j_P[None] <= acc.num_nodes_B[:, None]) & ~s.done_B[:, None]
        out_BO = s.out_BO.at[rows_B, jnp.where(keep_BP, idx_BP, O)].set(new_BP, mode="drop")
        logp_BO = s.logp_BO
        if config.return_logprobs:
            lp_BPV = sampling_logprobs(gather_rows(logits_BRV, acc.rows_BP), config.temperature,
                                       config.top_k, config.top_p)
            lp_BP = jnp.take_along_axis(lp_BPV, jnp.maximum(new_BP, 0)[..., None], 2)[..., 0]
            logp_BO = logp_BO.at[rows_B, jnp.where(keep_BP, idx_BP, O)].set(lp_BP, mode="drop")
        tau_B = acc.num_nodes_B + 1
        n_new_B = jnp.where(s.done_B, s.n_B, s.n_B + tau_B)
        stop_B = _finished(out_BO, s.n_B, n_new_B, config) & ~s.done_B
        n_new_B = jnp.where(stop_B, _stop_length(out_BO, s.n_B, n_new_B, config), n_new_B)
        taus_BR = s.taus_BR.at[jnp.arange(B), jnp.where(s.done_B, config.max_new_tokens,
                                                        s.rounds_B)].set(tau_B, mode="drop")
        return _Loop(cache, ctx, out_BO, logp_BO, n_new_B, s.done_B | stop_B,
                     s.rounds_B + (~s.done_B).astype(jnp.int32), taus_BR, key)

    final = jax.lax.while_loop(lambda s: ~jnp.all(s.done_B), round_fn, state)
    n_B = jnp.minimum(final.n_B, config.max_new_tokens)
    keep = jnp.arange(config.max_new_tokens)[None] < n_B[:, None]
    tokens = jnp.where(keep, final.out_BO[:, :config.max_new_tokens], PAD)
    logp = jnp.where(keep, final.logp_BO[:, :config.max_new_tokens], 0.0)
    return DecodeOutput(tokens, n_B, final.taus_BR, final.rounds_B, logp)


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
