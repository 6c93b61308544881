"""Short recipe ablations: several fresh drafters trained side by side on the same data, seed and
batches, each with one recipe option changed, then evaluated on the same held-out blocks.

    python -m experiments.drafter_lab ablate --data DIR --shards 6 --steps 80 \
        --arms random,target,target+until_fail,target+all_anchors --json OUT.json

An arm is ``+``-joined recipe options: ``random`` / ``target`` (layer init), ``until_fail``,
``all_anchors`` (``anchor_mode="all"``, capped at 32 anchors per sequence), ``hold`` (λ = 1 for the
first 25 % of the steps, then down to 0.2 over the next 50 %), ``soft`` (full-distribution soft
targets at 0.5), ``soft_topk`` (KL to the stored top-k target logits at 0.5: data collected with
``--store-topk`` or made by ``backfill-topk``), ``bf16`` (the training forward and its gradient
products in bf16, ``--precision bfloat16``). The target, data, features, held-out split
and evaluation are shared; only the options differ. Prints and writes the held-out teacher-forced
chain τ (base and corrected) and per-depth accuracies of each arm.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

OPTIONS = {
    "random": {"layer_init": "random"},
    "target": {"layer_init": "target"},
    "until_fail": {"until_fail": True},
    "all_anchors": {"anchor_mode": "all", "anchors": 32},
    "hold": {"lam_hold": 0.25, "lam_ramp": 0.5, "lam_end": 0.2},
    "soft": {"soft": 0.5},
    "soft_topk": {"soft_topk": 0.5},
    "bf16": {"precision": "bfloat16"},
}


def arm_options(arm: str) -> dict:
    out: dict = {}
    for part in arm.split("+"):
        if part not in OPTIONS:
            raise ValueError(f"unknown ablation option {part!r}; choose from {sorted(OPTIONS)}")
        out.update(OPTIONS[part])
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m experiments.drafter_lab ablate",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="data directory (manifest + shards)")
    p.add_argument("--features", default="runs/features")
    p.add_argument("--shards", type=int, default=6)
    p.add_argument("--shard-from", type=int, default=0,
                   help="train and evaluate on answer shards --shard-from .. --shards - 1")
    p.add_argument("--arms", default="random,target")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--anchors", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--train-vocab", type=int, default=8192,
                   help="0: the full-vocabulary loss (as the long runs train)")
    p.add_argument("--eval-seqs", type=int, default=16)
    p.add_argument("--eval-anchors", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)

    import numpy as np

    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path
    from dominotree_jax.train.dataset import active_vocab
    from dominotree_jax.train.features import FeatureCache, cache_root
    from dominotree_jax.train.run import RunSettings
    from dominotree_jax.train.trainer import TrainConfig, Trainer, evaluate

    target = dj.load_target(smollm2_gguf_path())
    run = RunSettings(data=args.data, shards=args.shards, shard_from=args.shard_from,
                      seq_len=args.seq_len, layers=args.layers,
                      intermediate=target.config.intermediate_size)
    dcfg = run.drafter_config(target.config)
    feats = FeatureCache(cache_root(args.features, args.data), target.config, target.params,
                         dcfg.target_layer_ids, log=print)
    t0 = time.time()
    ds = run.dataset(target, feats)
    train_ids, held_ids = ds.split(5)
    held_ids = held_ids[:args.eval_seqs // 2 * 2]
    vocab = (active_vocab(ds, target.config.vocab_size, first=args.train_vocab)
             if args.train_vocab else None)           # 0: the full-vocabulary loss
    print(f"{len(ds)} sequences ({len(train_ids)} train, {len(held_ids)} held out), features "
          f"ready in {time.time() - t0:.0f}s", flush=True)
    results = {"args": vars(args), "arms": {}}
    for arm in args.arms.split(","):
        opts = arm_options(arm)
        tc = TrainConfig(**{"steps": args.steps, "batch": args.batch, "anchors": args.anchors,
                            "lr": args.lr, "warmup": max(1, args.steps // 10),
                            "seed": args.seed, "ckpt_every_s": 1e9, **opts})
        t0 = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            tr = Trainer(dcfg, target.config, target.params, ds, train_ids, tc,
                         os.path.join(tmp, "ckpt"), log_dir=tmp, progress=False,
                         vocab_ids=vocab)
            hist = tr.fit()
            m = evaluate(dcfg, tr.params, target.config, target.params, ds, held_ids,
                         anchors=args.eval_anchors, batch=2, seed=args.seed + 17,
                         answer_frac=1.0)
            tr.close()
        m = {k: (np.round(v, 4).tolist() if isinstance(v, list) else v) for k, v in m.items()}
        m.update(options=opts, train_seconds=round(time.time() - t0, 1),
                 labels=float(sum(h["labels"] for h in hist)),
                 final_train_loss=round(float(np.mean([h["loss"] for h in hist[-10:]])), 4))
        results["arms"][arm] = m
        print(f"{arm}: tau_corr {m['tau_corr']:.3f} tau_base {m['tau_base']:.3f} "
              f"corr_acc_d {m['corr_acc_d']} base_acc_d {m['base_acc_d']} "
              f"({m['train_seconds']}s, {m['labels']:.0f} labels)", flush=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0
