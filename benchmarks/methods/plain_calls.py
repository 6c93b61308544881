"""What a rollout call costs when ``budget="auto"`` does not draft: the tunix engine at the GRPO
example's shape (SmolLM2 + the shipped drafter, one word problem x 4 samples a call, T 0.9, at
most 48 tokens), side by side in one process, every prompt decoded by every arm in turn with the
same key; the ``auto`` arms' states are set each call to a policy that does not draft (delivered
rate 0, no probe due), as in rollouts whose drafter does not pay.

    python -m benchmarks methods plain_calls --prompts 6 --reps 3 [--precision bfloat16]

Arms: ``ar``; ``ar`` with the drafter's features (what a plain call runs when the refresh is
on); ``auto``'s drafting program that does not draft (``plain_calls=False``); ``auto`` with
plain calls (``auto_probe``); the lookup-only program a ``lookup=4`` plain call runs
(``method="lookup"``, paths of 8). Prints tokens/s per rep and, per arm, tokens/s over all
timed calls, its ratio to ``ar`` and the median per-call ratio. Uses ``DOMINOTREE_JAX_COSTS``
(this host's calibrated costs) when set, as the GRPO example does. Pause other CPU work.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import random

import numpy as np

from dominotree_jax.measure.timing import cpu_model

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "grpo_smollm2.py")


def _example():
    spec = importlib.util.spec_from_file_location("grpo_smollm2", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3, help="timed reps after a compiling one")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--precision", default=None, choices=("bfloat16",),
                    help="every engine holds a copy of the weights in this precision (the "
                         "GRPO example's <arm>@bfloat16); default: float32")
    args = ap.parse_args(argv)

    from dominotree_jax.rollout import DominoTreeRollout, TunixCausalLM
    from dominotree_jax.rollout.grpo_task import sampling_config

    grpo = _example()
    task = grpo.Task("smollm2")
    rng = random.Random(args.seed)
    texts = [task.as_prompt(grpo.word_problem(rng)[0] + grpo.SUFFIX)
             for _ in range(args.prompts)]
    rc = sampling_config(task, 48, 0.9)
    auto = task.engine_options("auto" if args.precision is None else f"auto@{args.precision}",
                               {})
    held = {} if args.precision is None else {"precision": args.precision}

    def engine(**kw):
        return DominoTreeRollout(
            rollout_actor=TunixCausalLM.from_params(task.tcfg, task.tparams, task.pad_id),
            tokenizer=task.tokenizer, drafter_config=task.dcfg, drafter_params=task.dparams,
            **{**held, **kw})

    arms = {"ar": engine(method="ar"),
            "ar + features": engine(method="ar", return_features=True),
            "auto, drafting program": engine(plain_calls=False, return_features=True, **auto),
            "auto, plain calls": engine(return_features=True, **auto),
            "lookup-only program": engine(method="lookup", budget="auto", lookup=4,
                                          lookup_length=8, return_features=True,
                                          auto_costs=auto["auto_costs"])}
    not_drafting = ("auto, drafting program", "auto, plain calls")
    seconds = {a: [] for a in arms}
    tokens = {a: [] for a in arms}
    print(f"# {cpu_model()}; {args.prompts} prompts x 4 samples, T 0.9, <= 48 tokens, "
          f"{args.precision or 'float32'}")
    for rep in range(args.reps + 1):
        names = list(arms)
        order = names[rep % len(names):] + names[:rep % len(names)]
        for p, text in enumerate(texts):
            for name in order:
                eng = arms[name]
                if name in not_drafting:   # a policy that does not draft
                    for key, st in list(eng.auto_probe.states.items()):
                        eng.auto_probe.states[key] = st._replace(
                            rate=np.float32(0.0), since=np.int32(0), gap=np.int32(10 ** 6))
                eng.generate([text] * 4, dataclasses.replace(rc, seed=1000 * rep + p))
                if rep:
                    seconds[name].append(eng.last.seconds)
                    tokens[name].append(eng.last.num_tokens)
        if rep:
            print(f"rep {rep}: " + ", ".join(
                f"{a} {sum(tokens[a]) / sum(seconds[a]):.1f}" for a in arms), flush=True)
    rate = {a: sum(tokens[a]) / sum(seconds[a]) for a in arms}
    per_call = {a: [t / s / (ta / sa) for t, s, ta, sa in
                    zip(tokens[a], seconds[a], tokens["ar"], seconds["ar"])] for a in arms}
    print("| arm | tok/s | x ar (totals) | x ar (median per call) |\n|---|---:|---:|---:|")
    for a in arms:
        print(f"| {a} | {rate[a]:.1f} | {rate[a] / rate['ar']:.3f} | "
              f"{np.median(per_call[a]):.3f} |")
    print("plain calls:", {a: arms[a].last.plain for a in not_drafting},
          "compilations:", {a: e.num_compilations for a, e in arms.items()})
