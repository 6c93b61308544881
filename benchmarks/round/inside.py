"""Where a round's time goes *inside* the one compiled ``decode`` program, per method.

``decode`` wraps each stage of a round in a named scope (``decoding/stages.py``: draft, tree,
verify, accept, auto, commit, lookup; prefill outside the loop), recorded in every compiled
operation's metadata. This runs a real decode (SmolLM2-135M pair, batch 1, real prompts) under
``jax.profiler``, maps each profiled operation back to its HLO instruction and so to its stage,
and sums the operations' time per stage: the stages of the fused round, as it runs, with the
fusion and scheduling XLA gives them there (``round stages`` times each stage as its own
program instead). Loop control and anything outside a scope is "other".

Time per round = the stage's summed operation time / rounds; "x AR" divides by the ``ar``
step's summed time measured the same way. Operation time is CPU time on the executing threads
(an operation split over threads counts each part), so the per-round sums can exceed the
round's wall time; the wall time per round is shown beside them.

    python -m benchmarks round inside [--methods ar dominotree ...] [--tokens 64]
        [--prompts 2] [--precision float32] [--drafter DIR] [--budget 16]
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time

from benchmarks.common import command_line
from benchmarks.hlo_text import instruction_stages, instructions
from benchmarks.profile_trace import operation_times, stage_totals, trace_events


def profile_method(pair, method: str, prompts, *, tokens: int, budget: int):
    """``(stage seconds per round, wall seconds per round, mean tau)`` of ``method``."""
    import jax
    import jax.numpy as jnp

    from dominotree_jax.decoding.decode import decode
    from dominotree_jax.decoding.stages import STAGES
    cfg = pair.config(method, max_new_tokens=tokens, budget=budget, stop_ids=())
    fn = jax.jit(lambda p, x: decode(p, x, config=cfg))
    totals: dict[str, float] = collections.defaultdict(float)
    rounds = wall = committed = 0.0
    for ids in prompts:
        x = jnp.asarray(ids, jnp.int32)[None]
        # one compile per prompt shape; its own instruction names map its profile
        program = fn.lower(pair.params, x).compile()
        text = program.as_text()
        known = {ins.name: {"opcode": ins.opcode} for ins in instructions(text)}
        jax.block_until_ready(program(pair.params, x))     # warm
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            with jax.profiler.trace(d):
                out = jax.block_until_ready(program(pair.params, x))
            wall += time.perf_counter() - t0
            events = trace_events(d)
        stages = stage_totals(operation_times(events, known),
                              instruction_stages(text, STAGES), rounds=1)
        for k, us in stages.items():
            totals[k] += us * 1e-6
        rounds += float(out.num_rounds[0])
        committed += float(out.num_tokens[0])
    per_round = {k: v / rounds for k, v in totals.items() if k != "prefill"}
    return per_round, wall / rounds, committed / rounds


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=["ar", "dflash", "domino", "ddtree",
                                                      "dominotree"])
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    ap.add_argument("--prompts", type=int, default=2, help="HumanEval prompts")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--drafter", default=None)
    from dominotree_jax.precision import add_precision_argument
    add_precision_argument(ap)
    args = ap.parse_args(argv)
    import jax

    from dominotree_jax.measure import eval_prompts
    from dominotree_jax.measure.default_pair import load_models, usable_methods
    from dominotree_jax.measure.timing import cpu_model
    pair, _, dname = load_models(drafter=args.drafter, precision=args.precision)
    methods = usable_methods(args.methods, pair.drafter_config)
    prompts = [pair.target.chat_prompt(t) for t in eval_prompts.humaneval(args.prompts)]
    res = {m: profile_method(pair, m, prompts, tokens=args.tokens, budget=args.budget)
           for m in methods}
    ar = sum(res["ar"][0].values()) if "ar" in res else None
    stages = ["draft", "tree", "lookup", "verify", "accept", "auto", "commit", "other"]
    stages = [s for s in stages if any(s in r[0] for r in res.values())]
    print(f"Stage times inside the fused round, {cpu_model()}, jax {jax.__version__}, "
          f"{args.precision}, drafter {dname}, batch 1, {len(prompts)} HumanEval prompts x "
          f"{args.tokens} tokens, budget {args.budget}, "
          f"{time.strftime('%Y-%m-%d', time.gmtime())}; "
          f"`{command_line('round', 'inside', argv)}`\n")
    print("ms per round (x AR = / the ar step's total)\n")
    print("| method | tau | wall ms/round | " + " | ".join(stages) + " | total | x AR |")
    print("|---|---:|---:|" + "---:|" * (len(stages) + 2))
    for m, (per, wall, tau) in res.items():
        total = sum(per.values())
        cells = " | ".join(f"{1e3 * per.get(s, 0.0):.2f}" for s in stages)
        xar = f"{total / ar:.2f}" if ar else "-"
        print(f"| {m} | {tau:.2f} | {1e3 * wall:.1f} | {cells} | {1e3 * total:.1f} | {xar} |")
