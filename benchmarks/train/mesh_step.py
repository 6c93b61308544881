"""The drafter trainer's step on 1, 2, 4, 8 (host) devices: seconds per step and labels/s.

Each device count runs in its own process (``--xla_force_host_platform_device_count`` is read
when jax starts), building the trainer exactly as ``python -m dominotree_jax.train`` does
(``train.run.make_trainer``: the same data, features, drafter flags and seed; ``--model-axis``
splits the drafter and target) and timing ``Trainer.train_step`` on the same batches
(``dataset.batch_stream``). The first step (compile) is reported apart.

On a CPU the "devices" share the host's cores, so this measures what a mesh *costs* (the
partitioned program, the gradient all-reduce, the batch split), not a speed-up.

    python -m benchmarks train mesh_step --out-root /tmp/mesh [--devices 1 2 4 8] \
        [--model-axes 1 1 1 2] [--steps 5] [TRAIN FLAGS...]

TRAIN FLAGS go to the trainer's parser (``--shards 1 --batch 8 --anchors 24 --features DIR``);
``--batch`` must divide by every device count's data axis.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

from benchmarks.common import ROOT, command_line, python_m


def worker(out: str, steps: int, model_axis: int, train_argv: list[str]) -> dict:
    """Time ``steps`` trainer steps (after one compile step) on this process's devices."""
    import jax

    from dominotree_jax.train import run as cli
    from dominotree_jax.train.dataset import batch_stream
    targs = cli.parse_args(train_argv + ["--stage", "train", "--out", out, "--steps",
                                         str(steps + 1), "--model-axis", str(model_axis)])
    os.makedirs(targs.out, exist_ok=True)
    target = cli.load_target(targs.target)
    tr, _ = cli.make_trainer(cli.RunSettings.from_args(targs), target, out=targs.out,
                             features=targs.features, model_axis=targs.model_axis)
    tc = tr.tc
    stream = batch_stream(tr.ds, tr.train_ids, batch=tc.batch, anchors=tc.anchors,
                          block=tr.dcfg.num_draft_positions, seed=tc.seed,
                          anchor_mode=tc.anchor_mode)
    times, labels = [], []
    for _ in range(steps + 1):
        batch = next(stream)
        t0 = time.perf_counter()
        m = tr.train_step(batch)
        times.append(time.perf_counter() - t0)
        labels.append(float(m["num_labels"]))
    tr.close()
    med = statistics.median(times[1:])
    return {"devices": jax.device_count(), "mesh": dict(tr.mesh.shape), "compile_s": times[0],
            "median_s": med, "labels_per_s": statistics.mean(labels[1:]) / med,
            "steps_s": times[1:]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-root", required=True)
    ap.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--model-axes", type=int, nargs="+", default=None,
                    help="devices on the model axis, one per --devices entry (default all 1)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per device count")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args, train_argv = ap.parse_known_args(argv)
    axes = args.model_axes or [1] * len(args.devices)
    if len(axes) != len(args.devices):
        raise SystemExit("--model-axes needs one entry per --devices entry")
    if args.worker is not None:
        print("RESULT " + json.dumps(worker(args.out_root, args.steps, args.worker,
                                            train_argv)), flush=True)
        return
    if os.path.exists(args.out_root):
        raise SystemExit(f"{args.out_root} exists; pick a new --out-root (run dirs fix settings)")
    from dominotree_jax.measure.timing import cpu_model
    rows = []
    for n, m in zip(args.devices, axes):
        env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                                          f" --xla_force_host_platform_device_count={n}").strip())
        cmd = python_m("train", "mesh_step", "--out-root", os.path.join(args.out_root, f"d{n}m{m}"),
                       "--steps", str(args.steps), "--worker", str(m), *train_argv)
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        res = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not res:
            raise SystemExit(f"{n} devices failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        rows.append(json.loads(res[-1][len("RESULT "):]))
        print(f"{n} devices {rows[-1]['mesh']}: {rows[-1]['median_s']:.2f} s/step", flush=True)
    base = rows[0]["median_s"]
    print(f"\nTrainer step on host devices, {cpu_model()}, "
          f"`{command_line('train', 'mesh_step', argv)}`, "
          f"{time.strftime('%Y-%m-%d', time.gmtime())}\n")
    print("| devices | mesh (data x model) | first step (compile) s | median s/step | labels/s "
          "| / 1 device |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['devices']} | {r['mesh'].get('data', 1)} x {r['mesh'].get('model', 1)} | "
              f"{r['compile_s']:.1f} | {r['median_s']:.2f} | {r['labels_per_s']:.0f} | "
              f"{r['median_s'] / base:.2f}x |")
