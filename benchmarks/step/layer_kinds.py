"""One decoder layer of each kind at a released model's width, on this CPU: ms per one-row
step and per 17-row tree verify (the cache or state only read, as a verification inside the
decode loop reads it), side by side in one process, and the cache or state each keeps per
sequence.

    python -m benchmarks step layer_kinds [--context 1024] [--repeats 30] [--out FILE]

Layers (random weights of the real shapes; a 1-layer model with a small vocabulary, so the
time is the layer's): Qwen3.5-4B's Gated DeltaNet layer and its gated full-attention layer
(each with its MLP), a Qwen3-Coder-30B-A3B layer (attention and 128 experts, top 8) and a
gpt-oss-20b layer (sliding-window attention with sinks, 32 clamped experts, top 4), at
``--context`` committed tokens. The widths are those of the released ``config.json`` files
(``SHAPES``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.config import LinearAttentionShape, MoeShape, TargetConfig
from dominotree_jax.measure.timing import bf16_units, cpu_model, interleaved_medians
from dominotree_jax.model.cache import KVCache
from dominotree_jax.model.target import bind_target, init_target_params

# Qwen3.5-4B's text model (config.json of the release): the widths one layer needs
QWEN3_5_4B = dict(hidden_size=2560, intermediate_size=9216, num_attention_heads=16,
                  num_key_value_heads=4, head_dim=256, rope_theta=1e7, qk_norm=True,
                  attn_output_gate=True, partial_rotary_factor=0.25, norm_offset=1.0,
                  linear_attention=LinearAttentionShape(conv_kernel=4, num_key_heads=16,
                                                        num_value_heads=32, key_head_dim=128,
                                                        value_head_dim=128),
                  architecture="Qwen3_5ForCausalLM")
# Qwen3-Coder-30B-A3B-Instruct: one layer
QWEN3_CODER_30B_A3B = dict(hidden_size=2048, intermediate_size=6144, num_attention_heads=32,
                           num_key_value_heads=4, head_dim=128, rope_theta=1e7, qk_norm=True,
                           moe=MoeShape(num_experts=128, top_k=8, intermediate=768,
                                        layers=(0,)),
                           architecture="Qwen3MoeForCausalLM")
# gpt-oss-20b: one sliding-window layer (its odd layers are full attention, same widths)
GPT_OSS_20B = dict(hidden_size=2880, intermediate_size=2880, num_attention_heads=64,
                   num_key_value_heads=8, head_dim=64, rope_theta=150000.0,
                   attention_bias=True, output_bias=True, attention_sinks=True,
                   layer_types=("sliding_attention",), sliding_window=128,
                   moe=MoeShape(num_experts=32, top_k=4, intermediate=2880, layers=(0,),
                                kind="gpt_oss"),
                   architecture="GptOssForCausalLM")
SHAPES = {"qwen3.5-4b": QWEN3_5_4B, "qwen3-coder-30b-a3b": QWEN3_CODER_30B_A3B,
          "gpt-oss-20b": GPT_OSS_20B}
VOCAB = 1024   # the layer is timed, not the head


def layer_configs() -> dict[str, TargetConfig]:
    """name -> a one-layer ``TargetConfig`` of that kind."""
    return {
        "qwen3.5-4b linear_attention": TargetConfig(
            vocab_size=VOCAB, num_hidden_layers=1, layer_types=("linear_attention",),
            **QWEN3_5_4B),
        "qwen3.5-4b full_attention": TargetConfig(
            vocab_size=VOCAB, num_hidden_layers=1, layer_types=("full_attention",),
            **QWEN3_5_4B),
        "qwen3-coder-30b-a3b moe layer": TargetConfig(
            vocab_size=VOCAB, num_hidden_layers=1, **QWEN3_CODER_30B_A3B),
        "gpt-oss-20b sliding layer": TargetConfig(
            vocab_size=VOCAB, num_hidden_layers=1, **GPT_OSS_20B),
    }


def verify_tree(rows: int):
    """A fixed best-first-like tree of ``rows`` rows (root first, parents before children):
    ``(in-block ancestor mask [rows, rows], each row's depth)``."""
    parent = [-1] + [max(0, (r - 1) // 2) if r > 1 else 0 for r in range(1, rows)]
    vis = np.zeros((rows, rows), bool)
    depth = np.zeros(rows, np.int32)
    for r in range(rows):
        j = r
        while j >= 0:
            vis[r, j] = True
            j = parent[j]
        depth[r] = vis[r].sum() - 1
    return vis, depth


def layer_programs(cfg: TargetConfig, context: int, rows_options=(1, 17)):
    """``{rows: fn}``: a jitted ``forward_rows`` of ``rows`` rows after ``context`` committed
    tokens (random cache / state contents), and the layer's kept bytes per sequence."""
    params = init_target_params(cfg, 0)
    S = context + 32
    cache = KVCache.for_target(cfg, 1, S)
    rng = np.random.default_rng(0)
    cache = jax.tree.map(lambda x: jnp.asarray(0.1 * rng.standard_normal(x.shape), x.dtype),
                         cache)
    start = jnp.asarray([context], jnp.int32)
    fns = {}
    for rows in rows_options:
        vis, depth = verify_tree(rows)
        toks = jnp.asarray(rng.integers(0, VOCAB, (1, rows)), jnp.int32)
        pos = start[:, None] + jnp.asarray(depth)[None]
        mask = jnp.asarray(vis)[None]
        fwd = jax.jit(lambda w, c, t, p, m: bind_target(cfg, w).forward_rows(
            t, p, c, start, m).hidden)
        fns[rows] = (lambda f=fwd, t=toks, p=pos, m=mask: f(params, cache, t, p, m))
    kept = sum(x.nbytes for x in jax.tree.leaves(cache.recurrent))
    kept += sum(x.nbytes for x in jax.tree.leaves((cache.k, cache.v))) * context // S
    return fns, kept


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--only", nargs="*", default=None,
                    help="layers whose name holds one of these words (default: all)")
    args = ap.parse_args(argv)
    programs, kept = {}, {}
    for name, cfg in layer_configs().items():
        if args.only and not any(o in name for o in args.only):
            continue
        fns, kept[name] = layer_programs(cfg, args.context)
        for rows, fn in fns.items():
            programs[f"{name} | {rows} rows"] = fn
    ms = interleaved_medians(programs, args.repeats)
    result = {"machine": {"cpu": cpu_model(), "bf16_units": bf16_units()},
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": f"python -m benchmarks step layer_kinds --context {args.context} "
                         f"--repeats {args.repeats}",
              "context": args.context, "ms": ms, "kept_bytes_per_sequence": kept,
              "shapes": {n: {k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v)
                             for k, v in shape.items()} for n, shape in SHAPES.items()}}
    lin = ms.get("qwen3.5-4b linear_attention | 17 rows")
    full = ms.get("qwen3.5-4b full_attention | 17 rows")
    if lin and full:
        result["linear_over_full_17_rows"] = lin / full
    print(f"{result['machine']['cpu']} ({result['machine']['bf16_units']}), context "
          f"{args.context}")
    for name, t in ms.items():
        print(f"  {name:<42} {t:8.2f} ms")
    for name, b in kept.items():
        print(f"  {name:<42} {b / 2**20:8.2f} MiB kept per sequence")
    if lin and full:
        print(f"  17-row verify, linear / full attention: {lin / full:.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0
