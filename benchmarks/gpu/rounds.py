"""The programs the suite times: a method's whole round as the decode loop runs it, and its stages
(draft, build, verify, accept/commit) each jitted alone over the real code; the decode configs
and the donated buffers (target cache, drafter context, output) they run on."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from dominotree_jax.decoding.accept import accept_walk
from dominotree_jax.decoding.commit import commit, keep_rows
from dominotree_jax.decoding.config import CHAIN_METHODS, DecodeConfig
from dominotree_jax.decoding.draft import (
    bind_drafter_for, chain_draft, tap_layers_for, tree_draft,
)
from dominotree_jax.decoding.loop_inputs import LoopConstants, RoundInput
from dominotree_jax.decoding.round import commit_rows, fixed_round
from dominotree_jax.decoding.verify import verify_rows
from dominotree_jax.model.cache import KVCache
from dominotree_jax.model.drafter import DrafterContext, drafter_graphdef
from dominotree_jax.model.target import bind_target, target_graphdef
from dominotree_jax.sampling import sample_tokens

from benchmarks.gpu.configs import BUDGET, NODE_TOPK, TOP_M, PairSpec

def _bound(config: DecodeConfig, params):
    return (bind_target(config.target, params["target"]),
            bind_drafter_for(config, params["drafter"]))


def _draft_stage(params, ctx, t0_B, start_B, *, config):
    target, drafter = _bound(config, params)
    return drafter.draft(target, ctx, t0_B, start_B)


def _build_stage(params, z_BJH, base_BJV, t0_B, *, config):
    target, drafter = _bound(config, params)
    build = chain_draft if config.method in CHAIN_METHODS else tree_draft
    return build(config, target, drafter, z_BJH, base_BJV, t0_B)


def _verify_stage(params, cache, t0_B, start_B, draft, *, config):
    """The verify forward (the cache is only read; the rows' K/V come back)."""
    target, _ = _bound(config, params)
    return verify_rows(target, cache, t0_B, start_B, draft.tokens_BN, draft.depths_BN,
                       draft.ancestor_BRR, tap_layers_for(config))


def _accept_commit_stage(params, cache, ctx, out_BO, logits_BRV, taps_BRF, kv, draft, t0_B,
                         start_B, n_B, *, config):
    """Greedy acceptance (temperature 0) and the commit, as the decode loop runs them."""
    _, drafter = _bound(config, params)
    post_BR = sample_tokens(jax.random.key(0), logits_BRV, 0.0)
    acc = accept_walk(draft.tokens_BN, draft.parents_BN, draft.valid_BN, post_BR,
                      config.max_depth)
    kept = keep_rows(draft, acc, kv, taps_BRF, None, config.max_depth + 1, drafter, start_B)
    c = commit(cache, ctx, drafter, out_BO, jnp.zeros(out_BO.shape, jnp.float32), kept,
               start_B=start_B, n_B=n_B, done_B=jnp.zeros(t0_B.shape, bool))
    return c.cache, c.ctx, c.out_BO, c.tau_B


def _round(params, cache, ctx, out_BO, t0_B, start_B, n_B, *, config):
    """One whole round as decode runs it (``decoding.round.fixed_round`` + ``commit_rows``):
    draft (block forward + chain/tree) → verify (rows written in place) → accept → commit."""
    target, drafter = _bound(config, params)
    consts = LoopConstants(config=config, target=target, drafter=drafter)
    inp = RoundInput(cache=cache, ctx=ctx, t0_B=t0_B, start_B=start_B, key=jax.random.key(0))
    result = fixed_round(inp, consts, size=config.num_draft_nodes)
    c = commit_rows(inp, result, consts, out_BO=out_BO,
                    logp_BO=jnp.zeros(out_BO.shape, jnp.float32), n_B=n_B,
                    done_B=jnp.zeros(t0_B.shape, bool))
    return c.cache, c.ctx, c.out_BO, c.tau_B


# jitted once here: equal static settings and shapes share a compiled program across methods
# (one verify program per row count, one draft program per pair); caches are donated, as in
# the decode loop
draft_stage = jax.jit(_draft_stage, static_argnames="config")
build_stage = jax.jit(_build_stage, static_argnames="config")
verify_stage = jax.jit(_verify_stage, static_argnames="config")
accept_commit_stage = jax.jit(_accept_commit_stage, static_argnames="config",
                              donate_argnums=(1, 2, 3))
round_stage = jax.jit(_round, static_argnames="config", donate_argnums=(1, 2, 3))


def shared_config(config: DecodeConfig, **fields) -> DecodeConfig:
    """``config`` with the fields a stage does not depend on made equal across methods, so that
    stages with equal shapes hit the same compiled program."""
    return config.replace(**fields)


def decode_configs(spec: PairSpec, *, max_new_tokens: int, use_pallas) -> dict:
    """``DecodeConfig`` of ``ar`` and of every method of ``spec`` (budget 16, k 8, M 64)."""
    return {m: DecodeConfig(target=spec.target, drafter=spec.drafter, method=m,
                            max_new_tokens=max_new_tokens, budget=BUDGET, node_topk=NODE_TOPK,
                            top_m=TOP_M, use_pallas=use_pallas)
            for m in ("ar",) + spec.methods}


def round_buffers(spec: PairSpec, configs: dict, *, context: int, max_new_tokens: int,
                  dtype) -> dict:
    """Buffers a donating call consumes: the target cache with ``context`` committed slots
    (zeros: values do not change the cost), the drafter context of the same length, and the
    output buffer; sized as ``decode`` sizes them for ``max_new_tokens``."""
    tcfg = spec.target
    rows = max(c.num_draft_nodes for c in configs.values()) + 1
    S = context + max_new_tokens + rows
    O = max_new_tokens + max(c.max_depth for c in configs.values()) + 1
    cache = KVCache.for_target(tcfg, 1, S, dtype)
    ctx = DrafterContext.zeros(spec.drafter, 1, S, dtype)._replace(
        length=jnp.full((1,), context, jnp.int32))
    return {"cache": cache, "ctx": ctx, "out": jnp.zeros((1, O), jnp.int32)}


def abstract_round_args(spec: PairSpec, config: DecodeConfig, *, context: int,
                        max_new_tokens: int, dtype=jnp.bfloat16) -> tuple:
    """``round_stage``'s positional arguments as shapes only (no memory): for tracing and
    lowering a real-size round on any host, e.g. for ``cuda``."""
    name = jnp.dtype(dtype).name
    params = {"target": target_graphdef(spec.target, name)[1],
              "drafter": drafter_graphdef(spec.drafter, name)[1]}
    configs = decode_configs(spec, max_new_tokens=max_new_tokens, use_pallas=config.use_pallas)
    bufs = jax.eval_shape(functools.partial(round_buffers, spec, configs, context=context,
                                            max_new_tokens=max_new_tokens, dtype=dtype))
    B1 = jax.ShapeDtypeStruct((1,), jnp.int32)
    ctx = bufs["ctx"] if config.method != "ar" else None
    return params, bufs["cache"], ctx, bufs["out"], B1, B1, B1
