"""The drafter trainer's seconds per step in float32 and bfloat16, side by side in one process.

Builds one ``Trainer`` per precision exactly as ``python -m dominotree_jax.train --stage train``
does (``train.__main__._trainer``: same data, features, drafter flags and seed; only ``--dtype``
and the run directory differ), feeds both the same batches (``dataset.batch_stream``) and times
``Trainer.train_step`` (to the fetched metrics) alternately, swapping which precision goes first
every step so load drift hits both alike. The first step of each (compile) is reported apart.

    python -m benchmarks.bench_train_step --out-root /tmp/train_step [--steps 10] [TRAIN FLAGS...]

Unknown flags go to the trainer's parser (``--shards 2 --batch 8 --data data/smollm2
--features DIR ...``). Run directories ``<out-root>/float32`` and ``<out-root>/bfloat16`` must be
new (their ``run.json`` fixes the settings).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

DTYPES = ("float32", "bfloat16")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-root", required=True)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per precision")
    args, train_argv = ap.parse_known_args(argv)
    for d in DTYPES:
        if os.path.exists(os.path.join(args.out_root, d, "run.json")):
            raise SystemExit(f"{args.out_root}/{d} already holds a run; pick a new --out-root")

    from dominotree_jax.train import __main__ as cli
    from dominotree_jax.train.dataset import batch_stream

    trainers, target = {}, None
    for d in DTYPES:
        targs = cli.parse_args(train_argv + ["--stage", "train", "--dtype", d,
                                             "--out", os.path.join(args.out_root, d),
                                             "--steps", str(args.steps + 1)])
        os.makedirs(targs.out, exist_ok=True)
        target = target or cli._load_target(targs)
        trainers[d], _ = cli._trainer(targs, target)
    tr0 = trainers[DTYPES[0]]
    tc = tr0.tc
    stream = batch_stream(tr0.ds, tr0.train_ids, batch=tc.batch, anchors=tc.anchors,
                          block=tr0.dcfg.num_draft_positions, seed=tc.seed,
                          anchor_mode=tc.anchor_mode)
    times = {d: [] for d in DTYPES}
    for step in range(args.steps + 1):
        batch = next(stream)
        order = DTYPES if step % 2 == 0 else DTYPES[::-1]
        for d in order:
            t0 = time.perf_counter()
            trainers[d].train_step(batch)
            times[d].append(time.perf_counter() - t0)
    import jax
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "?")
    print(f"trainer step, {cpu}, jax {jax.__version__}, batch {tc.batch} x seq "
          f"{tr0.ds.seq_len}, {args.steps} timed steps "
          f"per precision (same batches, alternating order)")
    print("| precision | first step (compile) s | median s/step | steps s |")
    print("|---|---:|---:|---|")
    med = {}
    for d in DTYPES:
        med[d] = statistics.median(times[d][1:])
        print(f"| {d} | {times[d][0]:.2f} | {med[d]:.3f} | "
              + ", ".join(f"{t:.2f}" for t in times[d][1:]) + " |")
    print(f"bfloat16 / float32 seconds per step: {med['bfloat16'] / med['float32']:.2f}")
    for tr in trainers.values():
        tr.close()


if __name__ == "__main__":
    main()
