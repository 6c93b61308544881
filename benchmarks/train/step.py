"""The drafter trainer's seconds per step under several settings, side by side in one process.

Builds one ``Trainer`` per arm exactly as ``python -m dominotree_jax.train --stage train`` does
(``train.run.make_trainer``: same data, features, drafter flags and seed; only the arm's own
flags and the run directory differ), feeds every arm the same batches
(``dataset.batch_stream``) and times ``Trainer.train_step`` (to the fetched metrics) in turn,
rotating which arm goes first every step so load drift hits all alike. The first step of each
(compile) is reported apart. The default arms are the two precisions
(``float32="--dtype float32"``, ``bfloat16="--dtype bfloat16"``).

    python -m benchmarks train step --out-root /tmp/train_step [--steps 10] \
        [--arm NAME=FLAGS ...] [TRAIN FLAGS...]
    # e.g. the full-vocabulary loss against --train-vocab 8192 on the v4 recipe:
    python -m benchmarks train step --out-root /tmp/ts --steps 6 \
        --arm full= --arm tv8192="--train-vocab 8192" --layers 2 --anchor-mode all ...

Unknown flags go to the trainer's parser (``--shards 2 --batch 8 --data data/smollm2
--features DIR ...``) and are shared by all arms; an arm's FLAGS come after them. Arms must
agree on what shapes a batch (``--batch``, ``--anchors``, ``--anchor-mode``, ``--seq-len``,
``--block-size``, the data flags). Run directories ``<out-root>/<NAME>`` must be new (their
``run.json`` fixes the settings).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import time

DEFAULT_ARMS = ("float32=--dtype float32", "bfloat16=--dtype bfloat16")
# Settings that decide what a batch holds: every arm must share the first arm's.
BATCH_FIELDS = ("data", "shard_from", "shards", "trim_loops", "batch", "anchors", "anchor_mode",
                "seq_len", "block_size", "heldout_pct", "seed")


def parse_arms(specs) -> dict[str, list[str]]:
    """``{name: flags}`` from ``NAME=FLAGS`` strings (unique names: letters, digits, ``_-.``)."""
    arms: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, flags = spec.partition("=")
        if not sep or not name or not all(c.isalnum() or c in "_-." for c in name):
            raise SystemExit(f"--arm {spec!r}: expected NAME=FLAGS with a plain NAME "
                             "(letters, digits, _ - .), e.g. tv8192='--train-vocab 8192'")
        if name in arms:
            raise SystemExit(f"--arm {name}: given twice")
        arms[name] = shlex.split(flags)
    if len(arms) < 2:
        raise SystemExit(f"--arm: give at least two arms to compare, got {list(arms)}")
    return arms


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-root", required=True)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per arm")
    ap.add_argument("--arm", action="append", default=None, metavar="NAME=FLAGS",
                    help="an arm: its name and the trainer flags it adds (repeat; default: "
                    "float32 and bfloat16)")
    args, train_argv = ap.parse_known_args(argv)
    arms = parse_arms(args.arm or DEFAULT_ARMS)
    for name in arms:
        if os.path.exists(os.path.join(args.out_root, name, "run.json")):
            raise SystemExit(f"{args.out_root}/{name} already holds a run; pick a new --out-root")

    from dominotree_jax.train import run as cli
    from dominotree_jax.train.dataset import batch_stream

    parsed, first = {}, None
    for name, flags in arms.items():
        targs = cli.parse_args(train_argv + flags + ["--stage", "train",
                                                     "--out", os.path.join(args.out_root, name),
                                                     "--steps", str(args.steps + 1)])
        shape = {k: getattr(targs, k) for k in BATCH_FIELDS}
        first = first or (name, shape)
        if shape != first[1]:
            diff = {k: (first[1][k], shape[k]) for k in BATCH_FIELDS if shape[k] != first[1][k]}
            raise SystemExit(f"--arm {name}: its batches would differ from arm {first[0]}'s "
                             f"({diff}); arms share one batch stream")
        parsed[name] = targs
    trainers, target = {}, None
    for name, targs in parsed.items():
        os.makedirs(targs.out, exist_ok=True)
        target = target or cli.load_target(targs.target)
        trainers[name], _ = cli.make_trainer(cli.RunSettings.from_args(targs), target,
                                             out=targs.out, features=targs.features,
                                             model_axis=targs.model_axis)
    names = list(trainers)
    tr0 = trainers[names[0]]
    tc = tr0.tc
    stream = batch_stream(tr0.ds, tr0.train_ids, batch=tc.batch, anchors=tc.anchors,
                          block=tr0.dcfg.num_draft_positions, seed=tc.seed,
                          anchor_mode=tc.anchor_mode)
    times = {n: [] for n in names}
    labels = []
    for step in range(args.steps + 1):
        batch = next(stream)
        k = step % len(names)
        for n in names[k:] + names[:k]:
            t0 = time.perf_counter()
            m = trainers[n].train_step(batch)
            times[n].append(time.perf_counter() - t0)
        labels.append(float(m["num_labels"]))
    import jax
    from dominotree_jax.measure.timing import cpu_model

    cpu = cpu_model()
    mean_labels = statistics.mean(labels[1:]) if len(labels) > 1 else labels[0]
    print(f"trainer step, {cpu}, jax {jax.__version__}, batch {tc.batch} x seq "
          f"{tr0.ds.seq_len}, {mean_labels:.0f} labels per step, {args.steps} timed steps "
          f"per arm (same batches, rotating order)")
    print("| arm | flags | first step (compile) s | median s/step | labels/s | steps s |")
    print("|---|---|---:|---:|---:|---|")
    med = {}
    for n in names:
        med[n] = statistics.median(times[n][1:] or times[n])
        print(f"| {n} | `{shlex.join(arms[n])}` | {times[n][0]:.2f} | {med[n]:.3f} | "
              f"{mean_labels / med[n]:.0f} | " + ", ".join(f"{t:.2f}" for t in times[n][1:]) + " |")
    for n in names[1:]:
        print(f"{n} / {names[0]} seconds per step: {med[n] / med[names[0]]:.2f}")
    for tr in trainers.values():
        tr.close()
