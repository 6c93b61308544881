"""GRPO-shaped rollouts drafted from lookup sources, against ``ar``: the same prompts (``steps``
batches of ``prompts`` problems × a group of ``group`` samples), policy and sampling keys per
arm, the same batches again each epoch (as a GRPO run meets its prompts again), arms in turn in
one process. The policy stays fixed, so an epoch's history is from the same policy: an upper
bound of what a moving policy's history gives.

    python -m experiments.grpo.lookup_sources --epochs 3 --steps 4 --new 48 \
        --out benchmarks/results/rl/lookup_sources.json

Arms: ``ar``; ``lookup`` (``method="lookup"``, ``budget="auto"`` or ``--budget N`` nodes every
round, K = 4 paths from the row's own text); ``lookup+group`` (``lookup_group=group``);
``lookup+group+history`` (and ``lookup_history=4``). Per epoch and arm: τ (tokens per target
forward), seconds, and the ratio of ``ar``'s seconds to the arm's (the first epoch holds the
compilations: read epochs >= 2).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np

ARMS = {"ar": dict(method="ar"),
        "lookup": dict(method="lookup", budget="auto", lookup=4),
        "lookup+group": dict(method="lookup", budget="auto", lookup=4, lookup_group=True),
        "lookup+group+history": dict(method="lookup", budget="auto", lookup=4,
                                     lookup_group=True, lookup_history=4)}


def arm_options(arm: str, group: int, budget="auto") -> dict:
    """An arm's engine settings: its lookup group of ``group`` rows, and ``budget`` (``"auto"``,
    or N lookup nodes verified every round)."""
    opts = dict(ARMS[arm])
    if opts.get("lookup_group") is True:
        opts["lookup_group"] = group
    if "budget" in opts:
        opts["budget"] = budget
    return opts


def run(task, arms, *, epochs: int, steps: int, prompts: int, group: int, new: int,
        temperature: float, seed: int, budget="auto", log=print) -> dict:
    from dominotree_jax.rollout.tunix_engine import DominoTreeRollout
    from dominotree_jax.rollout.tunix_model import TunixCausalLM
    from experiments.grpo.grpo_smollm2 import batches
    from experiments.grpo.grpo_task import sampling_config

    rc = sampling_config(task, new, temperature)
    data = [list(np.repeat(b["prompts"], group))
            for b in batches(seed, steps, prompts, task.as_prompt)]
    engines = {arm: DominoTreeRollout(
        rollout_actor=TunixCausalLM.from_params(task.tcfg, task.tparams, task.pad_id),
        tokenizer=task.tokenizer, drafter_config=task.dcfg, drafter_params=task.dparams,
        seed=seed, compiler_options=task.compiler_options, prompt_pads="keep",
        **arm_options(arm, group, budget)) for arm in arms}
    rows = []
    for epoch in range(epochs):
        totals = {arm: {"seconds": 0.0, "tokens": 0, "rounds": 0} for arm in arms}
        for batch in data:
            for arm, eng in engines.items():   # arms in turn, the same prompts and keys
                t0 = time.perf_counter()
                eng.generate(batch, rc)
                t = totals[arm]
                t["seconds"] += time.perf_counter() - t0
                t["tokens"] += eng.last.num_tokens
                t["rounds"] += int(np.asarray(eng.last.out.num_rounds).sum())
        for arm, t in totals.items():
            row = {"epoch": epoch, "arm": arm, "seconds": round(t["seconds"], 3),
                   "tau": round(t["tokens"] / max(t["rounds"], 1), 3),
                   "over_ar": round(totals["ar"]["seconds"] / t["seconds"], 3)
                   if "ar" in totals else None}
            rows.append(row)
            log(json.dumps(row))
    return {"rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.grpo.lookup_sources",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--new", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", default="auto",
                   help="the lookup arms' budget: auto, or N nodes verified every round")
    p.add_argument("--out", default=None, help="a JSON file for the rows and the settings")
    args = p.parse_args(argv)
    arms = args.arms.split(",")
    bad = [a for a in arms if a not in ARMS]
    if bad or "ar" not in arms:
        p.error(f"--arms must name ar and any of {list(ARMS)}; got {arms}")
    from experiments.grpo.grpo_smollm2 import Task
    result = run(Task(args.model), arms, epochs=args.epochs, steps=args.steps,
                 prompts=args.prompts, group=args.group, new=args.new,
                 temperature=args.temperature, seed=args.seed,
                 budget=args.budget if args.budget == "auto" else int(args.budget))
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    result["settings"] = {**vars(args), "cpu": cpu,
                          "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                          "command": "python -m experiments.grpo.lookup_sources "
                                     + " ".join(sys.argv[1:] if argv is None else argv)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
