"""The slot-refill AR step of data collection (``train/data/slots.py step_slots`` with slot groups),
its cache pass as dots or fused (``model/layers.py``, the note above ``_prefix_step``), in each
``--dtypes`` precision of the target (weights and KV cache), side by side in one process.

Rows sit at random positions (``--min-pos`` .. ``--max-pos``, sorted longest first as the
collector ranks them); the 4 groups read the widths ``slot_widths`` gives for ``--steps`` more
steps. Each arm compiles once, then the timed calls alternate arms. Prints a markdown table.

    python -m benchmarks step slot_step [--batch 128] [--calls 4] [--steps 24] \
        [--dtypes float32,bfloat16]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.precision import BENCHMARKED_PRECISIONS, add_precision_argument

CACHE_PASSES = {"dots (slot-major)": False, "fused": True}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--slots", type=int, default=1280, help="cache positions per row")
    ap.add_argument("--min-pos", type=int, default=60)
    ap.add_argument("--max-pos", type=int, default=700)
    ap.add_argument("--steps", type=int, default=24, help="AR steps per call")
    ap.add_argument("--calls", type=int, default=4, help="timed calls per arm")
    ap.add_argument("--seed", type=int, default=0)
    add_precision_argument(ap, "--dtypes", aliases=(), many=True, choices=BENCHMARKED_PRECISIONS,
                           help="comma-separated target precisions (weights and cache)")
    args = ap.parse_args(argv)
    dtypes = [str(p) for p in args.dtypes]
    if not 0 <= args.min_pos < args.max_pos or args.max_pos + args.steps > args.slots:
        raise SystemExit(f"positions {args.min_pos}..{args.max_pos} + {args.steps} steps must "
                         f"fit {args.slots} slots")

    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path
    from dominotree_jax.measure.timing import cpu_model
    from dominotree_jax.train.data.slots import SlotState, empty_slots, slot_widths, step_slots
    targets = {d: dj.load_target(smollm2_gguf_path(), precision=d) for d in dtypes}
    cfg = targets[dtypes[0]].config
    rng = np.random.default_rng(args.seed)
    pos = np.sort(rng.integers(args.min_pos, args.max_pos, args.batch))[::-1]
    widths = slot_widths((pos + args.steps).tolist(), 4, args.slots)
    last = rng.integers(100, cfg.vocab_size, args.batch)
    key = jax.random.key_data(jax.random.key(args.seed))
    states = {d: empty_slots(cfg, args.batch, args.slots, jnp.dtype(d)) for d in dtypes}
    arms = {(f"{d} {name}" if len(dtypes) > 1 else name): (d, fused)
            for d in dtypes for name, fused in CACHE_PASSES.items()}

    def call(arm):
        dtype, fused = arm
        state = SlotState(states[dtype].cache, jnp.asarray(pos, jnp.int32),
                          jnp.asarray(last, jnp.int32))
        t0 = time.perf_counter()
        state, toks = step_slots(targets[dtype].params, state, key, cfg=cfg, steps=args.steps,
                                 temperature=0.0, widths=widths, fused=fused)
        jax.block_until_ready(toks)
        states[dtype] = state
        return time.perf_counter() - t0

    compile_s = {name: call(arm) for name, arm in arms.items()}
    times = {name: [] for name in arms}
    for i in range(args.calls):
        names = list(arms) if i % 2 == 0 else list(arms)[::-1]
        for name in names:
            times[name].append(call(arms[name]) / args.steps)
    print(f"slot step, {cpu_model()}, jax {jax.__version__}, batch {args.batch}, positions "
          f"{pos.min()}..{pos.max()}, group widths {widths}, {args.calls} timed calls of "
          f"{args.steps} steps per arm (alternating)")
    print("| cache pass | first call (compile) s | median ms/step | tok/s | ms/step per call |")
    print("|---|---:|---:|---:|---|")
    med = {}
    for name in arms:
        med[name] = statistics.median(times[name])
        print(f"| {name} | {compile_s[name]:.1f} | {med[name] * 1e3:.0f} | "
              f"{args.batch / med[name]:.0f} | "
              + ", ".join(f"{t * 1e3:.0f}" for t in times[name]) + " |")
    fastest = min(med, key=med.get)
    for name in arms:
        if name != fastest:
            print(f"{name} / {fastest} seconds per step: {med[name] / med[fastest]:.2f}")
