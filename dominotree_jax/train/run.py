"""A training run of ``python -m dominotree_jax.train`` as library code: its settings (fixed by the
run's first call in ``<out>/run.json``), the data, the drafter, the ``Trainer``, and the train /
export stages. ``train/__main__.py`` only parses the command line and calls these.
"""

from __future__ import annotations

import argparse
import json
import os
import time

USAGE = """Train a Domino drafter for the default target from the data kept in the repository.

    python -m dominotree_jax.train --stage train --data data/smollm2 --out runs/d1 --steps 2000
    python -m dominotree_jax.train --stage export --out runs/d1 --export-dir DIR

The data directory is grown by the one data-collection entry point,
``python -m dominotree_jax.train.collect`` (prompts → the target's answers, as token-id shards +
``manifest.json``; resumable). Stages: ``features`` computes the target's teacher-forced
features of the shards once (``--features``, shared by runs); ``train`` does too if needed,
then trains, resuming from ``<out>/ckpt`` when there is a checkpoint; ``export`` writes the
released-format drafter and evaluates it on the held-out prompts. ``all`` = train + export.
Settings of a run are fixed by its first call (``<out>/run.json``, including how many shards it
trains on), so a resumed run is exact even when the data directory has grown since.
"""

RUN_FIELDS = ("data", "shard_from", "trim_loops", "feature_precision", "shards", "layers",
              "intermediate", "taps", "block_size", "gru", "emb", "mask_token_id", "steps",
              "batch", "anchors", "seq_len", "lr", "warmup", "gamma", "soft", "curriculum",
              "train_vocab", "heldout_pct", "warm_start", "grow_layers",
              "seed", "layer_init", "anchor_mode", "until_fail", "until_fail_floor", "soft_topk",
              "lam_hold", "lam_ramp", "lam_end", "precision", "draft_vocab")
# Settings added after v3: a run.json written before them gets these values (the old recipe).
RUN_DEFAULTS = {"layer_init": "random", "anchor_mode": "sample", "until_fail": False,
                "until_fail_floor": 0.0, "soft_topk": 0.0, "lam_hold": 0.0, "lam_ramp": 0.5,
                "lam_end": 0.0, "precision": "float32"}
# The same for data settings added after v3 (not TrainConfig fields).
DATA_DEFAULTS = {"shard_from": 0, "trim_loops": 0, "feature_precision": "float32",
                 "draft_vocab": 0}


STAGES = ("features", "train", "export", "all")


def load_target(args):
    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path
    return dj.load_target(args.target or smollm2_gguf_path())


def log(out, msg):
    line = f"[{time.strftime('%H:%M:%S', time.gmtime())}] {msg}"
    print(line, flush=True)
    with open(os.path.join(out, "log.txt"), "a") as f:
        f.write(line + "\n")


def _saved_settings(saved: dict) -> dict:
    """A run.json's settings under today's names (``trainer.RENAMED_SETTINGS``: a run.json
    written before a rename holds the old one) and defaults."""
    from dominotree_jax.train.trainer import RENAMED_SETTINGS
    saved = dict(saved)
    for old, new in RENAMED_SETTINGS.items():
        if old in saved:
            saved.setdefault(new, saved.pop(old))
    return {**RUN_DEFAULTS, **DATA_DEFAULTS, **saved}


def _setting(value):
    """A command-line value as run.json holds it (a ``Precision`` as its text)."""
    from dominotree_jax.precision import Precision
    return str(value) if isinstance(value, Precision) else value


def run_settings(args) -> dict:
    """The run's settings: fixed by its first call (``run.json``), later calls reuse them."""
    path = os.path.join(args.out, "run.json")
    if os.path.exists(path):
        with open(path) as f:
            return _saved_settings(json.load(f))
    from dominotree_jax.train.shards import ShardStore
    run = {k: _setting(getattr(args, k)) for k in RUN_FIELDS}
    if run["layer_init"] == "target" and run["warm_start"]:
        raise SystemExit("--layer-init target starts a new drafter; drop --warm-start")
    if run["shards"] is None:
        run["shards"] = len(ShardStore(args.data).entries("answers"))
    with open(path, "w") as f:
        json.dump(run, f, indent=1)
    return run


def drafter_config(run: dict, target_cfg):
    from dominotree_jax.config import DrafterConfig
    return DrafterConfig.for_target(
        target_cfg, layers=run["layers"], intermediate=run["intermediate"],
        taps=tuple(int(t) for t in run["taps"].split(",")), block_size=run["block_size"],
        mask_token_id=run["mask_token_id"], gru=run["gru"], emb=run["emb"],
        draft_vocab_size=run.get("draft_vocab") or None)


def warm_start(run: dict, target_cfg):
    """``(DrafterConfig, {name: float32 array})`` of the warm-start drafter, or ``(config from
    the flags, None)``."""
    if run.get("grow_layers") and not run["warm_start"]:
        raise SystemExit("--grow-layers needs --warm-start (a new drafter takes --layers)")
    if not run["warm_start"]:
        return drafter_config(run, target_cfg), None
    from convert.drafter import load_drafter
    from dominotree_jax.model.state import state_to_flat
    from dominotree_jax.assets import smollm2_drafter_path
    path = smollm2_drafter_path() if run["warm_start"] == "shipped" else run["warm_start"]
    cfg, params = load_drafter(path, dtype="float32", target_cfg=target_cfg)
    flat = state_to_flat(params)
    if run.get("grow_layers"):
        from dominotree_jax.train.grow import grow_layers
        cfg, flat = grow_layers(cfg, flat, run["grow_layers"])
    return cfg, flat


def dataset(args, run, target, dcfg):
    from dominotree_jax.train.dataset import SequenceDataset
    from dominotree_jax.train.features import FeatureCache, cache_root
    from dominotree_jax.train.shards import ShardStore
    store = ShardStore(run["data"], vocab_size=target.config.vocab_size)
    feats = FeatureCache(cache_root(args.features, run["data"]), target.config, target.params,
                         dcfg.target_layer_ids, log=lambda m: log(args.out, m),
                         precision=run["feature_precision"])
    return SequenceDataset(store, feats, run["seq_len"], max_shards=run["shards"],
                           first_shard=run["shard_from"], trim_loops=run["trim_loops"])


def make_trainer(args, target):
    import numpy as np

    from dominotree_jax.train.dataset import active_vocab
    from dominotree_jax.train.trainer import TrainConfig, Trainer
    run = run_settings(args)
    dcfg, init_flat = warm_start(run, target.config)
    ds = dataset(args, run, target, dcfg)
    vocab = None
    if run.get("draft_vocab"):
        if run["warm_start"] or run["train_vocab"]:
            raise SystemExit("--draft-vocab starts a new drafter over its own columns: drop "
                             "--warm-start and --train-vocab")
        path = os.path.join(args.out, "d2t.npy")
        if not os.path.exists(path):  # fixed at the first training run: resume stays exact
            from dominotree_jax.train.draft_vocab import frequent_answer_tokens
            np.save(path, frequent_answer_tokens(ds, ds.split(run["heldout_pct"])[0],
                                                 run["draft_vocab"], target.config.vocab_size))
        vocab = np.load(path)
    elif run["train_vocab"]:
        path = os.path.join(args.out, "train_vocab.npy")
        if not os.path.exists(path):  # fixed at the first training run: resume stays exact
            np.save(path, active_vocab(ds, target.config.vocab_size, first=run["train_vocab"]))
        vocab = np.load(path)
    train_ids, held_ids = ds.split(run["heldout_pct"])
    tc = TrainConfig(steps=run["steps"], batch=run["batch"], anchors=run["anchors"],
                     lr=run["lr"], warmup=run["warmup"], gamma=run["gamma"], soft=run["soft"],
                     curriculum=run["curriculum"], seed=run["seed"],
                     ckpt_every_s=args.ckpt_minutes * 60,
                     **{k: run[k] for k in RUN_DEFAULTS})
    p_tr, a_tr = ds.num_tokens(train_ids)
    log(args.out, f"{len(ds)} sequences from shards {run['shard_from']}..{run['shards'] - 1}: "
         f"{len(train_ids)} train "
         f"({p_tr} prompt + {a_tr} answer tokens), {len(held_ids)} held out")
    tr = Trainer(dcfg, target.config, target.params, ds, train_ids, tc,
                 os.path.join(args.out, "ckpt"), log_dir=args.out, vocab_ids=vocab,
                 init_flat=init_flat, mesh=training_mesh(getattr(args, "model_axis", 1)))
    return tr, held_ids


def training_mesh(model_axis: int):
    """Every visible device (of every process): ``model_axis`` of them on ``"model"`` (the
    drafter and target split by their declared axes), the rest on ``"data"`` (the batch)."""
    import jax

    from dominotree_jax.sharding import make_mesh
    n = jax.device_count()
    if model_axis < 1 or n % model_axis:
        raise SystemExit(f"--model-axis {model_axis} does not divide the {n} devices")
    return make_mesh(n // model_axis, model_axis)


def _deadline_ts(spec):
    if not spec:
        return None
    from dominotree_jax.train.collect import deadline_from
    return deadline_from(None, spec)


def stage_train(args, target):
    from dominotree_jax.train.trainer import evaluate
    trainer, held_ids = make_trainer(args, target)
    curve_ids = held_ids[:args.curve_seqs // 2 * 2]

    def curve_metrics(dcfg, params):
        return evaluate(dcfg, params, target.config, target.params, trainer.ds, curve_ids,
                        anchors=16, batch=2, seed=args.seed + 17, answer_frac=1.0)

    best = keep_best(args, trainer, curve_metrics) if args.keep_best else None

    def heldout(tr):
        params = tr.params
        m = dict(curve_metrics(tr.dcfg, params))
        if best is not None and best.offer(params, m, tr.step):
            log(args.out, f"step {tr.step}: held-out tau {m['tau_corr']:.3f} is the best so "
                 f"far: exported to {best.dir}")
        return m

    trainer.fit(deadline=_deadline_ts(args.deadline),
                eval_fn=heldout if args.eval_every and len(curve_ids) else None,
                eval_every=args.eval_every)
    trainer.close()


def keep_best(args, trainer, curve_metrics):
    """The run's ``BestDrafter``. The reference drafter's held-out τ on the curve's sequences
    is measured once and kept in ``<out>/best.json``."""
    from dominotree_jax.train.best import METRIC, BestDrafter, recorded_reference_tau
    if not args.eval_every:
        raise SystemExit("--keep-best compares held-out evaluations: give --eval-every too")
    ref_tau = recorded_reference_tau(args.out, args.keep_best)
    if ref_tau is None:
        from convert.drafter import load_drafter
        from dominotree_jax.assets import smollm2_drafter_path
        path = smollm2_drafter_path() if args.keep_best == "shipped" else args.keep_best
        cfg, params = load_drafter(path, dtype="float32", target_cfg=trainer.tcfg)
        for what in ("num_draft_positions", "target_layer_ids"):   # same blocks, same features
            if getattr(cfg, what) != getattr(trainer.dcfg, what):
                raise SystemExit(f"--keep-best {args.keep_best}: {what} {getattr(cfg, what)}, "
                                 f"the run's drafter has {getattr(trainer.dcfg, what)}")
        ref_tau = float(curve_metrics(cfg, params)[METRIC])
        log(args.out, f"reference {args.keep_best}: held-out tau {ref_tau:.3f}")
    return BestDrafter(args.out, trainer.dcfg, ref_tau, reference=args.keep_best)


def stage_export(args, target):
    from convert.drafter import load_drafter, save_drafter
    from dominotree_jax.train.trainer import evaluate
    trainer, held_ids = make_trainer(args, target)
    out_dir = args.export_dir or os.path.join(args.out, "drafter")
    save_drafter(out_dir, trainer.dcfg, trainer.params, dtype="bfloat16")
    cfg, params = load_drafter(out_dir, target_cfg=target.config)
    log(args.out, f"exported step {trainer.step} to {out_dir}")
    metrics = evaluate(cfg, params, target.config, target.params, trainer.ds,
                       held_ids[:args.eval_seqs], anchors=args.eval_anchors,
                       seed=args.seed + 17)
    metrics["step"] = trainer.step
    with open(os.path.join(args.out, "heldout_metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    log(args.out, f"held-out metrics (bf16 export): {json.dumps(metrics)}")
    trainer.close()


def parse_args(argv=None):
    from dominotree_jax.precision import add_precision_argument
    p = argparse.ArgumentParser(prog="python -m dominotree_jax.train", description=USAGE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_precision_argument(p, pairs=False, help="precision of the training forward (float32 "
                                                "master weights; TrainConfig.precision)")
    p.add_argument("--stage", choices=STAGES, default="all",
                   help="(data is collected by python -m dominotree_jax.train.collect)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default="data/smollm2", help="data directory (manifest + shards)")
    p.add_argument("--out", default="runs/smollm2-domino", help="training run directory")
    p.add_argument("--features", default="runs/features",
                   help="cache of the target's teacher-forced features (shared by runs)")
    add_precision_argument(p, "--feature-precision", aliases=(), pairs=False,
                           help="weights of the target's features forward (bfloat16: 1.5x "
                                "faster on a CPU with bf16 dot units; its own cache files; "
                                "docs/training.md)")
    p.add_argument("--target", default=None, help="target checkpoint (default: SmolLM2 GGUF)")
    # drafter
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--taps", default="1,15,27")
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--gru", type=int, default=256)
    p.add_argument("--emb", type=int, default=128)
    p.add_argument("--mask-token-id", type=int, default=16, help="16 = <empty_output> in "
                   "SmolLM2's vocabulary, a special token chat text never contains")
    p.add_argument("--warm-start", default=None, help="released-format drafter directory to "
                   "start from ('shipped' = the packaged one); its config replaces the drafter "
                   "flags above")
    p.add_argument("--grow-layers", type=int, default=None,
                   help="with --warm-start: grow the drafter to this many layers (added layers "
                   "copy the last one with zeroed output projections: same outputs at step 0)")
    # training
    p.add_argument("--shards", type=int, default=None,
                   help="train on the first N answer shards (default: all there are now)")
    p.add_argument("--shard-from", type=int, default=0,
                   help="skip the first N answer shards (e.g. the data a warm start saw)")
    p.add_argument("--trim-loops", type=int, default=0, metavar="W",
                   help="end each answer at its repetition loop (a W-token window seen 3 "
                   "times; train/loops.py), for training and the held-out curve (0: keep)")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=8, help="sequences per step (global: split "
                   "over the devices of the mesh's data axis)")
    p.add_argument("--model-axis", type=int, default=1, metavar="M",
                   help="devices on the mesh's model axis (the drafter and the frozen target "
                   "split over them); the other devices share the batch (docs/training.md)")
    p.add_argument("--anchors", type=int, default=12, help="anchors (blocks) per sequence")
    p.add_argument("--seq-len", type=int, default=320)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--gamma", type=float, default=7.0)
    p.add_argument("--soft", type=float, default=0.0,
                   help="weight of soft targets (the target's distribution) vs hard labels")
    p.add_argument("--no-curriculum", dest="curriculum", action="store_false",
                   help="λ = 0 from the start (warm starts)")
    # recipe options (docs/training.md)
    p.add_argument("--lam-hold", type=float, default=0.0,
                   help="curriculum: fraction of the steps at λ = 1 (base logits only)")
    p.add_argument("--lam-ramp", type=float, default=0.5,
                   help="curriculum: then λ falls linearly over this fraction of the steps")
    p.add_argument("--lam-end", type=float, default=0.0,
                   help="curriculum: final λ (> 0 keeps training the base head)")
    p.add_argument("--layer-init", choices=("random", "target"), default="random",
                   help="'target': a new drafter's layers start as the target's last layers")
    p.add_argument("--anchor-mode", choices=("sample", "all"), default="sample",
                   help="'all': every valid position is an anchor, --anchors is the cap per "
                   "sequence (answer positions first)")
    p.add_argument("--until-fail", action="store_true",
                   help="accept-until-fail weighting: per block and head, no loss after the "
                   "head's first wrong depth")
    p.add_argument("--until-fail-floor", type=float, default=0.0,
                   help="weight kept by the depths after the first wrong one")
    p.add_argument("--soft-topk", type=float, default=0.0,
                   help="weight of KL to the stored top-k target logits (data collected "
                   "with --store-topk)")
    p.add_argument("--train-vocab", type=int, default=0,
                   help="0 = full-vocabulary softmax; N = only every token of the data plus "
                   "the first N ids (cheaper on a CPU; evaluation is always full-vocabulary)")
    p.add_argument("--draft-vocab", type=int, default=0, metavar="D",
                   help="a new drafter over a draft vocabulary: the D most frequent answer "
                   "tokens of the training split (its d2t map; 0: the full vocabulary)")
    p.add_argument("--heldout-pct", type=int, default=5, help="held-out prompts (by hash), %%")
    p.add_argument("--ckpt-minutes", type=float, default=4.0)
    p.add_argument("--deadline", default=None, help="UTC HH:MM: stop training (checkpoint)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="held-out learning curve every N steps (<out>/heldout_curve.jsonl)")
    p.add_argument("--curve-seqs", type=int, default=8, help="held-out sequences for the curve")
    p.add_argument("--keep-best", default=None, metavar="DRAFTER",
                   help="with --eval-every: export the drafter to <out>/best whenever its "
                   "held-out τ beats this released-format drafter's ('shipped' = the packaged "
                   "one) and every earlier export (<out>/best.json)")
    p.add_argument("--export-dir", default=None)
    p.add_argument("--eval-seqs", type=int, default=64, help="held-out sequences to evaluate")
    p.add_argument("--eval-anchors", type=int, default=32, help="blocks per held-out sequence")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    target = load_target(args)
    os.makedirs(args.out, exist_ok=True)
    if args.stage == "features":
        run = run_settings(args)
        ds = dataset(args, run, target, warm_start(run, target.config)[0])
        log(args.out, f"features ready: {len(ds)} sequences, {ds.num_tokens()} tokens")
        return 0
    if args.stage in ("train", "all"):
        stage_train(args, target)
    if args.stage in ("export", "all"):
        stage_export(args, target)
    return 0
