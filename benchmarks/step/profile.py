"""Where one target step goes: per-stage jitted timings on SmolLM2-135M (real weights).

Three shapes, each as ``decode`` runs them (``decoding.verify.verify``, the cache donated):
one AR step at batch 1 and at batch 16 (1 query row per batch row), and one 17-row tree
verification at batch 1. Each stage below is jitted on its own over all 30 layers with the
real weights and the step's shapes, so the stage times add up to roughly the whole step
(XLA fuses across stages inside the real step, so the sum is an upper bound):

- ``projections``: q/k/v (+ o) matmuls; ``mlp``: gate/up/down matmuls and SiLU
- ``attention``: blockwise scores, softmax and values over the cache and the new rows
  (``layers.attend_cached``)
- ``cache writes``: writing the new K/V rows into the donated per-layer ``[B, K, S, D]`` caches
- ``rope``: cos/sin tables and the rotation; ``norms``: the RMSNorms
- ``mask``: building the step's attention-mask description
- ``lm head``: the ``[rows, 576] x [576, 49152]`` product; ``embed``: the token gather

It also compiles the batched AR decode loop and reports whether it copies the KV cache
(``copy`` instructions of a cache layer's shape in the compiled program).

Times are process CPU time by default (``--clock cpu``: all threads' work, robust when other
jobs share the cores; ``--clock wall`` for an idle machine).

    python -m benchmarks step profile [--repeats 20] [--cache-len 256] [--clock cpu|wall]
        [--precision float32|bfloat16]   # the target's precision (docs/precision.md)
    python -m benchmarks step profile --copies-only   # cache copies: ar, budget 16, auto

``--steps-only``: just the three whole steps on a full cache of ``--cache-len`` slots (this
mode only uses ``verify`` and ``KVCache.zeros``, so it also runs on older trees: the
before/after table compares it on ``git archive`` of the previous commit and this tree).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import dominotree_jax as dj
from dominotree_jax.assets import smollm2_gguf_path
from dominotree_jax.decoding.verify import verify
from dominotree_jax.model import layers as L
from dominotree_jax.model.cache import KVCache
from dominotree_jax.model.target import bind_target
from dominotree_jax.precision import add_precision_argument
from dominotree_jax.measure.timing import cpu_model

from benchmarks.common import RESULTS as RESULTS_DIR

RESULTS = RESULTS_DIR / "profile.md"
CLOCK = {"cpu": time.process_time, "wall": time.perf_counter}
clock = time.process_time


def timed(fn, *args, repeats: int, donate_first: bool = False, clock_fn=None) -> float:
    """Median ms of ``fn(*args)`` after a warm-up, on ``clock_fn`` (default: this module's
    ``clock``, set by ``--clock``) (``donate_first``: arg 0 is consumed and replaced by the
    result's first element, as the decode loop threads the cache)."""
    now = clock_fn or clock
    out = jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        if donate_first:
            args = (out[0],) + args[1:]
        t0 = now()
        out = jax.block_until_ready(fn(*args))
        times.append((now() - t0) * 1e3)
    return statistics.median(times)


def step_inputs(cfg, B: int, R: int, S: int, start: int):
    """Tokens, depths and a tree (chain) for one verify of ``R`` rows at slot ``start``."""
    rng = np.random.default_rng(0)
    t0_B = jnp.asarray(rng.integers(0, cfg.vocab_size, B), jnp.int32)
    tokens_BN = jnp.asarray(rng.integers(0, cfg.vocab_size, (B, R - 1)), jnp.int32)
    depths_BN = jnp.broadcast_to(jnp.arange(R - 1, dtype=jnp.int32), (B, R - 1))
    ancestor_BRR = jnp.broadcast_to(jnp.tril(jnp.ones((R, R), bool)), (B, R, R))
    start_B = jnp.full((B,), start, jnp.int32)
    return t0_B, start_B, tokens_BN, depths_BN, ancestor_BRR


def profile_shape(target, params, B: int, R: int, S: int, repeats: int,
                  steps_only: bool = False) -> dict[str, float]:
    cfg = target.config
    nl, H, K, D = cfg.num_hidden_layers, cfg.hidden_size, cfg.num_key_value_heads, cfg.head_dim
    Q = cfg.num_attention_heads
    start = S - R - 1 if steps_only else S // 2  # a full / half-full cache
    t0_B, start_B, tokens_BN, depths_BN, ancestor_BRR = step_inputs(cfg, B, R, S, start)
    kv_dtype = jax.tree.leaves(params)[0].dtype   # the policy: the cache in the weights' dtype
    cache = KVCache.zeros(nl, B, S, K, D, kv_dtype)  # (--steps-only runs old trees: no dtype)

    @jax.jit
    def full_step(cache, params, t0_B, start_B, tokens_BN, depths_BN, ancestor_BRR):
        model = bind_target(cfg, params)
        logits, _, new_cache = verify(model, cache, t0_B, start_B, tokens_BN, depths_BN,
                                      ancestor_BRR, ())
        return new_cache, jnp.argmax(logits, -1)

    full_step_d = jax.jit(full_step.__wrapped__, donate_argnums=0)
    res = {"whole step": timed(full_step_d, cache, params, t0_B, start_B, tokens_BN, depths_BN,
                               ancestor_BRR, repeats=repeats, donate_first=True)}
    if steps_only:
        return res
    cache = KVCache.zeros(nl, B, S, K, D, kv_dtype)

    model = bind_target(cfg, params)
    lw = [layer for layer in model.layers]
    wq = ([x.self_attn.q_proj.weight[...] for x in lw])
    wk = ([x.self_attn.k_proj.weight[...] for x in lw])
    wv = ([x.self_attn.v_proj.weight[...] for x in lw])
    wo = ([x.self_attn.o_proj.weight[...] for x in lw])
    wg = ([x.mlp.gate_proj.weight[...] for x in lw])
    wu = ([x.mlp.up_proj.weight[...] for x in lw])
    wd = ([x.mlp.down_proj.weight[...] for x in lw])
    norm_w = ([x.input_layernorm.weight[...] for x in lw])
    head = model.head_weight_VH
    x_BRH = jnp.asarray(np.random.default_rng(3).standard_normal((B, R, H)), jnp.float32)

    @jax.jit
    def projections(x, wq, wk, wv, wo):
        acc = x
        for i in range(nl):
            q = L.matmul_t(acc, wq[i])
            k = L.matmul_t(acc, wk[i])
            v = L.matmul_t(acc, wv[i])
            acc = acc + L.matmul_t(q, wo[i]) + 1e-3 * jnp.sum(k + v, -1, keepdims=True)
        return acc

    @jax.jit
    def mlp(x, wg, wu, wd):
        acc = x
        for i in range(nl):
            acc = acc + L.matmul_t(jax.nn.silu(L.matmul_t(acc, wg[i])) * L.matmul_t(acc, wu[i]),
                                   wd[i])
        return acc

    q_BRQD = jnp.asarray(np.random.default_rng(4).standard_normal((B, R, Q, D)), jnp.float32)
    new_BRKD = jnp.ones((B, R, K, D), kv_dtype)

    from dominotree_jax.model.cache import view_layer as view   # a bf16 cache is its bits

    @jax.jit
    def attention(q, cache, ancestor_BRR):
        acc = q
        for i in range(nl):
            acc = acc + L.attend_cached(acc, new_BRKD, new_BRKD, ancestor_BRR, view(cache.k[i]),
                                        view(cache.v[i]), start_B)
        return acc

    from dominotree_jax.model.cache import write_layer  # (this tree's per-layer cache)

    def cache_writes(cache, new, start_B):
        return KVCache(tuple(write_layer(c, new, start_B) for c in cache.k),
                       tuple(write_layer(c, new, start_B) for c in cache.v)), None

    pos_BR = start_B[:, None] + jnp.arange(R)[None]
    inv_freq, scale = L.rope_inv_freq(D, cfg.rope_theta, cfg.rope_scaling,
                                      cfg.max_position_embeddings)

    @jax.jit
    def rope(q, pos):
        cos, sin = L.rope_cos_sin(pos, inv_freq, scale)
        acc = q
        for _ in range(nl):
            acc = L.apply_rope(acc, cos, sin)  # q
            acc = acc + 1e-3 * L.apply_rope(acc[:, :, :K], cos, sin).sum(2, keepdims=True)  # k
        return acc

    @jax.jit
    def norms(x, w):
        acc = x
        for i in range(nl):
            for _ in range(2):
                x32 = acc * jax.lax.rsqrt(jnp.mean(acc * acc, -1, keepdims=True) + 1e-5)
                acc = w[i] * x32
        return acc

    @jax.jit
    def mask(start_B, ancestor_BRR):  # the structured mask: the prefix length per row
        return ancestor_BRR & (start_B >= 0)[:, None, None]

    @jax.jit
    def lm_head(x, head):
        return jnp.argmax(L.matmul_t(x, head), -1)

    @jax.jit
    def embed(tokens, table):
        return jnp.take(table, tokens, axis=0)

    rows_BR = jnp.concatenate([t0_B[:, None], tokens_BN], 1)
    res["projections (qkvo)"] = timed(projections, x_BRH, wq, wk, wv, wo, repeats=repeats)
    res["mlp (gate/up/down)"] = timed(mlp, x_BRH, wg, wu, wd, repeats=repeats)
    res["attention"] = timed(attention, q_BRQD, cache, ancestor_BRR, repeats=repeats)
    res["cache writes"] = timed(jax.jit(cache_writes, donate_argnums=0), cache, new_BRKD, start_B,
                                repeats=repeats, donate_first=True)
    res["rope"] = timed(rope, q_BRQD, pos_BR, repeats=repeats)
    res["norms"] = timed(norms, x_BRH, norm_w, repeats=repeats)
    res["mask"] = timed(mask, start_B, ancestor_BRR, repeats=repeats)
    res["lm head"] = timed(lm_head, x_BRH, head, repeats=repeats)
    res["embed"] = timed(embed, rows_BR, model.embed_tokens.weight[...], repeats=repeats)
    return res


def whole_cache_copies(params, cfg, batch: int, prompt_len: int):
    """Count ``copy`` ops of a cache layer's shape in the compiled batched decode of ``cfg``:
    inside loop bodies / branches (per round) and in the entry computation (once)."""
    fn = jax.jit(dj.decode, static_argnames="config")
    hlo = fn.lower(params, jax.ShapeDtypeStruct((batch, prompt_len), jnp.int32), config=cfg,
                   prompt_lengths=jax.ShapeDtypeStruct((batch,), jnp.int32)).compile().as_text()
    tc = cfg.target
    S = prompt_len + cfg.max_new_tokens + cfg.num_draft_nodes + 1
    kind = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[
        jnp.dtype(jax.tree.leaves(params["target"])[0].dtype).name]
    shape = f"{kind}[{batch},{tc.num_key_value_heads},{S},{tc.head_dim}]"
    in_loops, entry, computation_is_entry = 0, 0, False
    for ln in hlo.splitlines():
        if not ln.startswith(" ") and ln.rstrip().endswith("{"):
            computation_is_entry = ln.startswith("ENTRY")
        if re.search(r"=\s*" + re.escape(shape) + r"\{[^}]*\}\s+copy\(", ln):
            entry += computation_is_entry
            in_loops += not computation_is_entry
    return in_loops, entry, shape


def copies_table(batch: int = 4, prompt_len: int = 64, new_tokens: int = 16) -> str:
    """Cache-layer copies in the compiled decode of ``ar``, fixed-budget and ``budget="auto"``
    DominoTree (SmolLM2 + the shipped drafter)."""
    from dominotree_jax.assets import smollm2_drafter_path
    pair = dj.load_pair(smollm2_gguf_path(), smollm2_drafter_path())
    lines = [f"| program (batch {batch}, prompt {prompt_len}, {new_tokens} new tokens) | "
             "cache-layer copies in the loop | in the entry (buffer init) |", "|---|---:|---:|"]
    for name, kw in (("ar", dict(method="ar")), ("dominotree, budget 16", dict(budget=16)),
                     ("dominotree, budget auto", dict(budget="auto"))):
        cfg = pair.config(kw.pop("method", "dominotree"), max_new_tokens=new_tokens, stop_ids=(),
                          **kw)
        params = pair.params if cfg.method != "ar" else {"target": pair.target.params,
                                                         "drafter": None}
        loop, entry, shape = whole_cache_copies(params, cfg, batch, prompt_len)
        lines.append(f"| {name} ({shape}) | {loop} | {entry} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--cache-len", type=int, default=256, help="cache slots S of the step")
    ap.add_argument("--clock", choices=sorted(CLOCK), default="cpu")
    ap.add_argument("--steps-only", action="store_true")
    add_precision_argument(ap, pairs=False, help="the target's precision")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--copies-only", action="store_true",
                    help="only count cache copies in the compiled decode programs")
    args = ap.parse_args(argv)
    if args.copies_only:
        print(copies_table())
        return
    global clock
    clock = CLOCK[args.clock]
    target = dj.load_target(smollm2_gguf_path(), precision=args.precision, tokenizer=False)
    shapes = [("AR step, batch 1", 1, 1), ("AR step, batch 16", 16, 1),
              ("17-row verify, batch 1", 1, 17)]
    results = {}
    for name, B, R in shapes:
        if args.steps_only and B > 1 and args.cache_len > 1024:
            continue
        results[name] = profile_shape(target, target.params, B, R, args.cache_len, args.repeats,
                                      args.steps_only)
        print(name, {k: round(v, 2) for k, v in results[name].items()}, flush=True)
    if args.steps_only:
        return
    ar16 = dj.DecodeConfig(target=target.config, method="ar", max_new_tokens=16, stop_ids=())
    ncopy, nonce, shape = whole_cache_copies({"target": target.params, "drafter": None}, ar16,
                                             16, 128)

    stages = list(results[shapes[0][0]])
    cpu = cpu_model()
    lines = [f"Per-stage jitted timings, SmolLM2-135M {args.precision} on {cpu}, cache of "
             f"{args.cache_len} slots "
             f"(half full), median of {args.repeats} runs, {args.clock} ms (% of the whole step). "
             f"{jax.devices()[0].platform} x{jax.device_count()}; shared 2-core machine.",
             "", "| stage | " + " | ".join(n for n, _, _ in shapes) + " |",
             "|---|" + "---:|" * len(shapes)]
    for st in stages:
        cells = []
        for name, _, _ in shapes:
            r = results[name]
            cells.append(f"{r[st]:.2f}" + ("" if st == "whole step"
                                           else f" ({100 * r[st] / r['whole step']:.0f}%)"))
        lines.append(f"| {st} | " + " | ".join(cells) + " |")
    ar1 = results[shapes[0][0]]["whole step"]
    ver = results[shapes[2][0]]["whole step"]
    lines += ["", f"17-row verify / AR step (batch 1): {ver / ar1:.2f}",
              f"Batch-16 AR step: {16e3 / results[shapes[1][0]]['whole step']:.0f} tokens/s "
              f"(model step only).",
              f"Cache-layer copies ({shape}) in the compiled batch-16 AR decode: {ncopy} inside "
              f"loops (per step), {nonce} in the entry computation (once: buffer init)"]
    text = "\n".join(lines)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
