"""Rollout speed of GRPO arms side by side: the same prompts, policy weights and sampling keys,
in one process, arm after arm in turn, for a load-free tokens/s comparison (run it with nothing
else on the machine); rows appended to ``<out>/speed.csv`` (``grpo_report`` tables them)."""

from __future__ import annotations

import csv
import dataclasses
import os
import time
from typing import Callable

import jax.numpy as jnp
import numpy as np

from dominotree_jax.precision import PRECISIONS
from experiments.grpo.grpo_task import ArmTask, sampling_config
from dominotree_jax.rollout.tunix_engine import DominoTreeRollout
from dominotree_jax.rollout.tunix_model import TunixCausalLM

# FIRST_USE: on XLA:CPU the first round of each draft size in a process costs ~0.55 s more
# (YNNPACK sets up that size's products when they first run; measured on a Zen 5, 2 cores,
# 2026-12-05: sizes 2 and 4 each +0.55-0.6 s once, then as usual; without YNNPACK fusions there
# is no such cost, but every step runs 2x slower). A timed rep may hold such a first use that
# the untimed rep did not reach (the policy chooses the sizes): the rows name them.


def load_flat(template, path: str):
    """A parameter tree shaped like ``template`` from an ``.npz`` of ``state_to_flat`` names
    (``grpo_run.save_trained``'s files)."""
    from dominotree_jax.model.state import state_from_flat
    with np.load(path) as z:
        return state_from_flat(template, {k: jnp.asarray(z[k]) for k in z.files})


PRECISION_MARK = "@"   # "auto@bfloat16": an arm whose engine holds the weights in bf16


def arm_precision(arm: str) -> str | None:
    """The precision an arm's engine holds the policy (and drafter) in: the text after ``@``
    (``precision.PRECISIONS``), else None (the task's own)."""
    if PRECISION_MARK not in arm:
        return None
    name = arm.split(PRECISION_MARK, 1)[1]
    if name not in PRECISIONS:
        raise ValueError(f"arm {arm!r}: unknown precision {name!r}; one of {PRECISIONS}")
    return name


def compare_rollout_speed(task: ArmTask, batch: dict, reward_fn: Callable, out: str,
                          policies=(), arms=("ar", "auto"), reps: int = 3, group: int = 4,
                          max_new: int = 48, temperature: float = 0.9, seed: int = 1234,
                          rollout_prompts: int = 1) -> list[dict]:
    """Tokens/s, τ and reward of ``arms`` rolling out ``batch["prompts"]`` x ``group``, in
    calls of ``rollout_prompts`` prompts x the group, ``reps`` timed rounds after an untimed
    one (it compiles), for the initial policy and then each ``(label, path)`` of ``policies``
    (``<arm>_policy.npz`` files, loaded with ``update_params``: no recompilation; a
    ``<arm>_drafter.npz`` beside one is the drafter the drafting arms use with it, else the
    initial one). ``reward_fn`` is tunix's (``prompts``, ``completions``, the batch's other
    fields). Returns the rows, also appended to ``<out>/speed.csv``; ``first_used_sizes``
    lists the draft sizes an engine ran for the first time in that rep (``FIRST_USE``). An
    arm ``<arm>@bfloat16`` is the task's ``engine_options`` for it: that arm with the engine
    holding a bf16 copy of the weights (``arm_precision``)."""
    texts = [p for p in batch["prompts"] for _ in range(group)]
    for arm in arms:
        arm_precision(arm)   # unknown precisions refused before anything is built
    fields = {k: [v for v in vs for _ in range(group)] for k, vs in batch.items()
              if k != "prompts"}
    rc = sampling_config(task, max_new, temperature)
    options = {arm: task.engine_options(arm, {}) for arm in arms}
    engines = {arm: DominoTreeRollout(
        rollout_actor=TunixCausalLM.from_params(task.tcfg, task.tparams, task.pad_id),
        tokenizer=task.tokenizer, drafter_config=task.dcfg, drafter_params=task.dparams,
        compiler_options=task.compiler_options, **opts) for arm, opts in options.items()}
    drafting = [arm for arm, opts in options.items() if opts.get("method") != "ar"]
    seen = {arm: set() for arm in arms}   # draft sizes each engine has run (FIRST_USE)
    chunk = rollout_prompts * group   # the decode batch of the GRPO run
    rows = []
    for label, path in (("initial", None), *policies):
        if path is not None:
            tparams = load_flat(task.tparams, path)
            for arm, eng in engines.items():
                eng.update_params(tparams)   # (cast to the engine's precision)
            # a refreshed arm's drafter, saved beside its policy (else the initial one)
            dpath = path.replace("_policy.npz", "_drafter.npz")
            dparams = (load_flat(task.dparams, dpath) if dpath != path and os.path.exists(dpath)
                       else task.dparams)
            for arm in drafting:
                engines[arm].update_drafter_params(dparams)
        for rep in range(reps + 1):
            for arm, eng in engines.items():
                seconds = tokens = accepted = rounds = 0
                completions, first = [], set()
                for c in range(0, len(texts), chunk):
                    res = eng.generate(texts[c:c + chunk], dataclasses.replace(rc, seed=seed + rep))
                    last = eng.last
                    seconds += last.seconds
                    tokens += last.num_tokens
                    accepted += int(np.sum(np.asarray(last.out.accept_lengths)))
                    rounds += int(np.sum(np.asarray(last.out.num_rounds)))
                    completions += res.text
                    sizes = set(np.unique(np.asarray(last.out.draft_sizes)).tolist()) - {-1, 0}
                    first |= sizes - seen[arm]
                    seen[arm] |= sizes
                if rep == 0:   # untimed: compiles (initial), or places new values (the
                    continue   # first drafter update commits its arrays: one recompile)
                rewards = reward_fn(prompts=texts, completions=completions, **fields)
                rows.append({"policy": label, "arm": arm, "rep": rep, "rollouts": len(texts),
                             "batch": chunk, "tokens": tokens, "seconds": seconds,
                             "tokens_per_s": tokens / seconds, "tau": accepted / max(rounds, 1),
                             "reward_mean": float(np.mean(rewards)),
                             "first_used_sizes": " ".join(map(str, sorted(first))),
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
