"""GRPO on SmolLM2-135M-Instruct through tunix's ``GRPOLearner`` / ``RLCluster``, rollouts by
``DominoTreeRollout``: plain autoregressive (``ar``) vs DominoTree ``budget="auto"`` (``auto``)
vs ``budget="auto"`` with the engine's drafter refresh (``auto+refresh``).

Task: arithmetic word problems generated from ``--seed`` ("Mia has 7 apples and gets 5
more. How many apples does Mia have now? Answer with only the number."), each asked in the
model's chat template; reward 1 when the completion's final number is exactly the answer.
Every step: ``--prompts`` problems x a group of ``--group`` samples (``--prompts 4 --group 4``
= 16 rollouts) at ``--temperature``, at most ``--max-new`` new tokens, one tunix GRPO update
(policy and reference are ``TunixCausalLM`` wrappers of the loaded target, 1-device CPU mesh).
RLCluster rolls a step out in calls of ``--rollout-prompts`` prompts x the group (default 1 x 4:
a decode batch of 4, where drafting pays on a CPU; at batch 16 the default cost model makes
``budget="auto"`` take plain steps only).
Every arm gets the same seed: the same problems in the same order, the same initial policy and
drafter, the same engine seed.

Per step the arm's CSV (``<out>/<arm>.csv``) gets one row: reward mean, rollout seconds,
rollout tokens, tokens/s, mean τ (tokens per target forward), mean draft size, the refresh
step's seconds / loss / chain τ before it / XLA temp bytes / logits bytes, the wall seconds of
the whole step, and ``os.getloadavg()[0]`` (other jobs on the machine slow the rollouts: read
tokens/s next to it).

Resume: an interrupted arm (killed, crashed, or stopped by ``--stop-after K``) continues from
its last checkpoint. Every ``--ckpt-every`` steps (and at the end) tunix's own checkpointing
(``RLTrainingConfig(checkpoint_root_directory=<out>/checkpoints/<arm>,
checkpointing_options=...)``, orbax) saves the policy's parameters and its AdamW state, and
next to it, at the same step, ``dominotree_jax.rollout.checkpoints`` saves the engine state
tunix does not know about (``DominoTreeRollout.checkpoint_state``: the PRNG key, the carried
``budget="auto"`` states, and for ``auto+refresh`` the refreshed drafter and the refresher's
optimizer state), as ``<out>/checkpoints/<arm>/engine/<step>.pkl``. On a rerun tunix restores
the policy and optimizer and fast-forwards the problem iterator by the restored step, the
engine state of that step is put back, the CSV keeps its rows before that step (later rows,
from the interrupted attempt, are dropped and rerun). Only the last ``--ckpt-keep`` checkpoints
are kept (SmolLM2-135M: 3 x 538 MB ~ 1.6 GB of arrays each, the float32 policy and its two Adam
moments; the auto+refresh engine state adds ~180 MB, the drafter's 60 MB x 3). Rerunning the
same command skips every complete arm (its CSV holds ``--steps`` rows and no checkpoint is
behind it); an incomplete arm without a checkpoint reruns from step 0. Settings are stored next
to the CSVs (``settings.json``); a rerun with other settings into the same ``--out`` is refused
(the checkpoint flags are not part of them: they do not change the run).

    python examples/grpo_smollm2.py --out benchmarks/results/rl --steps 60   # all arms
    python examples/grpo_smollm2.py --out DIR --arms ar,auto                 # a subset
    python examples/grpo_smollm2.py --report benchmarks/results/rl           # plot + table
    python examples/grpo_smollm2.py --speed DIR [--policy NAME=FILE.npz]     # ar vs auto

``--speed`` times ``ar`` and ``auto`` rollouts of the same prompts with the same policy weights
(the initial ones, then each policy saved by ``--save-dir``) in one process, alternating, for a
load-free tokens/s comparison (run it with nothing else on the machine).
``--model tiny`` runs everything on a tiny random model (``tests/test_rl_example.py``).
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import random
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dominotree_jax.rollout import DominoTreeRollout, RolloutConfig, TunixCausalLM
from dominotree_jax.rollout.checkpoints import (attach_engine_checkpoints,
                                                finish_checkpoint_writes, restore_engine_state)

ARMS = ("ar", "auto", "auto+refresh")
FIELDS = ("arm", "step", "reward_mean", "rollout_s", "rollout_tokens", "tokens_per_s", "tau",
          "draft_size", "refresh_s", "refresh_loss", "refresh_chain_tau_before",
          "refresh_temp_bytes", "refresh_logits_bytes", "completion_len", "rollout_calls",
          "compiles", "step_wall_s", "loadavg_1m", "time_utc")
FAST_XLA = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
SUFFIX = " Answer with only the number."
NAMES = ("Mia", "Tom", "Ana", "Sam", "Lea", "Ben", "Zoe", "Max")
ITEMS = ("apples", "pencils", "stickers", "marbles", "books", "cookies")


# ---------------------------------------------------------------------------- task
def word_problem(rng: random.Random) -> tuple[str, int]:
    """One small arithmetic word problem and its answer."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    kind = rng.randrange(3)
    if kind == 0:
        a, b = rng.randint(2, 20), rng.randint(2, 20)
        return f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have " \
               f"now?", a + b
    if kind == 1:
        a = rng.randint(5, 30)
        b = rng.randint(1, a - 1)
        return f"{name} has {a} {item} and gives away {b}. How many {item} are left?", a - b
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return f"{name} has {a} bags with {b} {item} in each bag. How many {item} does {name} " \
           f"have?", a * b


def final_number(text: str) -> int | None:
    """The last integer in ``text`` (thousands commas allowed), or None."""
    found = re.findall(r"-?\d[\d,]*", text)
    if not found:
        return None
    digits = found[-1].replace(",", "")
    return int(digits) if digits.lstrip("-") else None


def rewards(completions, answer) -> list[float]:
    """1 where a completion's final number is exactly its answer, else 0."""
    return [float(final_number(c) == int(a)) for c, a in zip(completions, answer)]


def batches(seed: int, steps: int, prompts: int, as_prompt):
    """``steps`` tunix training inputs: ``prompts`` problems each (``as_prompt(question)`` is
    what the engine is given), with their answers; the same for every arm of a seed."""
    rng = random.Random(seed)
    for _ in range(steps):
        qs = [word_problem(rng) for _ in range(prompts)]
        yield {"prompts": np.array([as_prompt(q + SUFFIX) for q, _ in qs]),
               "answer": np.array([a for _, a in qs])}


# ---------------------------------------------------------------------------- models
class CharTokenizer:
    """Characters as ids 2.. (0 pad, 1 end), tunix's tokenizer methods: the tiny model's."""
    CHARS = "0123456789+-=?.,* abcdefghijklmnopqrstuvwxyz"

    def encode(self, text, **kw):
        return [2 + self.CHARS.index(c) for c in text.lower() if c in self.CHARS]

    def decode(self, ids, **kw):
        return "".join(self.CHARS[i - 2] for i in ids if 2 <= i < 2 + len(self.CHARS))

    def bos_id(self):
        return None

    def eos_id(self):
        return 1

    def pad_id(self):
        return 0


class Task:
    """Target config/params, drafter, tokenizer, stop ids, prompt formatting and auto costs for
    ``smollm2`` (the shipped pair) or ``tiny`` (random 2-layer models, character tokenizer)."""

    def __init__(self, kind: str):
        if kind == "smollm2":
            import dominotree_jax as dj
            from dominotree_jax.assets import smollm2_drafter_path, smollm2_gguf_path
            pair = dj.load_pair(smollm2_gguf_path(), smollm2_drafter_path())
            tok = pair.target.tokenizer
            self.tokenizer, self.tcfg, self.tparams = tok, pair.target.config, pair.target.params
            self.dcfg, self.dparams = pair.drafter_config, pair.drafter_params
            self.stop_ids = list(pair.target.eos_ids)
            self.auto = pair.config("dominotree", budget="auto")   # calibrated costs, if any
            self.as_prompt = functools.partial(_chat_text, tok)
            self.prompt_width, self.compiler_options = 64, None
        elif kind == "tiny":
            from dominotree_jax.config import DrafterConfig, TargetConfig
            from dominotree_jax.decoding.config import DecodeConfig
            from dominotree_jax.model.drafter import init_drafter_params
            from dominotree_jax.model.target import init_target_params
            self.tcfg = TargetConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=8, rope_theta=1e4)
            self.dcfg = DrafterConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=8, block_size=4,
                                      mask_token_id=63, num_target_layers=2,
                                      target_layer_ids=(0, 1), projector_type="domino",
                                      gru_hidden_dim=16, emb_dim=8)
            self.tparams = init_target_params(self.tcfg, 0)
            self.dparams = init_drafter_params(self.dcfg, 1)
            self.tokenizer = CharTokenizer()
            self.stop_ids = [1]
            self.auto = DecodeConfig(target=self.tcfg, drafter=self.dcfg, method="dominotree",
                                     budget="auto", node_topk=3, top_m=16,
                                     auto_sizes=(0, 2, 4, 6))
            self.as_prompt = lambda text: text[:40]   # short prompts for the tiny test
            self.prompt_width, self.compiler_options = 64, FAST_XLA
        else:
            raise ValueError(f"unknown model {kind!r}: smollm2 or tiny")
        self.pad_id = int(self.tokenizer.pad_token_id if hasattr(self.tokenizer, "pad_token_id")
                          and self.tokenizer.pad_token_id is not None else
                          (self.tokenizer.eos_token_id if hasattr(self.tokenizer, "eos_token_id")
                           else self.tokenizer.pad_id()))

    def engine_options(self, arm: str, refresh: dict) -> dict:
        """``DominoTreeRollout`` keyword arguments of an arm."""
        if arm == "ar":
            return dict(method="ar")
        a = self.auto
        opts = dict(method="dominotree", budget="auto", node_topk=a.node_topk, top_m=a.top_m,
                    auto_costs=a.auto_costs, auto_sizes=a.auto_sizes)
        if arm == "auto+refresh":
            opts["drafter_refresh"] = dict(refresh)
        elif arm != "auto":
            raise ValueError(f"unknown arm {arm!r}: one of {ARMS}")
        return opts


def _chat_text(tokenizer, question: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         add_generation_prompt=True, tokenize=False)


# ---------------------------------------------------------------------------- one arm
class LoggedRollout(DominoTreeRollout):
    """The engine, summing each rollout call's figures until ``take`` (RLCluster calls
    ``generate`` once per rollout micro-batch: ``--rollout-prompts`` prompts x the group)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls: list[dict] = []

    def generate(self, prompts, rollout_config, **kw):
        out = super().generate(prompts, rollout_config, **kw)
        last = self.last
        refresh = self.refresh_log[-1] if self.refresher is not None else {}
        self.calls.append({"seconds": last.seconds, "tokens": last.num_tokens,
                           "accepted": int(np.sum(np.asarray(last.out.accept_lengths))),
                           "rounds": int(np.sum(np.asarray(last.out.num_rounds))),
                           "draft_size": last.mean_draft_size, "refresh": refresh})
        return out

    def take(self) -> list[dict]:
        calls, self.calls = self.calls, []
        return calls


class StepLog:
    """A tunix metric function (called once per step here, after all of the step's rollout
    calls) that appends the step's row to the arm's CSV and hands the engine's metrics to
    tunix's logger."""

    def __init__(self, path: str, arm: str, engine_ref: list, start: int = 0):
        """``start``: the step the run starts at (a restored checkpoint's): the CSV keeps its
        rows of the steps before it, later ones are dropped (``start`` 0: a new CSV)."""
        self.path, self.arm, self.engine_ref = path, arm, engine_ref
        self.step = start
        self.t_prev = time.perf_counter()
        kept = []
        if start:
            kept = [r for r in _csv_rows(path) if int(r["step"]) < start]
            if [int(r["step"]) for r in kept] != list(range(start)):
                raise ValueError(f"{path} lacks rows of steps before the checkpoint's step "
                                 f"{start} (found {len(kept)}): it does not belong to this "
                                 "checkpoint; delete the arm's checkpoints to rerun it")
        with open(path + ".tmp", "w", newline="") as f:   # (replaced at once: a crash here
            w = csv.DictWriter(f, FIELDS)                 # loses no kept row)
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

        def rsum(key):
            return sum(r[key] for r in refresh) if refresh else ""

        def rmax(key):
            return max(r.get(key, 0) for r in refresh) if refresh else ""
        row = {"arm": self.arm, "step": self.step, "reward_mean": float(np.mean(rewards)),
               "rollout_s": seconds, "rollout_tokens": tokens, "tokens_per_s": tokens / seconds,
               "tau": sum(c["accepted"] for c in calls) / max(sum(c["rounds"] for c in calls),
                                                              1),
               "draft_size": float(np.mean([c["draft_size"] for c in calls])),
               "refresh_s": rsum("seconds"),
               "refresh_loss": float(np.mean([r["loss"] for r in refresh])) if refresh else "",
               "refresh_chain_tau_before": float(np.mean([r["chain_tau_before"]
                                                          for r in refresh])) if refresh else "",
               "refresh_temp_bytes": rmax("temp_bytes"),
               "refresh_logits_bytes": rmax("logits_bytes"),
               "completion_len": float(np.mean([len(c) for c in completions])),
               "rollout_calls": len(calls), "compiles": eng.num_compilations,
               "step_wall_s": now - self.t_prev, "loadavg_1m": os.getloadavg()[0],
               "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.t_prev = now
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, FIELDS).writerow(row)
        self.step += 1
        print(f"[{self.arm}] step {row['step']:3d} reward {row['reward_mean']:.3f} tau "
              f"{row['tau']:.2f} size {row['draft_size']:.1f} {row['tokens_per_s']:.1f} tok/s "
              f"(rollout {seconds:.1f}s, step {row['step_wall_s']:.1f}s, compiles "
              f"{row['compiles']}, load {row['loadavg_1m']:.2f})", flush=True)
        return eng.tunix_metrics()


def _same_step(log: StepLog, step: int) -> None:
    """Refuse a checkpoint whose train step is not the CSV's next step (the engine state and
    the CSV rows kept on resume must belong to the same step)."""
    if log.step != step:
        raise RuntimeError(f"tunix saves train step {step} but the CSV is at step {log.step}")


def checkpoint_dir(out: str, arm: str) -> str:
    return os.path.join(out, "checkpoints", arm)


def run_arm(task: Task, arm: str, settings: dict, csv_path: str, save_dir: str | None = None,
            ckpt_root: str | None = None, ckpt_every: int = 2, ckpt_keep: int = 2,
            stop_after: int | None = None) -> DominoTreeRollout:
    """``settings["steps"]`` GRPO steps of tunix's learner for one arm (or until train step
    ``stop_after``), continuing from the newest checkpoint under ``ckpt_root`` (None: no
    checkpoints); returns the engine."""
    import orbax.checkpoint as ocp
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout

    s = settings
    if ckpt_every < 1 or ckpt_keep < 1:
        raise ValueError(f"ckpt_every and ckpt_keep must be >= 1, got {ckpt_every}, "
                         f"{ckpt_keep}")
    pad = task.pad_id
    policy = TunixCausalLM.from_params(task.tcfg, task.tparams, pad)
    reference = TunixCausalLM.from_params(task.tcfg, jax.tree.map(jnp.copy, task.tparams), pad)
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    Role = rl_cluster_lib.Role
    engine = functools.partial(
        LoggedRollout, drafter_config=task.dcfg, drafter_params=task.dparams,
        seed=s["seed"], compiler_options=task.compiler_options,
        **task.engine_options(arm, s["refresh"]))
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
                                            optax.adamw(s["lr"], b1=0.9, b2=0.99,
                                                        weight_decay=0.0)),
                eval_every_n_steps=10**9, max_steps=min(s["steps"], stop_after or s["steps"]),
                rollout_micro_batch_size=s["rollout_prompts"], **ckpt),
            rollout_config=base_rollout.RolloutConfig(
                max_tokens_to_generate=s["max_new"], max_prompt_length=task.prompt_width,
                temperature=s["temperature"], top_p=1.0, top_k=None, seed=None,
                eos_tokens=task.stop_ids)))
    engine_ref = [cluster.rollout]
    trainer = cluster.actor_trainer
    start = trainer.train_steps   # tunix's restored checkpoint step (0: none)
    log = StepLog(csv_path, arm, engine_ref, start)
    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster, metric_fns=[log],
        reward_fns=lambda prompts, completions, answer, **kw: rewards(completions, answer),
        algo_config=grpo_learner.GRPOConfig(num_generations=s["group"], num_iterations=1,
                                            beta=s["beta"]))
    if ckpt_root is not None:   # the engine state beside tunix's: <ckpt_root>/engine/<n>.pkl
        edir = os.path.join(ckpt_root, "engine")
        restore_engine_state(cluster, edir, start, sync_weights=learner.should_sync_weights)
        attach_engine_checkpoints(cluster, edir, ckpt_keep,
                                  before_engine_save=functools.partial(_same_step, log))
    print(f"[{arm}] from step {start}" + (f" (checkpoint in {ckpt_root})" if start else ""),
          flush=True)
    try:
        learner.train(batches(s["seed"], s["steps"], s["prompts"], task.as_prompt))
    finally:   # an interrupted run: let orbax finish writing a checkpoint it has started
        finish_checkpoint_writes(cluster)
    eng = cluster.rollout
    if save_dir and log.step == s["steps"]:   # the trained policy (and drafter) for --speed
        from dominotree_jax.model.state import state_to_flat
        os.makedirs(save_dir, exist_ok=True)
        np.savez(os.path.join(save_dir, f"{arm}_policy.npz"),
                 **state_to_flat(eng.params["target"]))
        if eng.refresher is not None:
            np.savez(os.path.join(save_dir, f"{arm}_drafter.npz"),
                     **state_to_flat(eng.params["drafter"]))
    return eng


def _csv_rows(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def completed_steps(csv_path: str) -> int:
    return len(_csv_rows(csv_path))


def latest_checkpoint(ckpt_root: str) -> int | None:
    """The newest train step tunix has a finished checkpoint of under ``ckpt_root``."""
    actor = os.path.join(ckpt_root, "actor")
    steps = [int(n) for n in os.listdir(actor) if n.isdigit()] if os.path.isdir(actor) else []
    return max(steps, default=None)


def arm_complete(out: str, arm: str, steps: int) -> bool:
    """The arm's CSV holds ``steps`` rows and no checkpoint says an update is still to do (a
    run that ended after writing its last row but before its last update has one)."""
    ckpt = latest_checkpoint(checkpoint_dir(out, arm))
    return completed_steps(os.path.join(out, f"{arm}.csv")) >= steps and (
        ckpt is None or ckpt >= steps)


def main(model: str = "smollm2", arms=ARMS, steps: int = 60, prompts: int = 4, group: int = 4,
         max_new: int = 48, temperature: float = 0.9, lr: float = 3e-5, beta: float = 0.04,
         seed: int = 0, refresh: dict | None = None, out: str = "benchmarks/results/rl",
         save_dir: str | None = None, rollout_prompts: int = 1, ckpt_every: int = 2,
         ckpt_keep: int = 2, stop_after: int | None = None) -> dict:
    """Run (or continue from their checkpoints, under ``<out>/checkpoints``) the arms not yet
    complete in ``out``, each until ``steps`` (or train step ``stop_after``); returns ``{arm:
    the arm's CSV rows after this run (0 = skipped: complete already)}``."""
    for arm in arms:
        if arm not in ARMS:
            raise ValueError(f"unknown arm {arm!r}: one of {ARMS}")
    if prompts % rollout_prompts:
        raise ValueError(f"--rollout-prompts {rollout_prompts} must divide --prompts {prompts}")
    if group < 2:
        raise ValueError(f"GRPO needs a group of at least 2 samples, got {group}")
    refresh = dict(lr=3e-4, anchors=4, rows=None) if refresh is None else refresh
    settings = dict(model=model, steps=steps, prompts=prompts, group=group, max_new=max_new,
                    temperature=temperature, lr=lr, beta=beta, seed=seed, refresh=refresh,
                    rollout_prompts=rollout_prompts)
    os.makedirs(out, exist_ok=True)
    spath = os.path.join(out, "settings.json")
    if os.path.exists(spath):
        with open(spath) as f:
            old = json.load(f)
        if old != settings:
            raise ValueError(f"{spath} holds other settings ({old}); use another --out or "
                             "delete it")
    else:
        with open(spath, "w") as f:
            json.dump(settings, f, indent=1)
    todo = {arm: os.path.join(out, f"{arm}.csv") for arm in arms
            if not arm_complete(out, arm, steps)}
    ran = {arm: 0 for arm in arms}
    if not todo:
        print(f"all arms complete in {out}", flush=True)
        return ran
    task = Task(model)
    for arm, path in todo.items():
        print(f"[{arm}] {completed_steps(path)} rows were there", flush=True)
        run_arm(task, arm, settings, path, save_dir, checkpoint_dir(out, arm), ckpt_every,
                ckpt_keep, stop_after)
        ran[arm] = completed_steps(path)
    return ran


# ---------------------------------------------------------------------------- --speed
def speed(out: str, model: str = "smollm2", policies=(), reps: int = 3, prompts: int = 4,
          group: int = 4, max_new: int = 48, temperature: float = 0.9, seed: int = 1234,
          rollout_prompts: int = 1) -> list[dict]:
    """``ar`` vs ``auto`` tokens/s on the same prompts, policy weights and sampling keys, in
    one process, alternating (``reps`` timed rounds after a compiling one), for the initial
    policy and then each ``(label, path)`` of ``policies`` (``--save-dir`` files, loaded with
    ``update_params``: no recompilation; a ``<arm>_drafter.npz`` beside an ``<arm>_policy.npz``
    is the drafter ``auto`` uses with it, else the initial one); rows are appended to
    ``<out>/speed.csv``."""
    from dominotree_jax.model.state import state_from_flat
    task = Task(model)
    batch = next(batches(seed, 1, prompts, task.as_prompt))
    texts = [p for p in batch["prompts"] for _ in range(group)]
    answers = [a for a in batch["answer"] for _ in range(group)]
    rc = RolloutConfig(max_tokens_to_generate=max_new, max_prompt_length=task.prompt_width,
                       temperature=temperature, top_p=1.0, top_k=None,
                       eos_tokens=task.stop_ids, seed=None)
    engines = {arm: DominoTreeRollout(
        rollout_actor=TunixCausalLM.from_params(task.tcfg, task.tparams, task.pad_id),
        tokenizer=task.tokenizer, drafter_config=task.dcfg, drafter_params=task.dparams,
        compiler_options=task.compiler_options, **task.engine_options(arm, {}))
        for arm in ("ar", "auto")}
    chunk = rollout_prompts * group   # the decode batch of the GRPO run
    rows = []
    for label, path in (("initial", None), *policies):
        if path is not None:
            with np.load(path) as z:
                tparams = state_from_flat(task.tparams, {k: jnp.asarray(z[k]) for k in z.files})
            for eng in engines.values():
                eng.update_params(tparams)
            # a refreshed arm's drafter, saved beside its policy: auto drafts with it (else
            # with the shipped one)
            dpath = path.replace("_policy.npz", "_drafter.npz")
            dparams = task.dparams
            if dpath != path and os.path.exists(dpath):
                with np.load(dpath) as z:
                    dparams = state_from_flat(task.dparams,
                                              {k: jnp.asarray(z[k]) for k in z.files})
            engines["auto"].update_drafter_params(dparams)
        for rep in range(reps + 1):
            for arm, eng in engines.items():
                seconds = tokens = accepted = rounds = 0
                texts_out = []
                for c in range(0, len(texts), chunk):
                    res = eng.generate(texts[c:c + chunk],
                                       dataclass_replace(rc, seed=seed + rep))
                    last = eng.last
                    seconds += last.seconds
                    tokens += last.num_tokens
                    accepted += int(np.sum(np.asarray(last.out.accept_lengths)))
                    rounds += int(np.sum(np.asarray(last.out.num_rounds)))
                    texts_out += res.text
                if rep == 0:   # untimed: compiles (initial), or places new values (the
                    continue   # first drafter update commits its arrays: one recompile)
                rows.append({"policy": label, "arm": arm, "rep": rep, "rollouts": len(texts),
                             "batch": chunk, "tokens": tokens, "seconds": seconds,
                             "tokens_per_s": tokens / seconds, "tau": accepted / max(rounds, 1),
                             "reward_mean": float(np.mean(rewards(texts_out, answers))),
                             "compiles": eng.num_compilations,
                             "loadavg_1m": os.getloadavg()[0],
                             "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
                print(rows[-1], flush=True)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "speed.csv")
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)
    return rows


def dataclass_replace(rc, **kw):
    import dataclasses
    return dataclasses.replace(rc, **kw)


# ---------------------------------------------------------------------------- --report
def read_arm(path: str) -> list[dict]:
    with open(path) as f:
        return [{k: (float(v) if k not in ("arm", "time_utc") and v != "" else v)
                 for k, v in r.items()} for r in csv.DictReader(f)]


def report(out: str) -> str:
    """A markdown table and ``grpo.png`` (reward, τ, rollout tokens/s vs step) from the arms'
    CSVs in ``out``."""
    runs = {arm: read_arm(os.path.join(out, f"{arm}.csv")) for arm in ARMS
            if os.path.exists(os.path.join(out, f"{arm}.csv"))}
    runs = {k: v for k, v in runs.items() if v}
    if not runs:
        raise FileNotFoundError(f"no arm CSVs in {out}")
    lines = ["| arm | steps | reward first 10 → last 10 | τ first 10 → last 10 | "
             "rollout tok/s (median, steps ≥ 1) | rollout s/step (median) | refresh s/step "
             "(median) | load (median) |", "|---|---|---|---|---|---|---|---|"]
    for arm, rows in runs.items():
        def m(key, sl):
            return float(np.mean([r[key] for r in rows[sl]]))
        first, last = slice(0, 10), slice(-10, None)
        ref = [r["refresh_s"] for r in rows[1:] if r["refresh_s"] != ""]
        lines.append(
            f"| {arm} | {len(rows)} | {m('reward_mean', first):.2f} → "
            f"{m('reward_mean', last):.2f} | {m('tau', first):.2f} → {m('tau', last):.2f} | "
            f"{np.median([r['tokens_per_s'] for r in rows[1:]]):.1f} | "
            f"{np.median([r['rollout_s'] for r in rows[1:]]):.1f} | "
            f"{np.median(ref) if ref else float('nan'):.2f} | "
            f"{np.median([r['loadavg_1m'] for r in rows]):.2f} |")
    spath = os.path.join(out, "speed.csv")
    if os.path.exists(spath):   # the exclusive side-by-side measurement (--speed)
        with open(spath) as f:
            srows = list(csv.DictReader(f))
        lines += ["", "| policy | arm | decode batch | timed calls | tokens/s (median) | τ | "
                  "reward |", "|---|---|---|---|---|---|---|"]
        for key in dict.fromkeys((r["policy"], r["arm"]) for r in srows):
            rs = [r for r in srows if (r["policy"], r["arm"]) == key]
            lines.append(f"| {key[0]} | {key[1]} | {rs[0]['batch']} | {len(rs)} | "
                         f"{np.median([float(r['tokens_per_s']) for r in rs]):.1f} | "
                         f"{np.mean([float(r['tau']) for r in rs]):.2f} | "
                         f"{np.mean([float(r['reward_mean']) for r in rs]):.2f} |")
    table = "\n".join(lines)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    for arm, rows in runs.items():
        s = [r["step"] for r in rows]
        ax[0].plot(s, _smooth([r["reward_mean"] for r in rows]), label=arm)
        ax[1].plot(s, [r["tau"] for r in rows], label=arm)
        ax[2].plot(s[1:], _smooth([r["tokens_per_s"] for r in rows[1:]]), label=arm)
    for a, t in zip(ax, ("reward mean (moving mean of 5)", "τ: tokens per target forward",
                         "rollout tokens/s (moving mean of 5; shared CPU)")):
        a.set_title(t)
        a.set_xlabel("GRPO step")
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "grpo.png"), dpi=110)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table + "\n")
    return table


def _smooth(x, w: int = 5):
    x = np.asarray(x, float)
    return np.array([x[max(0, i - w + 1):i + 1].mean() for i in range(len(x))])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {ARMS}")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--rollout-prompts", type=int, default=1,
                    help="prompts per rollout call (x the group = the decode batch)")
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.9)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--refresh-lr", type=float, default=3e-4)
    ap.add_argument("--refresh-anchors", type=int, default=4)
    ap.add_argument("--out", default="benchmarks/results/rl")
    ap.add_argument("--save-dir", default=None, help="save each arm's final policy here")
    ap.add_argument("--ckpt-every", type=int, default=2,
                    help="checkpoint (tunix + engine state) every N steps, for resuming")
    ap.add_argument("--ckpt-keep", type=int, default=2, help="keep the newest N checkpoints")
    ap.add_argument("--stop-after", type=int, default=None,
                    help="stop (checkpointed) after this train step; a rerun continues")
    ap.add_argument("--report", default=None, help="write the table and plot of a results dir")
    ap.add_argument("--speed", default=None, help="ar vs auto tokens/s; rows to DIR/speed.csv")
    ap.add_argument("--policy", action="append", default=[],
                    help="--speed: LABEL=FILE.npz, a policy from --save-dir (repeatable)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if args.report:
        print(report(args.report))
    elif args.speed:
        speed(args.speed, args.model, [tuple(p.split("=", 1)) for p in args.policy],
              args.reps, args.prompts, args.group, args.max_new, args.temperature,
              rollout_prompts=args.rollout_prompts)
    else:
        main(args.model, tuple(a for a in args.arms.split(",") if a), args.steps, args.prompts,
             args.group, args.max_new, args.temperature, args.lr, args.beta, args.seed,
             dict(lr=args.refresh_lr, anchors=args.refresh_anchors, rows=None), args.out,
             args.save_dir, args.rollout_prompts, args.ckpt_every, args.ckpt_keep,
             args.stop_after)
