"""E2 and E3 of issue 67: recipe arms and capacity at equal labels, each a short continuation of
the shipped v5 drafter (fresh AdamW moments, a constant low learning rate after a short warmup,
v5's data, features computed per batch as v5 trained, batch 4 x 48 anchors, bf16).

Arms (``ARMS``): ``control`` (v5's recipe at its end: γ 7, λ 0.2, hard labels), ``gamma4``
(γ 4, λ 0), ``soft`` (the target's distribution as the label, ``soft = 1``), ``tv`` (DSpark's
0.9 L1 + 0.1 CE), ``layers4`` (E3: the control with 4 drafter layers, the two new ones grown
as identities by ``train.grow.grow_layers``).

    python -m experiments.drafter_v6.e2_arms train --arm control --steps 400 --minutes 60
    python -m experiments.drafter_v6.e2_arms evaluate --n 40 --arms control

``train`` resumes from ``runs/v6-e2/<arm>/ckpt`` (within a host); its curve is copied to
``e2_logs/<arm>.csv`` here. ``evaluate`` measures teacher-forced chain τ of v5 and of the
arms trained on this host on the benchmark sets' prompts (never training data) and adds them to
``e2_results.json``: an arm is trained and measured in one session, the others in later ones.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = "runs/v6-e2"
CONTROL = dict(gamma=7.0, curriculum=True, lam_hold=0.0, lam_ramp=0.0, lam_end=0.2)
ARMS = {"control": CONTROL,
        "gamma4": dict(gamma=4.0, curriculum=False),
        "soft": dict(CONTROL, soft=1.0),
        "tv": dict(CONTROL, tv=0.9),
        "layers4": CONTROL}
LAYERS = {"layers4": 4}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("train", "evaluate"))
    p.add_argument("--arm", choices=tuple(ARMS), help="(train) the arm")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--lr", type=float, default=6e-5, help="constant after the warmup (v5's "
                   "final rate: 6e-4 x its min_lr_frac 0.1)")
    p.add_argument("--minutes", type=float, default=None, help="(train) stop after this")
    p.add_argument("--n", type=int, default=40, help="(evaluate) prompts per benchmark set")
    p.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=None,
                   help="(evaluate) the arms to measure (default: every arm trained on this "
                   "host); their rows join those of e2_results.json measured with the same n")
    return p.parse_args(argv)


def build(arm: str, steps: int, lr: float):
    """``(target, Trainer)`` of one arm."""
    from convert.drafter import load_drafter
    from dominotree_jax.assets import smollm2_drafter_path
    from dominotree_jax.model.state import state_to_flat
    from dominotree_jax.train.grow import grow_layers
    from dominotree_jax.train.run import load_target
    from dominotree_jax.train.trainer import TrainConfig
    from experiments.smollm2_campaign.continuation import continuation_trainer

    target = load_target()
    dcfg, v5_params = load_drafter(smollm2_drafter_path(), dtype="float32",
                                   target_cfg=target.config)
    flat = {k: np.asarray(v) for k, v in state_to_flat(v5_params).items()}
    if arm in LAYERS:
        dcfg, flat = grow_layers(dcfg, flat, LAYERS[arm])
    tc = TrainConfig(steps=steps, batch=4, anchors=48, anchor_mode="all", lr=lr, warmup=20,
                     min_lr_frac=1.0, weight_decay=0.01, precision="bfloat16",
                     ckpt_every_s=300.0, **ARMS[arm])
    tr = continuation_trainer(target, dcfg, flat, tc, os.path.join(RUNS, arm),
                              v5_params["d2t"][...])
    return target, tr


def train(args):
    _, tr = build(args.arm, args.steps, args.lr)
    deadline = None if args.minutes is None else time.time() + 60 * args.minutes
    t0, s0 = time.time(), tr.step
    tr.fit(deadline=deadline)
    print(f"{args.arm}: steps {s0} -> {tr.step} in {time.time() - t0:.0f} s", flush=True)
    tr.close()
    os.makedirs(os.path.join(HERE, "e2_logs"), exist_ok=True)
    shutil.copy(os.path.join(RUNS, args.arm, "train_log.csv"),
                os.path.join(HERE, "e2_logs", f"{args.arm}.csv"))


def evaluate(args):
    """Chain τ of v5 and of ``args.arms`` (trained here), joined with the rows already in
    ``e2_results.json`` for the same ``n`` (arms trained in other sessions, on other hosts:
    the prompts and the target's greedy answers are the same)."""
    from convert.drafter import load_drafter
    from dominotree_jax.assets import smollm2_drafter_path
    from dominotree_jax.measure.timing import bf16_units, cpu_model
    from dominotree_jax.train.eval.acceptance import BenchmarkEval
    from dominotree_jax.train.run import load_target
    path = os.path.join(HERE, "e2_results.json")
    old = json.load(open(path)) if os.path.exists(path) else {}
    if old.get("n") != args.n:
        old = {}
    rows, steps, when = (dict(old.get(k, {})) for k in
                         ("teacher_forced_chain_tau", "steps", "measured"))
    arms = args.arms or [a for a in ARMS if os.path.isdir(os.path.join(RUNS, a, "ckpt"))]
    target = load_target()
    v5 = load_drafter(smollm2_drafter_path(), dtype="float32", target_cfg=target.config)
    ev = BenchmarkEval(target, v5[0].target_layer_ids, n=args.n, anchors=24,
                       precision="bfloat16")
    machine = f"{cpu_model()} ({bf16_units()}), 2 cores"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if "v5 (start)" not in rows:
        rows["v5 (start)"], when["v5 (start)"] = ev(*v5), f"{stamp}, {machine}"
        print("v5", json.dumps(rows["v5 (start)"]), flush=True)
    for arm in arms:
        _, tr = build(arm, args.steps, args.lr)
        rows[arm], steps[arm], when[arm] = ev(tr.dcfg, tr.params), int(tr.step), \
            f"{stamp}, {machine}"
        tr.close()
        print(arm, steps[arm], json.dumps(rows[arm]), flush=True)
    out = {"command": "python -m experiments.drafter_v6.e2_arms evaluate --n N [--arms ...]",
           "n": args.n, "measured": when,
           "arms": {a: {**ARMS[a], "layers": LAYERS.get(a, 2)} for a in steps},
           "steps": steps, "lr": args.lr,
           "note": "teacher-forced chain tau (corrected head) on the target's greedy answers "
                   "to n prompts per set, 24 anchors a sequence (BenchmarkEval); every arm "
                   "continues v5 with fresh moments for the same steps and labels",
           "teacher_forced_chain_tau": rows}
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def main(argv=None):
    args = parse_args(argv)
    if args.mode == "train":
        if args.arm is None:
            raise SystemExit("train needs --arm")
        train(args)
    else:
        evaluate(args)


if __name__ == "__main__":
    main()
