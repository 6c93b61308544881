"""GRPO arms through tunix's ``GRPOLearner`` / ``RLCluster`` with a ``DominoTreeRollout``
engine, one after another into one results directory: a CSV row per step, step-level resume.

A task (``grpo_task.ArmTask``) supplies the models, the tokenizer and each arm's engine
settings; the caller supplies the training batches and the reward function (tunix's:
``reward_fn(prompts=..., completions=..., **batch_fields) -> list[float]``). Every arm gets
the same ``ArmSettings``: the same batches in the same order, the same initial policy and
drafter, the same engine seed. Policy and reference are ``TunixCausalLM`` wrappers of the
task's target on a 1-device mesh with ``Auto`` axes; AdamW (global-norm clipping 1); RLCluster
rolls a step out in calls of ``rollout_prompts`` prompts x the group.

A results directory ``out`` holds:

- ``settings.json``: the ``ArmSettings``; a rerun with other settings is refused (the
  checkpoint options are not settings: they do not change the run).
- ``<arm>.csv``: one row per step, ``ARM_CSV_FIELDS``: reward mean, rollout seconds and tokens
  (summed over the step's rollout calls), tokens/s, τ (tokens per target forward), mean draft
  size, the drafter refresh's steps (``RefreshSchedule``: not after every call), seconds / loss /
  chain τ before it / XLA temp bytes / logits bytes, mean completion length (characters), rollout
  calls, decode compilations, the step's wall seconds, ``os.getloadavg()[0]`` (other jobs slow the
  rollouts: read tokens/s next to it) and the time; with ``beside_ar``, the tokens/s and tokens of
  an ``ar`` engine that rolled out the same prompts with the same policy, key and sampling
  beside the arm's engine (``LoggedRollout``: after it and before it in turn): the arm's speed
  against ``ar`` on the arm's own policy at every step, which two arms' runs cannot give once
  their policies part; and how many of the step's calls ran as plain calls (``auto_probe``: the
  policy would not draft).
- ``checkpoints/<arm>/``: tunix's own checkpoints (orbax: the policy and its AdamW state, every
  ``ckpt_every`` steps and at the end; the newest ``ckpt_keep`` kept) and beside them
  ``engine/<step>.npz``, the engine state tunix does not know about (``rollout.checkpoints``:
  PRNG key, carried ``budget="auto"`` states, a refreshed drafter and its optimizer state).

Resume: a rerun restores tunix's newest checkpoint (tunix fast-forwards the batches by its
step) and the engine state of that step, keeps the CSV rows before that step and reruns the
rest. An arm is complete when its CSV holds ``steps`` rows and no checkpoint says an update is
still to do; a complete arm is skipped, an incomplete one without a checkpoint reruns from
step 0.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import os
import time
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dominotree_jax.rollout.checkpoints import (attach_engine_checkpoints,
                                                finish_checkpoint_writes, restore_engine_state)
from experiments.grpo.grpo_task import ArmTask, sampling_config
from dominotree_jax.rollout.tunix_engine import DominoTreeRollout
from dominotree_jax.rollout.tunix_model import TunixCausalLM

ARM_CSV_FIELDS = (
    "arm", "step", "reward_mean", "rollout_s", "rollout_tokens", "tokens_per_s", "tau",
    "draft_size", "refresh_steps", "refresh_s", "refresh_loss", "refresh_chain_tau_before",
    "refresh_temp_bytes", "refresh_logits_bytes", "completion_len", "rollout_calls", "compiles",
    "step_wall_s", "loadavg_1m", "time_utc", "beside_ar_tokens_per_s", "beside_ar_tokens",
    "plain_calls")


@dataclasses.dataclass(frozen=True)
class ArmSettings:
    """What every arm of a comparison shares (``<out>/settings.json``)."""
    model: str              # the task's name
    steps: int              # GRPO steps per arm
    prompts: int            # prompts per step
    group: int              # samples per prompt (GRPO's group)
    max_new: int            # new tokens per completion, at most
    temperature: float
    lr: float               # the policy's AdamW learning rate
    beta: float             # GRPO's KL weight
    seed: int               # the batches' and the engine's seed
    refresh: dict           # ``drafter_refresh`` options of a refreshing arm
    rollout_prompts: int    # prompts per rollout call (x the group: the decode batch)
    call_clock: bool = False  # time the engine's calls (its ``clock=time.perf_counter``); off:
                              # reruns with the same seeds make the same rollouts

    def __post_init__(self):
        if self.prompts % self.rollout_prompts:
            raise ValueError(f"--rollout-prompts {self.rollout_prompts} must divide --prompts "
                             f"{self.prompts}")
        if self.group < 2:
            raise ValueError(f"GRPO needs a group of at least 2 samples, got {self.group}")


class LoggedRollout(DominoTreeRollout):
    """The engine, keeping each rollout call's figures until ``take`` (RLCluster calls
    ``generate`` once per rollout micro-batch: ``rollout_prompts`` prompts x the group).
    ``beside_ar``: an ``ar`` engine (same actor, seed and compiler options) rolls out every
    call's prompts again, with the same parameter updates, for its tokens/s only (its
    completions are dropped; its key sequence is the arm's: the same keys per call; it holds
    the weights in the arm's precision). It runs right after the arm's engine in a step's
    first, third, ... call and right before it in the others, so neither engine is always the
    first to run after the trainer's update (in a bf16 GRPO run on a Zen 4 an arm whose calls
    were 78 of 80 the same ``ar`` program read 0.93x the ``ar`` run after it)."""

    def __init__(self, beside_ar: bool = False, **kw):
        super().__init__(**kw)
        self.calls: list[dict] = []
        self.beside = None
        if beside_ar:
            same = ("rollout_actor", "tokenizer", "mesh", "rollout_config", "seed",
                    "compiler_options", "precision")
            self.beside = DominoTreeRollout(method="ar",
                                            **{k: kw[k] for k in same if k in kw})

    def generate(self, prompts, rollout_config, **kw):
        beside_first = self.beside is not None and len(self.calls) % 2 == 1
        if beside_first:
            self.beside.generate(prompts, rollout_config, **kw)
        out = super().generate(prompts, rollout_config, **kw)
        last = self.last
        refresh = self.refreshed or {}
        self.calls.append({"seconds": last.seconds, "tokens": last.num_tokens,
                           "accepted": int(np.sum(np.asarray(last.out.accept_lengths))),
                           "rounds": int(np.sum(np.asarray(last.out.num_rounds))),
                           "draft_size": last.mean_draft_size, "refresh": refresh,
                           "plain": last.plain})
        if self.beside is not None:
            if not beside_first:
                self.beside.generate(prompts, rollout_config, **kw)
            self.calls[-1]["beside"] = (self.beside.last.seconds, self.beside.last.num_tokens)
        return out

    def update_params(self, params, filter_types=None) -> None:
        super().update_params(params, filter_types)
        if self.beside is not None:
            self.beside.update_params(params, filter_types)

    def take(self) -> list[dict]:
        calls, self.calls = self.calls, []
        return calls


class StepLog:
    """A tunix metric function (called once per step, after all of the step's rollout calls)
    that appends the step's row to the arm's CSV and hands the engine's metrics to tunix's
    logger."""

    def __init__(self, path: str, arm: str, engine_ref: list, start: int = 0):
        """``engine_ref[0]``: the ``LoggedRollout``. ``start``: the step the run starts at (a
        restored checkpoint's): the CSV keeps its rows of the steps before it, later ones are
        dropped (``start`` 0: a new CSV)."""
        self.path, self.arm, self.engine_ref = path, arm, engine_ref
        self.step = start
        self.t_prev = time.perf_counter()
        kept = []
        if start:
            kept = [r for r in csv_rows(path) if int(r["step"]) < start]
            if [int(r["step"]) for r in kept] != list(range(start)):
                raise ValueError(f"{path} lacks rows of steps before the checkpoint's step "
                                 f"{start} (found {len(kept)}): it does not belong to this "
                                 "checkpoint; delete the arm's checkpoints to rerun it")
        with open(path + ".tmp", "w", newline="") as f:   # (replaced at once: a crash here
            w = csv.DictWriter(f, ARM_CSV_FIELDS)         # loses no kept row)
            w.writeheader()
            w.writerows(kept)
        os.replace(path + ".tmp", path)

    def __call__(self, prompts, completions, rewards, **unused):
        eng = self.engine_ref[0]
        calls = eng.take()
        now = time.perf_counter()
        refresh = [c["refresh"] for c in calls if c["refresh"]]
        seconds = sum(c["seconds"] for c in calls)
        tokens = sum(c["tokens"] for c in calls)

        def r_sum(key):
            return sum(r[key] for r in refresh) if refresh else ""

        def r_mean(key):
            return float(np.mean([r[key] for r in refresh])) if refresh else ""

        def r_max(key):
            return max(r.get(key, 0) for r in refresh) if refresh else ""
        rounds = max(sum(c["rounds"] for c in calls), 1)
        row = {"arm": self.arm, "step": self.step, "reward_mean": float(np.mean(rewards)),
               "rollout_s": seconds, "rollout_tokens": tokens, "tokens_per_s": tokens / seconds,
               "tau": sum(c["accepted"] for c in calls) / rounds,
               "draft_size": float(np.mean([c["draft_size"] for c in calls])),
               "refresh_steps": len(refresh), "refresh_s": r_sum("seconds"),
               "refresh_loss": r_mean("loss"),
               "refresh_chain_tau_before": r_mean("chain_tau_before"),
               "refresh_temp_bytes": r_max("temp_bytes"),
               "refresh_logits_bytes": r_max("logits_bytes"),
               "completion_len": float(np.mean([len(c) for c in completions])),
               "rollout_calls": len(calls), "compiles": eng.num_compilations,
               "step_wall_s": now - self.t_prev, "loadavg_1m": os.getloadavg()[0],
               "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "beside_ar_tokens_per_s": "", "beside_ar_tokens": "",
               "plain_calls": sum(c["plain"] for c in calls)}
        beside = [c["beside"] for c in calls if "beside" in c]
        if beside:
            b_seconds, b_tokens = (sum(x) for x in zip(*beside))
            row.update(beside_ar_tokens_per_s=b_tokens / b_seconds, beside_ar_tokens=b_tokens)
        self.t_prev = now
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, ARM_CSV_FIELDS).writerow(row)
        self.step += 1
        vs_ar = (f" (ar beside {row['beside_ar_tokens_per_s']:.1f})" if beside else "")
        print(f"[{self.arm}] step {row['step']:3d} reward {row['reward_mean']:.3f} tau "
              f"{row['tau']:.2f} size {row['draft_size']:.1f} {row['tokens_per_s']:.1f} tok/s"
              f"{vs_ar} "
              f"(rollout {seconds:.1f}s, step {row['step_wall_s']:.1f}s, compiles "
              f"{row['compiles']}, load {row['loadavg_1m']:.2f})", flush=True)
        return eng.tunix_metrics()


def _same_step(log: StepLog, step: int) -> None:
    """Refuse a checkpoint whose train step is not the CSV's next step (the engine state and
    the CSV rows kept on resume must belong to the same step)."""
    if log.step != step:
        raise RuntimeError(f"tunix saves train step {step} but the CSV is at step {log.step}")


# ---------------------------------------------------------------------------- the directory
def arm_csv_path(out: str, arm: str) -> str:
    return os.path.join(out, f"{arm}.csv")


def checkpoint_dir(out: str, arm: str) -> str:
    return os.path.join(out, "checkpoints", arm)


def csv_rows(path: str) -> list[dict]:
    """The rows of a CSV file as read (strings); none when it does not exist."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def completed_steps(csv_path: str) -> int:
    return len(csv_rows(csv_path))


def latest_checkpoint(ckpt_root: str) -> int | None:
    """The newest train step tunix has a finished checkpoint of under ``ckpt_root``."""
    actor = os.path.join(ckpt_root, "actor")
    steps = [int(n) for n in os.listdir(actor) if n.isdigit()] if os.path.isdir(actor) else []
    return max(steps, default=None)


def arm_complete(out: str, arm: str, steps: int) -> bool:
    """The arm's CSV holds ``steps`` rows and no checkpoint says an update is still to do (a
    run that ended after writing its last row but before its last update has one)."""
    ckpt = latest_checkpoint(checkpoint_dir(out, arm))
    return completed_steps(arm_csv_path(out, arm)) >= steps and (ckpt is None or ckpt >= steps)


def pin_settings(out: str, settings: ArmSettings) -> None:
    """Write ``<out>/settings.json``, or refuse (ValueError) if it holds other settings."""
    os.makedirs(out, exist_ok=True)
    path, new = os.path.join(out, "settings.json"), dataclasses.asdict(settings)
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if old != new:
            raise ValueError(f"{path} holds other settings ({old}); use another --out or "
                             "delete it")
    else:
        with open(path, "w") as f:
            json.dump(new, f, indent=1)


# ---------------------------------------------------------------------------- the runs
def run_arm(task: ArmTask, arm: str, settings: ArmSettings, csv_path: str,
            train_batches: Iterable[dict], reward_fn: Callable, save_dir: str | None = None,
            ckpt_root: str | None = None, ckpt_every: int = 2, ckpt_keep: int = 2,
            stop_after: int | None = None, beside_ar: bool = False) -> DominoTreeRollout:
    """``settings.steps`` GRPO steps of tunix's learner for one arm (or until train step
    ``stop_after``) on ``train_batches`` (dicts of ``prompts`` and the reward's fields),
    continuing from the newest checkpoint under ``ckpt_root`` (None: no checkpoints); with
    ``save_dir``, a finished arm's policy (and refreshed drafter) is saved there as
    ``<arm>_policy.npz`` (``<arm>_drafter.npz``); ``beside_ar``: time an ``ar`` engine on
    every rollout call too (``LoggedRollout``; not for the ``ar`` arm). Returns the engine."""
    if beside_ar and arm == "ar":
        raise ValueError("beside_ar times an ar engine beside a drafting arm; the ar arm is one")
    import orbax.checkpoint as ocp
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner

    s = settings
    if ckpt_root is not None:   # orbax refuses relative checkpoint paths
        ckpt_root = os.path.abspath(ckpt_root)
    if ckpt_every < 1 or ckpt_keep < 1:
        raise ValueError(f"ckpt_every and ckpt_keep must be >= 1, got {ckpt_every}, "
                         f"{ckpt_keep}")
    pad = task.pad_id
    policy = TunixCausalLM.from_params(task.tcfg, task.tparams, pad)
    reference = TunixCausalLM.from_params(task.tcfg, jax.tree.map(jnp.copy, task.tparams), pad)
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    Role = rl_cluster_lib.Role
    engine = functools.partial(
        LoggedRollout, drafter_config=task.dcfg, drafter_params=task.dparams, seed=s.seed,
        compiler_options=task.compiler_options, beside_ar=beside_ar,
        clock=time.perf_counter if s.call_clock else None,
        **task.engine_options(arm, s.refresh))
    ckpt = {} if ckpt_root is None else dict(
        checkpoint_root_directory=ckpt_root,
        checkpointing_options=ocp.CheckpointManagerOptions(save_interval_steps=ckpt_every,
                                                           max_to_keep=ckpt_keep))
    cluster = rl_cluster_lib.RLCluster(
        actor=policy, reference=reference, tokenizer=task.tokenizer,
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={Role.ACTOR: mesh, Role.REFERENCE: mesh, Role.ROLLOUT: mesh},
            rollout_engine=engine,
            training_config=rl_cluster_lib.RLTrainingConfig(
                actor_optimizer=optax.chain(optax.clip_by_global_norm(1.0),
                                            optax.adamw(s.lr, b1=0.9, b2=0.99,
                                                        weight_decay=0.0)),
                eval_every_n_steps=10**9, max_steps=min(s.steps, stop_after or s.steps),
                rollout_micro_batch_size=s.rollout_prompts, **ckpt),
            rollout_config=sampling_config(task, s.max_new, s.temperature)))
    start = cluster.actor_trainer.train_steps   # tunix's restored checkpoint step (0: none)
    log = StepLog(csv_path, arm, [cluster.rollout], start)
    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster, metric_fns=[log], reward_fns=reward_fn,
        algo_config=grpo_learner.GRPOConfig(num_generations=s.group, num_iterations=1,
                                            beta=s.beta))
    if ckpt_root is not None:   # the engine state beside tunix's: <ckpt_root>/engine/<n>.npz
        edir = os.path.join(ckpt_root, "engine")
        restore_engine_state(cluster, edir, start, sync_weights=learner.should_sync_weights)
        attach_engine_checkpoints(cluster, edir, ckpt_keep,
                                  before_engine_save=functools.partial(_same_step, log))
    print(f"[{arm}] from step {start}" + (f" (checkpoint in {ckpt_root})" if start else ""),
          flush=True)
    try:
        learner.train(train_batches)
    finally:   # an interrupted run: let orbax finish writing a checkpoint it has started
        finish_checkpoint_writes(cluster)
    eng = cluster.rollout
    if save_dir and log.step == s.steps:
        save_trained(eng, save_dir, arm)
    return eng


def save_trained(engine: DominoTreeRollout, save_dir: str, arm: str) -> None:
    """The engine's policy as ``<save_dir>/<arm>_policy.npz`` and, if it refreshes its
    drafter, the drafter as ``<arm>_drafter.npz`` (flat ``state_to_flat`` names)."""
    from dominotree_jax.model.state import state_to_flat
    os.makedirs(save_dir, exist_ok=True)
    np.savez(os.path.join(save_dir, f"{arm}_policy.npz"),
             **state_to_flat(engine.params["target"]))
    if engine.refresher is not None:
        np.savez(os.path.join(save_dir, f"{arm}_drafter.npz"),
                 **state_to_flat(engine.params["drafter"]))


def run_arms(make_task: Callable[[], Any], arms: Iterable[str], settings: ArmSettings,
             out: str, train_batches: Callable[[Any], Iterable[dict]], reward_fn: Callable,
             save_dir: str | None = None, ckpt_every: int = 2, ckpt_keep: int = 2,
             stop_after: int | None = None, beside_ar: bool = False) -> dict:
    """Run (or continue from their checkpoints, under ``<out>/checkpoints``) the ``arms`` not
    yet complete in ``out``, each until ``settings.steps`` (or train step ``stop_after``);
    ``make_task()`` is called once, only if an arm is to run, and ``train_batches(task)`` once
    per arm; ``beside_ar``: every drafting arm times an ``ar`` engine beside it (``run_arm``).
    Returns ``{arm: the arm's CSV rows after this run (0 = skipped: complete)}``."""
    arms = tuple(arms)
    pin_settings(out, settings)
    todo = [arm for arm in arms if not arm_complete(out, arm, settings.steps)]
    ran = {arm: 0 for arm in arms}
    if not todo:
        print(f"all arms complete in {out}", flush=True)
        return ran
    task = make_task()
    for arm in todo:
        path = arm_csv_path(out, arm)
        print(f"[{arm}] {completed_steps(path)} rows were there", flush=True)
        run_arm(task, arm, settings, path, train_batches(task), reward_fn, save_dir,
                checkpoint_dir(out, arm), ckpt_every, ckpt_keep, stop_after,
                beside_ar and arm != "ar")
        ran[arm] = completed_steps(path)
    return ran
