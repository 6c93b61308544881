"""Per-tree build time: jitted JAX builder vs the NumPy heap reference (docs/algorithm.md §4).

SmolLM2-135M drafter shapes: V=49152, H=576, K=16, G=256, E=128; N=16, k=8, M=64, P=1.
Random weights (the timing does not depend on their values). Prints a table of median times.

    JAX_PLATFORMS=cpu python -m benchmarks round tree_build [--repeats 20] [--batch 8]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import numpy as np

from dominotree_jax.tree import build_tree
from dominotree_jax.tree.reference import build_tree_numpy

SHAPES = dict(V=49152, H=576, K=16, G=256, E=128)
SETTINGS = [  # (label, static settings)
    ("ddtree", dict(method="ddtree", top_m=0, prefix_len=1)),
    ("dominotree M=64", dict(method="dominotree", top_m=64, prefix_len=1)),
    ("dominotree M=V", dict(method="dominotree", top_m=0, prefix_len=1)),
]


def make_round(rng, V, H, K, G, E):
    f32 = np.float32
    return dict(
        base_logits=rng.standard_normal((K, V), f32) * 3, hidden=rng.standard_normal((K, H), f32),
        root_token=np.int32(7), embed=rng.standard_normal((V, H), f32) * 0.05,
        gru_w_ih=rng.standard_normal((3 * G, H), f32) * 0.05,
        gru_w_hh=rng.standard_normal((3 * G, G), f32) * 0.05,
        proj_w1=rng.standard_normal((E, H + G), f32) * 0.05,
        proj_w2=rng.standard_normal((V, E), f32) * 0.05,
    )


def median_ms(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--ref-repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8, help="rounds per vmapped call (0: skip)")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--topk", type=int, default=8)
    args = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    case = make_round(rng, **SHAPES)
    dev = {key: jax.device_put(v) for key, v in case.items()}
    print(f"backend={jax.default_backend()}  {SHAPES}  N={args.budget} k={args.topk}")
    header = (f"{'method':<18}{'jax jit (ms)':>14}{'jax vmap/tree':>15}{'numpy ref (ms)':>16}"
              f"{'speedup':>9}")
    print(header + "\n" + "-" * len(header))
    for label, st in SETTINGS:
        statics = dict(st, budget=args.budget, node_topk=args.topk)
        fn = functools.partial(build_tree, **statics)
        jax.block_until_ready(fn(**dev))  # compile
        t_jax = median_ms(lambda: jax.block_until_ready(fn(**dev)), args.repeats)
        t_vmap = float("nan")
        if args.batch:
            per_round = ("base_logits", "hidden", "root_token")
            batch = {key: (np.stack([v] * args.batch) if key in per_round else v)
                     for key, v in case.items()}
            in_axes = {key: (0 if key in per_round else None) for key in batch}
            bfn = jax.jit(jax.vmap(lambda b: fn(**b), in_axes=(in_axes,)))
            bdev = jax.device_put(batch)
            jax.block_until_ready(bfn(bdev))
            t_vmap = median_ms(lambda: jax.block_until_ready(bfn(bdev)), args.repeats) / args.batch
        t_ref = median_ms(lambda: build_tree_numpy(**case, **statics), args.ref_repeats)
        print(f"{label:<18}{t_jax:>14.3f}{t_vmap:>15.3f}{t_ref:>16.3f}{t_ref / t_jax:>8.1f}x")
