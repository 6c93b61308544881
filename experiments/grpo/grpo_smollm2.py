"""GRPO on SmolLM2-135M-Instruct through tunix's ``GRPOLearner`` / ``RLCluster``, rollouts by
``DominoTreeRollout``: plain autoregressive (``ar``) vs DominoTree ``budget="auto"`` (``auto``)
vs ``budget="auto"`` with the engine's drafter refresh (``auto+refresh``).

This file holds what you adapt: the task (prompts, reward, models and tokenizer), the arms and
the settings. The machinery is beside it: ``experiments.grpo.grpo_run`` (one GRPO
arm after another: a CSV row per step, step-level resume from tunix's checkpoints plus the
engine state), ``grpo_speed`` (arms' rollout speed side by side) and ``grpo_report``.

Task: arithmetic word problems generated from ``--seed`` ("Mia has 7 apples and gets 5
more. How many apples does Mia have now? Answer with only the number."), each asked in the
model's chat template; reward 1 when the completion's final number is exactly the answer.
Every step: ``--prompts`` problems x a group of ``--group`` samples (``--prompts 4 --group 4``
= 16 rollouts) at ``--temperature``, at most ``--max-new`` new tokens, one tunix GRPO update.
RLCluster rolls a step out in calls of ``--rollout-prompts`` prompts x the group (default 1 x 4:
a decode batch of 4, where drafting pays on a CPU; at batch 16 the default cost model makes
``budget="auto"`` take plain steps only). Every arm gets the same seed: the same problems in
the same order, the same initial policy and drafter, the same engine seed.

Outputs in ``--out``: ``<arm>.csv`` (one row per step), ``settings.json``, ``checkpoints/<arm>/``
(every ``--ckpt-every`` steps, the newest ``--ckpt-keep`` kept). Rerunning the same command
skips complete arms and continues an interrupted one (killed, crashed, or stopped by
``--stop-after K``) from its last checkpoint; other settings into the same ``--out`` are
refused.

    python -m experiments.grpo.grpo_smollm2 --out DIR --steps 60     # all arms
    python -m experiments.grpo.grpo_smollm2 --out DIR --arms ar,auto # a subset
    python -m experiments.grpo.grpo_smollm2 --report DIR             # plot + table
    python -m experiments.grpo.grpo_smollm2 --speed DIR [--policy NAME=FILE.npz]  # ar vs auto
    python -m experiments.grpo.grpo_smollm2 --out DIR --arms auto+refresh --beside-ar

``--speed`` times ``ar`` and ``auto`` rollouts of the same prompts with the same policy weights
(the initial ones, then each policy saved by ``--save-dir``) in one process, alternating, for a
load-free tokens/s comparison (run it with nothing else on the machine). Any arm named
``<arm>@bfloat16`` (``--arms auto+refresh@bfloat16 --beside-ar``, or ``--speed DIR --arms
ar,ar@bfloat16``) rolls out from a bf16 copy of the policy and drafter while the trainer and the
drafter refresh keep float32 (its ``ar`` beside it in bf16 too), ``auto`` on the bf16 calibrated
costs.
``--model tiny`` runs everything on a tiny random model (``tests/test_grpo_example.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import random
import re

import numpy as np

from experiments.grpo.grpo_report import write_report
from experiments.grpo.grpo_run import ArmSettings, run_arms
from dominotree_jax.decoding.costs import load_calibrated_costs
from experiments.grpo.grpo_speed import PRECISION_MARK, arm_precision, compare_rollout_speed

ARMS = ("ar", "auto", "auto+refresh", "auto+lookup", "auto+refresh+lookup")
TRAIN_ARMS = ARMS[:3]   # the arms a plain run trains (the +lookup ones: --arms)
LOOKUP_PATHS = 4        # +lookup arms: paths copied from the prompt and the text so far
DEFAULTS = ArmSettings(model="smollm2", steps=60, prompts=4, group=4, max_new=48,
                       temperature=0.9, lr=3e-5, beta=0.04, seed=0,
                       refresh=dict(lr=3e-4, anchors=4, rows=None,
                                    schedule={"every": True, "invest_share": 0.03}),
                       rollout_prompts=1)
FAST_XLA = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
SUFFIX = " Answer with only the number."
NAMES = ("Mia", "Tom", "Ana", "Sam", "Lea", "Ben", "Zoe", "Max")
ITEMS = ("apples", "pencils", "stickers", "marbles", "books", "cookies")


def check_arm(arm: str) -> str:
    """The arm an ``<arm>[@precision]`` name runs, refused by name when unknown."""
    base = arm.split(PRECISION_MARK, 1)[0]
    if base not in ARMS:
        raise ValueError(f"unknown arm {arm!r}: one of {ARMS}, each optionally "
                         f"{PRECISION_MARK}bfloat16")
    arm_precision(arm)
    return base


def arms_in(out: str) -> list[str]:
    """The arms with a CSV in ``out``, in ``ARMS`` order, each before its ``@precision`` twins."""
    found = [f[:-4] for f in os.listdir(out) if f.endswith(".csv")]
    arms = [a for a in found if a.split(PRECISION_MARK, 1)[0] in ARMS]
    return sorted(arms, key=lambda a: (ARMS.index(a.split(PRECISION_MARK, 1)[0]), a))


def refresh_schedule(kind: str, budget: str):
    """``drafter_refresh``'s ``schedule`` of ``--refresh-schedule`` / ``--refresh-budget``: the
    ``RefreshSchedule`` settings as a JSON-able dict (``settings.json``)."""
    return {"every": kind == "every",
            "invest_share": None if budget == "none" else float(budget)}


# ---------------------------------------------------------------------------- prompts, reward
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


def batches(seed: int, steps: int, prompts: int, as_prompt):
    """``steps`` tunix training inputs: ``prompts`` problems each (``as_prompt(question)`` is
    what the engine is given), with their answers; the same for every arm of a seed."""
    rng = random.Random(seed)
    for _ in range(steps):
        qs = [word_problem(rng) for _ in range(prompts)]
        yield {"prompts": np.array([as_prompt(q + SUFFIX) for q, _ in qs]),
               "answer": np.array([a for _, a in qs])}


def final_number(text: str) -> int | None:
    """The last integer in ``text`` (thousands commas allowed), or None."""
    found = re.findall(r"-?\d[\d,]*", text)
    if not found:
        return None
    digits = found[-1].replace(",", "")
    return int(digits) if digits.lstrip("-") else None


def rewards(prompts, completions, answer, **unused) -> list[float]:
    """tunix's reward function: 1 where a completion's final number is exactly its answer."""
    return [float(final_number(c) == int(a)) for c, a in zip(completions, answer)]


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
    ``smollm2`` (the shipped pair) or ``tiny`` (random 2-layer models, character tokenizer):
    a ``experiments.grpo.grpo_task.ArmTask``."""

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
        """``DominoTreeRollout`` keyword arguments of an arm; ``<arm>@bfloat16``: that arm with
        the engine holding a bf16 copy of the policy and drafter (the trainer and the drafter
        refresh keep float32), ``auto`` on that precision's calibrated costs."""
        precision = arm_precision(arm)
        arm = check_arm(arm)
        held = {} if precision is None else {"precision": precision}
        if arm == "ar":
            return dict(method="ar", **held)
        a = self.auto
        costs = a.auto_costs
        if precision is not None:
            costs = load_calibrated_costs(self.tcfg, self.dcfg, precision=precision)
        opts = dict(method="dominotree", budget="auto", node_topk=a.node_topk, top_m=a.top_m,
                    auto_costs=costs, auto_sizes=a.auto_sizes, **held)
        if "+refresh" in arm:
            opts["drafter_refresh"] = dict(refresh)
        if arm.endswith("+lookup"):
            opts["lookup"] = LOOKUP_PATHS
        return opts


def _chat_text(tokenizer, question: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         add_generation_prompt=True, tokenize=False)


# ---------------------------------------------------------------------------- running it
def main(arms=TRAIN_ARMS, out: str = "benchmarks/results/rl", save_dir: str | None = None,
         ckpt_every: int = 2, ckpt_keep: int = 2, stop_after: int | None = None,
         beside_ar: bool = False, **settings) -> dict:
    """Run the ``arms`` not yet complete in ``out`` (``settings``: ``ArmSettings`` fields
    other than ``DEFAULTS``'; ``beside_ar``: time an ``ar`` engine beside each drafting arm);
    returns ``{arm: its CSV rows after this run (0: skipped)}``."""
    for arm in arms:
        check_arm(arm)
    s = dataclasses.replace(DEFAULTS, **settings)
    return run_arms(lambda: Task(s.model), arms, s, out,
                    lambda task: batches(s.seed, s.steps, s.prompts, task.as_prompt), rewards,
                    save_dir, ckpt_every, ckpt_keep, stop_after, beside_ar)


def speed(out: str, model: str = "smollm2", policies=(), reps: int = 3, prompts: int = 4,
          group: int = 4, max_new: int = 48, temperature: float = 0.9, seed: int = 1234,
          rollout_prompts: int = 1, arms=("ar", "auto")) -> list[dict]:
    """``arms``' rollouts of the same ``prompts`` problems x ``group`` (rows appended to
    ``<out>/speed.csv``), for the initial policy and each ``(label, policy .npz)``."""
    task = Task(model)
    batch = next(batches(seed, 1, prompts, task.as_prompt))
    return compare_rollout_speed(task, batch, rewards, out, policies, arms, reps,
                                 group, max_new, temperature, seed, rollout_prompts)


if __name__ == "__main__":
    d = DEFAULTS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=d.model, choices=("smollm2", "tiny"))
    ap.add_argument("--arms", default=None,
                    help=f"comma-separated, of {ARMS} (default: training "
                         f"{','.join(TRAIN_ARMS)}; --speed: ar,auto)")
    ap.add_argument("--steps", type=int, default=d.steps)
    ap.add_argument("--prompts", type=int, default=d.prompts)
    ap.add_argument("--group", type=int, default=d.group)
    ap.add_argument("--rollout-prompts", type=int, default=d.rollout_prompts,
                    help="prompts per rollout call (x the group = the decode batch)")
    ap.add_argument("--max-new", type=int, default=d.max_new)
    ap.add_argument("--temperature", type=float, default=d.temperature)
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--beta", type=float, default=d.beta)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--refresh-lr", type=float, default=d.refresh["lr"])
    ap.add_argument("--refresh-anchors", type=int, default=d.refresh["anchors"])
    ap.add_argument("--refresh-schedule", default=d.refresh["schedule"],
                    choices=("adaptive", "every"),
                    help="a refresh step after every call, or when its drafter's chain τ "
                         "says so (rollout/refresh_schedule.py)")
    ap.add_argument("--refresh-budget", default="0.03",
                    help="the refresh's least share of the rollout time (its time budget; "
                         "half of what drafting saves where it does), or 'none': steps as the "
                         "schedule says (rollout/refresh_schedule.py)")
    ap.add_argument("--call-clock", action="store_true",
                    help="auto also decides from its calls' measured speed (the engine's "
                         "clock; rollout/auto_probe.py); off: the cost table alone, and reruns "
                         "with the same seeds make the same rollouts")
    ap.add_argument("--out", default="benchmarks/results/rl")
    ap.add_argument("--save-dir", default=None, help="save each arm's final policy here")
    ap.add_argument("--ckpt-every", type=int, default=2,
                    help="checkpoint (tunix + engine state) every N steps, for resuming")
    ap.add_argument("--ckpt-keep", type=int, default=2, help="keep the newest N checkpoints")
    ap.add_argument("--stop-after", type=int, default=None,
                    help="stop (checkpointed) after this train step; a rerun continues")
    ap.add_argument("--beside-ar", action="store_true",
                    help="time an ar engine on each drafting arm's rollout calls too (same "
                         "policy, prompts and keys): <arm>.csv's beside_ar_* columns")
    ap.add_argument("--report", default=None, help="write the table and plot of a results dir")
    ap.add_argument("--speed", default=None, help="ar vs auto tokens/s; rows to DIR/speed.csv")
    ap.add_argument("--policy", action="append", default=[],
                    help="--speed: LABEL=FILE.npz, a policy from --save-dir (repeatable)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if args.report:
        print(write_report(args.report, arms_in(args.report)))
    elif args.speed:
        speed(args.speed, args.model, [tuple(p.split("=", 1)) for p in args.policy],
              args.reps, args.prompts, args.group, args.max_new, args.temperature,
              rollout_prompts=args.rollout_prompts,
              arms=tuple((args.arms or "ar,auto").split(",")))
    else:
        main(tuple(a for a in (args.arms or ",".join(TRAIN_ARMS)).split(",") if a), args.out,
             args.save_dir,
             args.ckpt_every, args.ckpt_keep, args.stop_after, args.beside_ar, model=args.model,
             steps=args.steps, prompts=args.prompts, group=args.group, max_new=args.max_new,
             temperature=args.temperature, lr=args.lr, beta=args.beta, seed=args.seed,
             rollout_prompts=args.rollout_prompts, call_clock=args.call_clock,
             refresh=dict(lr=args.refresh_lr, anchors=args.refresh_anchors, rows=None,
                          schedule=refresh_schedule(args.refresh_schedule,
                                                    args.refresh_budget)))
