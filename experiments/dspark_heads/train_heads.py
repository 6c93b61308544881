"""DSpark's heads for SmolLM2 on the shipped v5 backbone (issue 65 §4): the v5 drafter warm
starts a DSpark one (``train.grow.with_dspark_heads``: its Domino head gives way to a rank-R
Markov head, output at zero, and a confidence head), the backbone frozen (``backbone_lr=0``),
trained with DeepSpec's loss mix (0.1 CE, 0.9 L1, 1.0 confidence BCE, depth weights exp(-d/4))
on the repository's data with features computed per batch, as the v5 campaign did. Resumable
within a host (``--out``/ckpt); ``--evaluate`` then measures teacher-forced chain τ of the
backbone (DFlash), v5 (Domino) and the DSpark heads on the benchmark sets' prompts and writes
``results.json`` here.

    python -m experiments.dspark_heads.train_heads --out runs/dspark-heads --minutes 70
    python -m experiments.dspark_heads.train_heads --out runs/dspark-heads --evaluate
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/dspark-heads")
    p.add_argument("--rank", type=int, default=32, help="the Markov head's rank")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--anchors", type=int, default=24)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--minutes", type=float, default=None, help="stop training after this")
    p.add_argument("--evaluate", action="store_true", help="measure and write results.json")
    p.add_argument("--eval-n", type=int, default=10, help="prompts per benchmark set")
    return p.parse_args(argv)


def build(args):
    """``(target, Trainer, (v5 config, v5 params))``."""
    from convert.drafter import load_drafter
    from dominotree_jax.assets import smollm2_drafter_path
    from dominotree_jax.model.state import state_to_flat
    from dominotree_jax.train.grow import with_dspark_heads
    from dominotree_jax.train.run import load_target
    from dominotree_jax.train.trainer import TrainConfig
    from experiments.smollm2_campaign.continuation import continuation_trainer

    target = load_target()
    v5_cfg, v5_params = load_drafter(smollm2_drafter_path(), dtype="float32",
                                     target_cfg=target.config)
    flat = {k: np.asarray(v) for k, v in state_to_flat(v5_params).items()}
    dcfg, flat = with_dspark_heads(v5_cfg, flat, args.rank, seed=0)
    tc = TrainConfig(steps=args.steps, batch=args.batch, anchors=args.anchors, lr=args.lr,
                     warmup=30, gamma=4.0, curriculum=False, backbone_lr=0.0,
                     precision="bfloat16", ckpt_every_s=300.0, weight_decay=0.0)
    tr = continuation_trainer(target, dcfg, flat, tc, args.out, v5_params["d2t"][...])
    return target, tr, (v5_cfg, v5_params)


def train(args):
    _, tr, _ = build(args)
    deadline = None if args.minutes is None else time.time() + 60 * args.minutes
    t0, s0 = time.time(), tr.step
    tr.fit(deadline=deadline)
    print(f"steps {s0} -> {tr.step} in {time.time() - t0:.0f} s", flush=True)
    tr.close()


def evaluate(args):
    from convert.drafter import save_drafter
    from dominotree_jax.measure.timing import bf16_units, cpu_model
    from dominotree_jax.train.eval.acceptance import BenchmarkEval
    target, tr, (v5_cfg, v5_params) = build(args)
    export = os.path.join(args.out, "drafter")
    save_drafter(export, tr.dcfg, tr.params, dtype="bfloat16")
    ev = BenchmarkEval(target, v5_cfg.target_layer_ids, n=args.eval_n, anchors=24,
                       precision="bfloat16")
    rows = {"v5 (Domino chain; tau_base: its DFlash backbone)": ev(v5_cfg, v5_params),
            f"DSpark heads r={args.rank} on v5's backbone (dspark chain)": ev(tr.dcfg,
                                                                              tr.params)}
    out = {"command": "python -m experiments.dspark_heads.train_heads --evaluate",
           "machine": f"{cpu_model()} ({bf16_units()}), {platform.node()}",
           "date": time.strftime("%Y-%m-%d", time.gmtime()), "steps": int(tr.step),
           "rank": args.rank, "teacher_forced_chain_tau": rows}
    with open(os.path.join(HERE, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))
    tr.close()


def main(argv=None):
    args = parse_args(argv)
    evaluate(args) if args.evaluate else train(args)


if __name__ == "__main__":
    main()
