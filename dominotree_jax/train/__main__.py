"""Train a Domino drafter for the default target, end to end and reproducibly.

    python -m dominotree_jax.train --seed 0 --out runs/smollm2-domino [--stage data|train|export|all]

Stages: ``data`` (prompts → the target's greedy answers + tapped features, as .npy shards under
``<out>/data``), ``train`` (resumes from ``<out>/ckpt`` when there is a checkpoint),
``export`` (released-format drafter directory ``<out>/drafter``, or ``--export-dir``; also
evaluates on the held-out split). Every stage can be re-run: it continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m dominotree_jax.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/smollm2-domino")
    p.add_argument("--stage", choices=("data", "train", "export", "all"), default="all")
    p.add_argument("--target", default=None, help="target checkpoint (default: SmolLM2 GGUF)")
    # data
    p.add_argument("--num-prompts", type=int, default=4000)
    p.add_argument("--max-new", type=int, default=160)
    p.add_argument("--gen-batch", type=int, default=48)
    p.add_argument("--gen-minutes", type=float, default=33.0,
                   help="stop starting new generation batches after this many minutes")
    p.add_argument("--gen-batches", type=int, default=None,
                   help="generate at most this many batches (the shipped run: 17)")
    # drafter
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--taps", default="1,15,27")
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--gru", type=int, default=256)
    p.add_argument("--emb", type=int, default=128)
    p.add_argument("--mask-token-id", type=int, default=16, help="16 = <empty_output> in "
                   "SmolLM2's vocabulary, a special token chat text never contains")
    # training
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--anchors", type=int, default=12, help="anchors (blocks) per sequence")
    p.add_argument("--seq-len", type=int, default=320)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--gamma", type=float, default=7.0)
    p.add_argument("--ckpt-minutes", type=float, default=4.0)
    p.add_argument("--heldout-frac", type=float, default=0.05)
    p.add_argument("--train-vocab", type=int, default=8192,
                   help="restrict the training softmax to every token of the data plus the "
                   "first N ids (0 = full vocabulary); evaluation uses the full vocabulary")
    p.add_argument("--deadline", default=None,
                   help="UTC time HH:MM: stop training (and checkpoint) at that time")
    p.add_argument("--export-dir", default=None)
    p.add_argument("--eval-seqs", type=int, default=64, help="held-out sequences to evaluate")
    p.add_argument("--eval-anchors", type=int, default=32, help="blocks per held-out sequence")
    return p.parse_args(argv)


def _load_target(args):
    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path
    return dj.load_target(args.target or smollm2_gguf_path())


def _log(out, msg):
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    with open(os.path.join(out, "log.txt"), "a") as f:
        f.write(line + "\n")


def stage_data(args, target=None):
    from dominotree_jax.train import data as D
    target = target or _load_target(args)
    prompts = D.build_prompts(args.num_prompts, args.seed)
    ids = D.tokenize_prompts(target.tokenizer, prompts)
    with open(os.path.join(args.out, "prompts.jsonl"), "w") as f:
        for p in prompts:
            f.write(json.dumps(p) + "\n")
    taps = tuple(int(t) for t in args.taps.split(","))
    stats = D.generate_shards(target, ids, os.path.join(args.out, "data"), taps=taps,
                              max_new=args.max_new, batch=args.gen_batch,
                              time_budget_s=args.gen_minutes * 60,
                              max_batches=args.gen_batches,
                              log=lambda m: _log(args.out, m))
    path = os.path.join(args.out, "data_stats.json")
    old = json.load(open(path)) if os.path.exists(path) else {"batches": 0, "gen_tokens": 0,
                                                               "seconds": 0.0}
    for k in stats:
        old[k] = old.get(k, 0) + stats[k]
    json.dump(old, open(path, "w"), indent=1)
    _log(args.out, f"data stage: {old}")
    return target


def drafter_config(args, target_cfg):
    from dominotree_jax.config import DrafterConfig
    return DrafterConfig(
        vocab_size=target_cfg.vocab_size, hidden_size=target_cfg.hidden_size,
        intermediate_size=args.intermediate, num_hidden_layers=args.layers,
        num_attention_heads=target_cfg.num_attention_heads,
        num_key_value_heads=target_cfg.num_key_value_heads, head_dim=target_cfg.head_dim,
        block_size=args.block_size, mask_token_id=args.mask_token_id,
        num_target_layers=target_cfg.num_hidden_layers,
        target_layer_ids=tuple(int(t) for t in args.taps.split(",")),
        rms_norm_eps=target_cfg.rms_norm_eps, rope_theta=target_cfg.rope_theta,
        max_position_embeddings=target_cfg.max_position_embeddings, shift_label=True,
        projector_type="domino", gru_hidden_dim=args.gru, emb_dim=args.emb,
        pure_draft_prefix_len=1)


def _trainer(args, target):
    import numpy as np

    from dominotree_jax.train.data import ShardDataset, active_vocab, split_indices
    from dominotree_jax.train.trainer import TrainConfig, Trainer
    ds = ShardDataset(os.path.join(args.out, "data"), args.seq_len)
    vocab = None
    if args.train_vocab:
        path = os.path.join(args.out, "train_vocab.npy")
        if not os.path.exists(path):  # fixed at the first training run: resume stays exact
            np.save(path, active_vocab(ds, target.config.vocab_size, first=args.train_vocab))
        vocab = np.load(path)
    train_ids, held_ids = split_indices(len(ds), args.heldout_frac, args.seed)
    tc = TrainConfig(steps=args.steps, batch=args.batch, anchors=args.anchors, lr=args.lr,
                     warmup=args.warmup, gamma=args.gamma, seed=args.seed,
                     ckpt_every_s=args.ckpt_minutes * 60)
    dcfg = drafter_config(args, target.config)
    return Trainer(dcfg, target.config, target.params, ds, train_ids, tc,
                   os.path.join(args.out, "ckpt"), log_dir=args.out, vocab_ids=vocab), held_ids


def _deadline_ts(spec):
    if not spec:
        return None
    import datetime
    now = datetime.datetime.now(datetime.timezone.utc)
    h, m = (int(x) for x in spec.split(":"))
    t = now.replace(hour=h, minute=m, second=0, microsecond=0)
    return t.timestamp()


def stage_train(args, target=None):
    target = target or _load_target(args)
    trainer, _ = _trainer(args, target)
    trainer.fit(deadline=_deadline_ts(args.deadline))
    return target


def stage_export(args, target=None):
    from convert.drafter import load_drafter, save_drafter
    from dominotree_jax.train.trainer import evaluate
    target = target or _load_target(args)
    trainer, held_ids = _trainer(args, target)
    out_dir = args.export_dir or os.path.join(args.out, "drafter")
    save_drafter(out_dir, trainer.dcfg, trainer.params, dtype="bfloat16")
    cfg, params = load_drafter(out_dir, target_cfg=target.config)
    _log(args.out, f"exported step {trainer.step} to {out_dir}")
    metrics = evaluate(cfg, params, target.config, target.params, trainer.ds,
                       held_ids[:args.eval_seqs], anchors=args.eval_anchors,
                       seed=args.seed + 17)
    metrics["step"] = trainer.step
    with open(os.path.join(args.out, "heldout_metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    _log(args.out, f"held-out metrics (bf16 export): {json.dumps(metrics)}")
    return target


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "args.json"), "w") as f:
        json.dump(vars(args), f, indent=1)
    target = None
    if args.stage in ("data", "all"):
        target = stage_data(args, target)
    if args.stage in ("train", "all"):
        target = stage_train(args, target)
    if args.stage in ("export", "all"):
        stage_export(args, target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
