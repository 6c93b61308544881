"""Per-round stage times of every method on SmolLM2-135M (batch 1), against one AR step.

A round (``dominotree_jax/decoding/decode.py``) is: draft (drafter block forward) → build (chain
or tree, with its verify mask) → verify (target forward over ``1+N`` rows against a committed
cache of ``--context`` tokens, which it only reads) → accept (argmax + tree walk) → commit
(write the accepted rows' K/V into the target cache + drafter context extend). Each stage is its
own jitted function over the real code (``Drafter.draft``, ``decoding.draft.chain_draft`` /
``tree_draft``, ``decoding.verify.verify_rows``, ``decoding.accept.accept_walk``,
``decoding.commit.keep_rows`` + ``commit``), fed the previous stage's real outputs; caches
are donated as in the decode loop. Each time is the median
of ``--repeats`` calls after warm-up. "fused" is the decode loop's own round as one jitted
function (``decoding.round.fixed_round`` + ``commit_rows``; its verify writes the rows in place).
The AR step is the same round of the ``ar`` config: a one-row verify, argmax, commit.

    JAX_PLATFORMS=cpu python -m benchmarks round stages [--repeats 15] [--drafter DIR]
        [--precision float32|bfloat16|float32+bfloat16]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from dominotree_jax.calibrate import context_tokens
from dominotree_jax.measure.default_pair import load_models, usable_methods
from dominotree_jax.measure.timing import interleaved_medians
from dominotree_jax.decoding import draft as drafting
from dominotree_jax.decoding.accept import accept_walk
from dominotree_jax.decoding.commit import commit as commit_round, keep_rows
from dominotree_jax.decoding.config import CHAIN_METHODS
from dominotree_jax.decoding.round import (RoundInput, commit_rows, fixed_round,
                                           prefill_context)
from dominotree_jax.decoding.verify import verify_rows
from dominotree_jax.model.drafter import bind_drafter
from dominotree_jax.model.target import bind_target
from dominotree_jax.precision import add_precision_argument

STAGES = ("draft", "build", "verify", "accept", "commit")


def prefilled_context(pair, C: int, S: int):
    """``(cache, ctx, t0_B, start_B)`` for one row after prefilling ``C`` real tokens.

    The target's cache has ``S`` slots; the drafter context holds the taps of those ``C`` tokens;
    ``t0_B`` is token ``C`` (the next round's root) and ``start_B`` its position.
    """
    tcfg, dcfg = pair.target.config, pair.drafter_config
    ids_BT = jnp.asarray(context_tokens(pair.target, C + 1))[None]
    taps = tuple(dcfg.target_layer_ids)
    C_B = jnp.full((1,), C, jnp.int32)

    @jax.jit
    def run(params, ids_BT, C_B):
        pre = prefill_context(target=bind_target(tcfg, params["target"]),
                              drafter=bind_drafter(dcfg, params["drafter"]), prompt_BT=ids_BT,
                              lengths_B=C_B, max_len=S, tap_layers=taps)
        return pre.cache, pre.ctx

    cache, ctx = run(pair.params, ids_BT[:, :C], C_B)
    return cache, ctx, ids_BT[:, C], C_B


class Stages:
    """The jitted stages of one method's round (batch 1, fixed ``start``)."""

    def __init__(self, pair, config):
        self.cfg = config
        self.taps = drafting.tap_layers_for(config)
        tcfg, dcfg = pair.target.config, pair.drafter_config

        def bound(params):
            return bind_target(tcfg, params["target"]), bind_drafter(dcfg, params["drafter"])

        def draft(params, ctx, t0_B, start_B):
            target, drafter = bound(params)
            return drafter.draft(target, ctx, t0_B, start_B)

        def build(params, z_BJH, base_BJV, t0_B):
            target, drafter = bound(params)
            builder = (drafting.chain_draft if config.method in CHAIN_METHODS
                       else drafting.tree_draft)
            return builder(config, target, drafter, z_BJH, base_BJV, t0_B)

        def verify_stage(params, cache, t0_B, start_B, d: drafting.Draft):
            target, _ = bound(params)   # reads the cache; commit writes the kept rows
            return verify_rows(target, cache, t0_B, start_B, d.tokens_BN, d.depths_BN,
                               d.ancestor_BRR, self.taps)

        def accept(logits_BRV, d: drafting.Draft):
            post_BR = jnp.argmax(logits_BRV, axis=-1).astype(jnp.int32)
            return accept_walk(d.tokens_BN, d.parents_BN, d.valid_BN, post_BR, config.max_depth)

        def commit(params, cache, ctx, d, kv, taps_BRF, start_B, acc):
            _, drafter = bound(params)
            B = start_B.shape[0]
            out_BO = jnp.zeros((B, config.max_new_tokens + config.max_depth + 1), jnp.int32)
            kept = keep_rows(d, acc, kv, taps_BRF, None, config.max_depth + 1, drafter, start_B)
            c = commit_round(cache, ctx, drafter, out_BO, out_BO.astype(jnp.float32), kept,
                             start_B=start_B, n_B=jnp.ones((B,), jnp.int32),
                             done_B=jnp.zeros((B,), bool))
            return c.cache, c.ctx

        def fused(params, cache, ctx, t0_B, start_B):
            c = decode_round(params, cache, ctx, t0_B, start_B, config=config)
            return c.cache, c.ctx

        self.draft = jax.jit(draft)
        self.build = jax.jit(build)
        self.verify = jax.jit(verify_stage)
        self.accept = jax.jit(accept)
        self.commit = jax.jit(commit, donate_argnums=(1, 2))
        self.fused = jax.jit(fused, donate_argnums=(1, 2))


def decode_round(params, cache, ctx, t0_B, start_B, *, config):
    """The decode loop's round at a fixed size (temperature 0): ``round.fixed_round`` then
    ``round.commit_rows``; returns the ``Committed`` caches and tokens."""
    target = bind_target(config.target, params["target"])
    drafter = drafting.bind_drafter_for(config, params["drafter"])
    B = start_B.shape[0]
    inp = RoundInput(cache=cache, ctx=ctx, t0_B=t0_B, start_B=start_B, key=jax.random.key(0))
    result = fixed_round(inp, size=config.num_draft_nodes, config=config, target=target,
                         drafter=drafter)
    out_BO = jnp.zeros((B, config.max_new_tokens + config.max_depth + 1), jnp.int32)
    return commit_rows(inp, result, out_BO=out_BO, logp_BO=jnp.zeros(out_BO.shape),
                       n_B=jnp.ones((B,), jnp.int32), done_B=jnp.zeros((B,), bool),
                       drafter=drafter)


def ar_step(pair, config):
    """The jitted ``ar`` round (``decode_round`` of the ``ar`` config; cache donated)."""
    def step(params, cache, t0_B, start_B):
        c = decode_round(params, cache, None, t0_B, start_B, config=config)
        return c.out_BO[:, 1], c.cache

    return jax.jit(step, donate_argnums=1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--context", type=int, default=200, help="committed tokens in the cache")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--node-topk", type=int, default=8)
    ap.add_argument("--top-m", type=int, default=64)
    ap.add_argument("--methods", default="dflash,domino,ddtree,dominotree")
    add_precision_argument(ap, help="the pair's precision (one name, or target+drafter)")
    ap.add_argument("--drafter", default=None, help="drafter dir or 'random' (default: the "
                    "shipped smollm2-domino if present, else random)")
    args = ap.parse_args(argv)
    if args.repeats < 10:
        ap.error("--repeats must be >= 10")

    pair, _, drafter_name = load_models(None, args.drafter, args.precision)
    params = pair.params
    methods = usable_methods(tuple(args.methods.split(",")), pair.drafter_config)
    kw = dict(max_new_tokens=64, budget=args.budget, node_topk=args.node_topk, top_m=args.top_m)
    configs = {m: pair.config(m, **kw) for m in ("ar",) + methods}
    C = args.context
    S = C + max(c.num_draft_nodes for c in configs.values()) + 1 + 64

    cache0, ctx0, t0_B, start_B = prefilled_context(pair, C, S)
    copy = lambda tree: jax.tree.map(jnp.copy, tree)  # noqa: E731  (fresh buffers to donate)

    print(f"SmolLM2-135M target ({args.precision}), drafter: {drafter_name}; context {C} tokens, "
          f"cache {S} slots; "
          f"budget {args.budget}, k {args.node_topk}, M {args.top_m}; median of {args.repeats}"
          f"; {jax.default_backend()}, {jax.device_count()} device(s)", flush=True)

    step = ar_step(pair, configs["ar"])
    fns = {}

    def add(name, fn, state=None):
        """Register ``fn(state) -> (blocking)``; ``state`` holds the buffers it donates."""
        fns[name] = (lambda: fn(state)) if state is not None else fn

    def run_ar(state):
        tok, state["cache"] = step(params, state["cache"], t0_B, start_B)
        tok.block_until_ready()

    add("ar", run_ar, {"cache": copy(cache0)})
    for m in methods:
        st = Stages(pair, configs[m])
        z, base = st.draft(params, ctx0, t0_B, start_B)
        d = st.build(params, z, base, t0_B)
        logits, taps_BRF, kv = st.verify(params, cache0, t0_B, start_B, d)
        acc = st.accept(logits, d)

        def run_verify(state, st=st, d=d):
            jax.block_until_ready(st.verify(params, state["cache"], t0_B, start_B, d))

        def run_commit(state, st=st, d=d, kv=kv, taps_BRF=taps_BRF, acc=acc):
            state["cache"], state["ctx"] = st.commit(params, state["cache"], state["ctx"], d,
                                                     kv, taps_BRF, start_B, acc)
            jax.block_until_ready(state["ctx"])

        def run_fused(state, st=st):
            state["cache"], state["ctx"] = st.fused(params, state["cache"], state["ctx"],
                                                    t0_B, start_B)
            jax.block_until_ready(state["ctx"])

        add(f"{m}/draft", lambda st=st: jax.block_until_ready(st.draft(params, ctx0, t0_B,
                                                                       start_B)))
        add(f"{m}/build", lambda st=st, z=z, base=base: jax.block_until_ready(
            st.build(params, z, base, t0_B)))
        add(f"{m}/verify", run_verify, {"cache": copy(cache0)})
        add(f"{m}/accept", lambda st=st, logits=logits, d=d: jax.block_until_ready(
            st.accept(logits, d)))
        add(f"{m}/commit", run_commit, {"cache": copy(cache0), "ctx": copy(ctx0)})
        add(f"{m}/fused", run_fused, {"cache": copy(cache0), "ctx": copy(ctx0)})
        print(f"  compiled {m} ({configs[m].num_draft_nodes} draft nodes, accepted "
              f"{int(acc.num_nodes_B[0])} on this context)", flush=True)

    med = interleaved_medians(fns, args.repeats)
    ar_ms = med["ar"]
    rows = []
    for m in methods:
        times = {s: med[f"{m}/{s}"] for s in STAGES + ("fused",)}
        times["sum"] = sum(times[s] for s in STAGES)
        rows.append((m, configs[m].num_draft_nodes, times))

    print()
    cols = list(STAGES) + ["sum", "fused"]
    print("| method | rows | " + " | ".join(cols) + " | sum / AR | build share |")
    print("|---|---|" + "---|" * (len(cols) + 2))
    print(f"| ar (1 step) | 1 | – | – | {ar_ms:.1f} (1.00×) | – | – | {ar_ms:.1f} | – | 1.00 | – |")
    for m, n, t in rows:
        cells = [f"{t[c]:.1f} ({t[c] / ar_ms:.2f}×)" for c in cols]
        print(f"| {m} | {1 + n} | " + " | ".join(cells) +
              f" | {t['sum'] / ar_ms:.2f} | {100 * t['build'] / t['sum']:.0f}% |")
    print("\nms (× one AR step); build share = build / sum of stages. Break-even τ for a "
          "method ≈ its fused round / AR step.")
