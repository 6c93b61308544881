"""A training run of ``python -m dominotree_jax.train`` as library code: its settings
(``RunSettings``, fixed by the run's first call in ``<out>/run.json``), the data, the drafter,
the ``Trainer``, and the features / train / export stages. ``train/__main__.py`` only calls
``main``, which parses the command line into a ``RunSettings`` and this call's options (the
run directory, the deadline, the held-out curve, the export).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

from dominotree_jax.train.trainer import RENAMED_SETTINGS, TrainConfig, writes_logs

USAGE = """Train a Domino drafter for the default target from the data kept in the repository.

    python -m dominotree_jax.train --stage train --data data/smollm2 --out runs/d1 --steps 2000
    python -m dominotree_jax.train --stage export --out runs/d1 --export-dir DIR

The data directory is grown by ``python -m dominotree_jax.train.data`` (prompts → the target's
answers, as token-id shards + ``manifest.json``; resumable). Stages: ``features`` computes the
target's teacher-forced features of the shards once (``--features``, shared by runs); ``train``
does too if needed, then trains, resuming from ``<out>/ckpt`` when there is a checkpoint;
``export`` writes the released-format drafter and evaluates it on the held-out prompts. ``all``
= train + export. Settings of a run are fixed by its first call (``<out>/run.json``, including
how many shards it trains on), so a resumed run is exact even when the data directory has grown
since.
"""

STAGES = ("features", "train", "export", "all")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSettings:
    """A drafter training run's settings: its data, the drafter's shape and the trainer's
    (``train``). Built from the command line (``from_args``) or in code, fixed by a run's first
    call (``resolve``: ``<out>/run.json``) and read back by ``from_json``, which also reads the
    run.json files of older versions: flat, taps as ``"1,15,27"``, ``"dtype"`` for the precision,
    settings added since missing (they take the defaults below, the recipe of that time)."""

    train: TrainConfig = TrainConfig(steps=2000)
    # data
    data: str = "data/smollm2"             # manifest + shards
    shards: int | None = None              # train on answer shards before this one (None: all)
    shard_from: int = 0                    # ... from this one on
    trim_loops: int = 0                    # answers end at a W-token loop (train/data/loops.py)
    seq_len: int = 320
    heldout_pct: int = 5                   # held-out prompts (by hash), %
    feature_precision: str = "float32"     # weights of the target's features forward
    # drafter
    layers: int = 1
    intermediate: int = 1536
    taps: tuple[int, ...] = (1, 15, 27)
    block_size: int = 8
    gru: int = 256
    emb: int = 128
    mask_token_id: int = 16                # <empty_output>: a special token chat never holds
    draft_vocab: int = 0                   # D > 0: a new drafter over the D most frequent tokens
    train_vocab: int = 0                   # N > 0: the loss over the data's tokens + the first N
    warm_start: str | None = None          # a released-format drafter to start from, 'shipped'
    grow_layers: int | None = None         # with warm_start: grow it to this many layers
    markov_rank: int = 0                   # r > 0: a DSpark drafter (Markov + confidence heads;
    #                                        with warm_start: the heads replace its Domino head)

    def __post_init__(self):
        from dominotree_jax.precision import precision_name
        taps = self.taps.split(",") if isinstance(self.taps, str) else self.taps
        object.__setattr__(self, "taps", tuple(int(t) for t in taps))
        object.__setattr__(self, "feature_precision",
                           precision_name(self.feature_precision, "feature precision"))
        if self.train.layer_init == "target" and self.warm_start:
            raise ValueError("--layer-init target starts a new drafter; drop --warm-start")
        if self.grow_layers and not self.warm_start:
            raise ValueError("--grow-layers needs --warm-start (a new drafter takes --layers)")
        if self.markov_rank < 0:
            raise ValueError(f"--markov-rank must be >= 0, got {self.markov_rank}")
        if self.draft_vocab and (self.warm_start or self.train_vocab):
            raise ValueError("--draft-vocab starts a new drafter over its own columns: drop "
                             "--warm-start and --train-vocab")

    # ------------------------------------------------------------------ reading and writing

    @classmethod
    def from_args(cls, args) -> "RunSettings":
        """The settings a parsed command line (``parse_args``) asks for: its options named as
        the fields of this class and of ``TrainConfig`` (``--ckpt-minutes``: ``ckpt_every_s``)."""
        given = vars(args)
        train = {f.name: given[f.name] for f in dataclasses.fields(TrainConfig)
                 if f.name in given}
        if "ckpt_minutes" in given:
            train["ckpt_every_s"] = given["ckpt_minutes"] * 60
        return cls(train=TrainConfig(**train),
                   **{f.name: given[f.name] for f in dataclasses.fields(cls)
                      if f.name != "train" and f.name in given})

    def to_json(self) -> dict:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                "train": self.train.to_json()}

    @classmethod
    def from_json(cls, d: dict):
        """``to_json``'s inverse; also reads the flat run.json of older versions (the trainer's
        settings beside the others) and settings saved under an older name."""
        d = dict(d)
        if "train" in d:
            train = d.pop("train")
        else:
            names = {f.name for f in dataclasses.fields(TrainConfig)} | set(RENAMED_SETTINGS)
            train = {k: d.pop(k) for k in list(d) if k in names}
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown run settings {sorted(unknown)}")
        return cls(train=TrainConfig.from_json(train), **d)

    def resolve(self, out: str) -> "RunSettings":
        """The run's settings: those of its first call, written to ``<out>/run.json`` then
        (with ``shards`` fixed to the answer shards there are), read back by every later call;
        only the checkpoint interval is this call's."""
        path = os.path.join(out, "run.json")
        if os.path.exists(path):
            with open(path) as f:
                saved = type(self).from_json(json.load(f))
            return dataclasses.replace(saved, train=dataclasses.replace(
                saved.train, ckpt_every_s=self.train.ckpt_every_s))
        settings = self
        if settings.shards is None:
            from dominotree_jax.train.data.shards import ShardStore
            settings = dataclasses.replace(
                settings, shards=len(ShardStore(settings.data).entries("answers")))
        os.makedirs(out, exist_ok=True)
        if writes_logs():   # (the other processes of a run resolve the same settings)
            _write_atomically(path, json.dumps(settings.to_json(), indent=1).encode())
        return settings

    # ------------------------------------------------------------------ what they build

    def drafter_config(self, target_cfg):
        """A new drafter's ``DrafterConfig`` for ``target_cfg`` (the shape settings)."""
        from dominotree_jax.config import DrafterConfig
        return DrafterConfig.for_target(
            target_cfg, layers=self.layers, intermediate=self.intermediate, taps=self.taps,
            block_size=self.block_size, mask_token_id=self.mask_token_id, gru=self.gru,
            emb=self.emb, draft_vocab_size=self.draft_vocab or None,
            markov_rank=self.markov_rank)

    def initial_drafter(self, target_cfg):
        """``(DrafterConfig, {name: float32 array})`` of the warm-start drafter (grown to
        ``grow_layers``), or ``(drafter_config(target_cfg), None)``."""
        if not self.warm_start:
            return self.drafter_config(target_cfg), None
        from convert.drafter import load_drafter
        from dominotree_jax.model.state import state_to_flat
        cfg, params = load_drafter(drafter_path(self.warm_start), dtype="float32",
                                   target_cfg=target_cfg)
        flat = state_to_flat(params)
        if self.grow_layers:
            from dominotree_jax.train.grow import grow_layers
            cfg, flat = grow_layers(cfg, flat, self.grow_layers)
        if self.markov_rank and cfg.markov_rank != self.markov_rank:
            from dominotree_jax.train.grow import with_dspark_heads
            cfg, flat = with_dspark_heads(cfg, flat, self.markov_rank, self.train.seed)
        return cfg, flat

    def dataset(self, target, features):
        """The run's ``SequenceDataset`` over ``features`` (a ``FeatureCache`` or
        ``OnTheFlyFeatures`` of the drafter's taps)."""
        from dominotree_jax.train.data.shards import ShardStore
        from dominotree_jax.train.dataset import SequenceDataset
        store = ShardStore(self.data, vocab_size=target.config.vocab_size)
        return SequenceDataset(store, features, self.seq_len, max_shards=self.shards,
                               first_shard=self.shard_from, trim_loops=self.trim_loops)


def drafter_path(spec: str) -> str:
    """A released-format drafter directory; ``"shipped"``: the packaged one."""
    if spec == "shipped":
        from dominotree_jax.assets import smollm2_drafter_path
        return smollm2_drafter_path()
    return spec


def load_target(path: str | None = None):
    """The target: the checkpoint at ``path``, by default the SmolLM2 GGUF."""
    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path
    return dj.load_target(path or smollm2_gguf_path())


def log(out, msg):
    """``msg`` printed and appended to ``<out>/log.txt``, by process 0 only (one log per run)."""
    if not writes_logs():
        return
    line = f"[{time.strftime('%H:%M:%S', time.gmtime())}] {msg}"
    print(line, flush=True)
    with open(os.path.join(out, "log.txt"), "a") as f:
        f.write(line + "\n")


def _write_atomically(path: str, data: bytes) -> None:
    """``data`` written beside ``path``, then renamed to it: another process never reads half."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _fixed_vocab(path: str, make):
    """The id array of ``path``, made by ``make()`` and saved (by process 0) at the run's first
    call, so a resumed run stays exact."""
    import io

    import numpy as np
    if os.path.exists(path):
        return np.load(path)
    ids = np.asarray(make())
    if writes_logs():
        npy = io.BytesIO()
        np.save(npy, ids)
        _write_atomically(path, npy.getvalue())
    return ids


def cached_dataset(settings: RunSettings, target, dcfg, out: str,
                   features: str = "runs/features"):
    """The run's dataset with the target's features cached under ``features`` (shared by
    runs), computed where missing."""
    from dominotree_jax.train.features import FeatureCache, cache_root
    feats = FeatureCache(cache_root(features, settings.data), target.config, target.params,
                         dcfg.target_layer_ids, log=lambda m: log(out, m),
                         precision=settings.feature_precision)
    return settings.dataset(target, feats)


def make_trainer(settings: RunSettings, target, *, out: str, features: str = "runs/features",
                 model_axis: int = 1):
    """``(Trainer, held-out sequence ids)`` of the run in ``out`` at its newest checkpoint,
    with the settings its first call fixed (``RunSettings.resolve``)."""
    from dominotree_jax.train.dataset import active_vocab
    from dominotree_jax.train.trainer import Trainer
    s = settings.resolve(out)
    dcfg, init_flat = s.initial_drafter(target.config)
    ds = cached_dataset(s, target, dcfg, out, features)
    vocab = None
    if s.draft_vocab:
        from dominotree_jax.train.draft_vocab import frequent_answer_tokens
        vocab = _fixed_vocab(os.path.join(out, "d2t.npy"), lambda: frequent_answer_tokens(
            ds, ds.split(s.heldout_pct)[0], s.draft_vocab, target.config.vocab_size))
    elif s.train_vocab:
        vocab = _fixed_vocab(os.path.join(out, "train_vocab.npy"), lambda: active_vocab(
            ds, target.config.vocab_size, first=s.train_vocab))
    train_ids, held_ids = ds.split(s.heldout_pct)
    p_tr, a_tr = ds.num_tokens(train_ids)
    log(out, f"{len(ds)} sequences from shards {s.shard_from}..{s.shards - 1}: "
        f"{len(train_ids)} train "
        f"({p_tr} prompt + {a_tr} answer tokens), {len(held_ids)} held out")
    tr = Trainer(dcfg, target.config, target.params, ds, train_ids, s.train,
                 os.path.join(out, "ckpt"), log_dir=out, vocab_ids=vocab,
                 init_flat=init_flat, mesh=training_mesh(model_axis))
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
    from dominotree_jax.train.data.collect import deadline_from
    return deadline_from(None, spec)


def _trainer(settings: RunSettings, target, args):
    return make_trainer(settings, target, out=args.out, features=args.features,
                        model_axis=args.model_axis)


def stage_train(settings: RunSettings, target, args):
    """Train to ``settings.train.steps`` (or ``args.deadline``), with the held-out curve every
    ``args.eval_every`` steps and ``args.keep_best``."""
    from dominotree_jax.train.trainer import evaluate
    trainer, held_ids = _trainer(settings, target, args)
    curve_ids = held_ids[:args.curve_seqs // 2 * 2]
    seed = trainer.tc.seed + 17

    def curve_metrics(dcfg, params):
        return evaluate(dcfg, params, target.config, target.params, trainer.ds, curve_ids,
                        anchors=16, batch=2, seed=seed, answer_frac=1.0)

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
        cfg, params = load_drafter(drafter_path(args.keep_best), dtype="float32",
                                   target_cfg=trainer.tcfg)
        for what in ("num_draft_positions", "target_layer_ids"):   # same blocks, same features
            if getattr(cfg, what) != getattr(trainer.dcfg, what):
                raise SystemExit(f"--keep-best {args.keep_best}: {what} {getattr(cfg, what)}, "
                                 f"the run's drafter has {getattr(trainer.dcfg, what)}")
        ref_tau = float(curve_metrics(cfg, params)[METRIC])
        log(args.out, f"reference {args.keep_best}: held-out tau {ref_tau:.3f}")
    return BestDrafter(args.out, trainer.dcfg, ref_tau, reference=args.keep_best)


def stage_export(settings: RunSettings, target, args):
    """Write the released-format drafter (bf16) and its held-out metrics."""
    from convert.drafter import load_drafter, save_drafter
    from dominotree_jax.train.trainer import evaluate
    trainer, held_ids = _trainer(settings, target, args)
    out_dir = args.export_dir or os.path.join(args.out, "drafter")
    save_drafter(out_dir, trainer.dcfg, trainer.params, dtype="bfloat16")
    cfg, params = load_drafter(out_dir, target_cfg=target.config)
    log(args.out, f"exported step {trainer.step} to {out_dir}")
    metrics = evaluate(cfg, params, target.config, target.params, trainer.ds,
                       held_ids[:args.eval_seqs], anchors=args.eval_anchors,
                       seed=trainer.tc.seed + 17)
    metrics["step"] = trainer.step
    with open(os.path.join(args.out, "heldout_metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    log(args.out, f"held-out metrics (bf16 export): {json.dumps(metrics)}")
    trainer.close()


def parse_args(argv=None):
    """The command line: ``RunSettings``' fields and ``TrainConfig``'s under their own names
    (defaults: ``RunSettings()``'s), and this call's options."""
    from dominotree_jax.precision import add_precision_argument
    d = RunSettings()
    t = d.train
    p = argparse.ArgumentParser(prog="python -m dominotree_jax.train", description=USAGE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_precision_argument(p, default=str(t.precision), pairs=False,
                           help="precision of the training forward (float32 master weights; "
                                "TrainConfig.precision)")
    p.add_argument("--stage", choices=STAGES, default="all",
                   help="(data is collected by python -m dominotree_jax.train.data)")
    p.add_argument("--seed", type=int, default=t.seed)
    p.add_argument("--data", default=d.data, help="data directory (manifest + shards)")
    p.add_argument("--out", default="runs/smollm2-domino", help="training run directory")
    p.add_argument("--features", default="runs/features",
                   help="cache of the target's teacher-forced features (shared by runs)")
    add_precision_argument(p, "--feature-precision", default=d.feature_precision, aliases=(),
                           pairs=False,
                           help="weights of the target's features forward (bfloat16: 1.5x "
                                "faster on a CPU with bf16 dot units; its own cache files; "
                                "docs/training.md)")
    p.add_argument("--target", default=None, help="target checkpoint (default: SmolLM2 GGUF)")
    # drafter
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--intermediate", type=int, default=d.intermediate)
    p.add_argument("--taps", default=",".join(map(str, d.taps)))
    p.add_argument("--block-size", type=int, default=d.block_size)
    p.add_argument("--gru", type=int, default=d.gru)
    p.add_argument("--emb", type=int, default=d.emb)
    p.add_argument("--mask-token-id", type=int, default=d.mask_token_id, help="16 = "
                   "<empty_output> in SmolLM2's vocabulary, a special token chat text never "
                   "contains")
    p.add_argument("--warm-start", default=d.warm_start, help="released-format drafter "
                   "directory to start from ('shipped' = the packaged one); its config "
                   "replaces the drafter flags above")
    p.add_argument("--markov-rank", type=int, default=d.markov_rank, metavar="R",
                   help="a DSpark drafter: a rank-R Markov head and a confidence head (with "
                   "--warm-start they replace its Domino head; docs/training.md)")
    p.add_argument("--dspark-ce", type=float, default=t.dspark_ce,
                   help="DSpark loss: weight of the labels' cross-entropy")
    p.add_argument("--dspark-l1", type=float, default=t.dspark_l1,
                   help="DSpark loss: weight of the L1 distance to the target's distribution")
    p.add_argument("--dspark-confidence", type=float, default=t.dspark_confidence,
                   help="DSpark loss: weight of the confidence head's cross-entropy")
    p.add_argument("--selector-loss", type=float, default=t.selector_loss,
                   help="a DFlash2 drafter: weight of its path selector's cross-entropy")
    p.add_argument("--backbone-lr", type=float, default=t.backbone_lr,
                   help="the backbone's learning rate as a fraction of --lr (0: frozen; the "
                   "heads train at --lr)")
    p.add_argument("--grow-layers", type=int, default=d.grow_layers,
                   help="with --warm-start: grow the drafter to this many layers (added layers "
                   "copy the last one with zeroed output projections: same outputs at step 0)")
    # training
    p.add_argument("--shards", type=int, default=d.shards,
                   help="train on the first N answer shards (default: all there are now)")
    p.add_argument("--shard-from", type=int, default=d.shard_from,
                   help="skip the first N answer shards (e.g. the data a warm start saw)")
    p.add_argument("--trim-loops", type=int, default=d.trim_loops, metavar="W",
                   help="end each answer at its repetition loop (a W-token window seen 3 "
                   "times; train/data/loops.py), for training and the held-out curve (0: keep)")
    p.add_argument("--steps", type=int, default=t.steps)
    p.add_argument("--batch", type=int, default=t.batch, help="sequences per step (global: "
                   "split over the devices of the mesh's data axis)")
    p.add_argument("--model-axis", type=int, default=1, metavar="M",
                   help="devices on the mesh's model axis (the drafter and the frozen target "
                   "split over them); the other devices share the batch (docs/training.md)")
    p.add_argument("--anchors", type=int, default=t.anchors,
                   help="anchors (blocks) per sequence")
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--lr", type=float, default=t.lr)
    p.add_argument("--warmup", type=int, default=t.warmup)
    p.add_argument("--gamma", type=float, default=t.gamma)
    p.add_argument("--soft", type=float, default=t.soft,
                   help="weight of soft targets (the target's distribution) vs hard labels")
    p.add_argument("--no-curriculum", dest="curriculum", action="store_false",
                   help="λ = 0 from the start (warm starts)")
    # recipe options (docs/training.md)
    p.add_argument("--lam-hold", type=float, default=t.lam_hold,
                   help="curriculum: fraction of the steps at λ = 1 (base logits only)")
    p.add_argument("--lam-ramp", type=float, default=t.lam_ramp,
                   help="curriculum: then λ falls linearly over this fraction of the steps")
    p.add_argument("--lam-end", type=float, default=t.lam_end,
                   help="curriculum: final λ (> 0 keeps training the base head)")
    p.add_argument("--layer-init", choices=("random", "target"), default=t.layer_init,
                   help="'target': a new drafter's layers start as the target's last layers")
    p.add_argument("--anchor-mode", choices=("sample", "all"), default=t.anchor_mode,
                   help="'all': every valid position is an anchor, --anchors is the cap per "
                   "sequence (answer positions first)")
    p.add_argument("--until-fail", action="store_true",
                   help="accept-until-fail weighting: per block and head, no loss after the "
                   "head's first wrong depth")
    p.add_argument("--until-fail-floor", type=float, default=t.until_fail_floor,
                   help="weight kept by the depths after the first wrong one")
    p.add_argument("--tv", type=float, default=t.tv,
                   help="weight of the L1 distance to the target's distribution (DSpark's "
                   "loss on any drafter: 0.9 = its 0.1 CE + 0.9 L1)")
    p.add_argument("--soft-topk", type=float, default=t.soft_topk,
                   help="weight of KL to the stored top-k target logits (data collected "
                   "with --store-topk)")
    p.add_argument("--train-vocab", type=int, default=d.train_vocab,
                   help="0 = full-vocabulary softmax; N = only every token of the data plus "
                   "the first N ids (cheaper on a CPU; evaluation is always full-vocabulary)")
    p.add_argument("--draft-vocab", type=int, default=d.draft_vocab, metavar="D",
                   help="a new drafter over a draft vocabulary: the D most frequent answer "
                   "tokens of the training split (its d2t map; 0: the full vocabulary)")
    p.add_argument("--heldout-pct", type=int, default=d.heldout_pct,
                   help="held-out prompts (by hash), %%")
    p.add_argument("--ckpt-minutes", type=float, default=t.ckpt_every_s / 60)
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
    many = p.add_argument_group("many processes (jax.distributed; docs/training.md)")
    many.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                      help="join a multi-process run whose process 0 listens at HOST:PORT "
                      "(every process gives the same); 'auto': jax.distributed finds it "
                      "(Cloud TPU, SLURM, ...)")
    many.add_argument("--num-processes", type=int, default=None, metavar="N")
    many.add_argument("--process-id", type=int, default=None, metavar="I",
                      help="this process's index, 0 .. N-1 (process 0 writes the logs)")
    return p.parse_args(argv)


def join_processes(coordinator: str | None, num_processes: int | None,
                   process_id: int | None) -> None:
    """``jax.distributed.initialize`` for ``--coordinator`` (nothing without it): every
    process then sees the devices of all, the mesh spans them, each process reads its own rows
    of every batch. CPU processes run their collectives over gloo."""
    if coordinator is None:
        if num_processes is not None or process_id is not None:
            raise SystemExit("--num-processes and --process-id join a run: give --coordinator "
                             "HOST:PORT too")
        return
    import jax
    if coordinator == "auto":
        jax.distributed.initialize()
        return
    if num_processes is None or process_id is None or not 0 <= process_id < num_processes:
        raise SystemExit(f"--coordinator needs --num-processes N and --process-id I with "
                         f"0 <= I < N, got N={num_processes}, I={process_id}")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id)


def main(argv=None):
    args = parse_args(argv)
    try:
        settings = RunSettings.from_args(args)
    except ValueError as e:
        raise SystemExit(f"python -m dominotree_jax.train: {e}") from None
    join_processes(args.coordinator, args.num_processes, args.process_id)
    import jax
    if jax.process_count() > 1 and (args.stage in ("export", "all") or args.keep_best):
        raise SystemExit("exports (--stage export / all, --keep-best) write one directory: run "
                         "them in one process, after a multi-process --stage train")
    target = load_target(args.target)
    os.makedirs(args.out, exist_ok=True)
    if args.stage == "features":
        s = settings.resolve(args.out)
        ds = cached_dataset(s, target, s.initial_drafter(target.config)[0], args.out,
                            args.features)
        log(args.out, f"features ready: {len(ds)} sequences, {ds.num_tokens()} tokens")
        return 0
    if args.stage in ("train", "all"):
        stage_train(settings, target, args)
    if args.stage in ("export", "all"):
        stage_export(settings, target, args)
    return 0
