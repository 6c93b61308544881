"""Where a round's time goes on the device, stage by stage *inside* the one compiled round
(issue 47 item 3: stage timings that add up).

The suite times each stage as its own program, and those programs do not add up to the round
(on the H200 the verify alone took longer than a whole round: a stage jitted alone is fused,
scheduled and launched differently). Here each method's whole round, as the decode loop runs
it (``rounds.round_stage``: draft, tree, verify, accept, commit in one program; random bf16
weights at real size, ``--context`` committed slots), runs ``--rounds`` times under
``jax.profiler``. Every profiled operation (a GPU kernel: the event's ``hlo_op``) is matched to
its instruction in that compiled program, and every instruction to the stage scope it was
traced in (``decoding/stages.py``, recorded in its metadata). The stages' device times are
summed per round and set beside the round's wall time (median of ``--repeats`` unprofiled
calls); what the kernels leave of the wall time is the device idle between them (launches,
host work), shown as its own column, so a row always adds up; ``sum / wall`` says how much of
the round the stages explain (the target: within 10 %).

    python -m benchmarks gpu round_profile [--pair qwen3-4b-domino] [--methods ar dominotree]
        [--rounds 20] [--repeats 20] [--context 512] [--out FILE.md] [--tiny]

On a GPU at real size (``gpu_profile_run.sh``, which turns XLA's command buffers off: a kernel
run from a CUDA graph names the graph, not its instruction, and the report's match share would
say so); ``--tiny`` anywhere (on a CPU the operations are the executing threads' events, which
can overlap, so the sum may exceed the wall time).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax

from dominotree_jax.decoding.stages import STAGES

from benchmarks.common import RESULTS, command_line
from benchmarks.gpu.configs import add_pair_arguments, chosen_pair
from benchmarks.gpu.measure import compiled_round, prepare_pair
from benchmarks.hlo_text import instruction_stages, instructions
from benchmarks.profile_trace import (flags_line, operation_times, stage_totals,
                                      timed_and_traced)

# the columns of the report, in a round's order ("other": loop control, anything unscoped)
STAGE_COLUMNS = ("lookup", "draft", "tree", "verify", "accept", "auto", "commit", "other")


def profile_round(run, method: str, *, rounds: int, repeats: int) -> dict:
    """One method's round: wall ms (median of ``repeats`` unprofiled calls), device us per
    stage per round over ``rounds`` profiled calls, and how the events were matched."""
    config = run.configs[method]
    text, call = compiled_round(run, config)
    known = {ins.name: {"opcode": ins.opcode} for ins in instructions(text)}
    wall, events = timed_and_traced(call, repeats=repeats, traced=rounds)
    stages = stage_totals(operation_times(events, known), instruction_stages(text, STAGES),
                          rounds)
    return dict(wall_ms=statistics.median(wall), stages_us=stages,
                matched=flags_line(events, known), verify_rows=config.num_draft_nodes + 1)


def report(results: dict, *, spec_name: str, context: int, rounds: int, argv) -> str:
    device = jax.devices()[0]
    cols = [c for c in STAGE_COLUMNS if any(c in r["stages_us"] for r in results.values())]
    ar_ms = results["ar"]["wall_ms"] if "ar" in results else None
    lines = [f"# A round's stages inside the compiled round: {spec_name}", "",
             f"`{command_line('gpu', 'round_profile', argv)}`", "",
             f"{device.device_kind} ({jax.default_backend()}), jax {jax.__version__}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; context {context}, "
             f"{rounds} profiled rounds per method.", ""]
    lines += [f"- {method}: {r['matched']}" for method, r in results.items()]
    lines += ["", "ms per round: each stage's operations (device time), their sum, the wall time "
              "(unprofiled median), and idle = wall - sum (launches, host work between "
              "kernels). x AR: the round's wall time / the AR step's.", "",
              "| method | rows | " + " | ".join(cols) + " | sum | idle | wall | sum / wall "
              "| x AR |",
              "|---|---:|" + "---:|" * (len(cols) + 5)]
    for method, r in results.items():
        total_ms = sum(r["stages_us"].values()) / 1e3
        cells = " | ".join(f"{r['stages_us'].get(c, 0.0) / 1e3:.3f}" for c in cols)
        xar = f"{r['wall_ms'] / ar_ms:.2f}" if ar_ms else "-"
        lines.append(f"| {method} | {r['verify_rows']} | {cells} | {total_ms:.3f} | "
                     f"{r['wall_ms'] - total_ms:.3f} | {r['wall_ms']:.3f} | "
                     f"{total_ms / r['wall_ms']:.2f} | {xar} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods", nargs="+", default=["ar", "dominotree", "ddtree"],
                    help="methods of the pair (ar always runs first)")
    ap.add_argument("--rounds", type=int, default=20, help="rounds profiled per method")
    ap.add_argument("--repeats", type=int, default=20, help="unprofiled rounds timed")
    add_pair_arguments(ap, RESULTS / "gpu" / "round_profile.md")
    args = ap.parse_args(argv)
    spec, context = chosen_pair(ap, args)
    unknown = [m for m in args.methods if m != "ar" and m not in spec.methods]
    if unknown:
        ap.error(f"{spec.name} has no method {unknown}; it has {('ar',) + spec.methods}")
    if args.rounds < 1 or args.repeats < 1:
        ap.error("--rounds and --repeats must be >= 1")
    run = prepare_pair(spec, context=context, max_new_tokens=max(32, args.rounds),
                       repeats=args.repeats, inner=1, use_pallas=False)
    methods = ["ar"] + [m for m in dict.fromkeys(args.methods) if m != "ar"]
    results = {}
    for method in methods:
        results[method] = profile_round(run, method, rounds=args.rounds, repeats=args.repeats)
        text = report(results, spec_name=spec.name, context=context, rounds=args.rounds,
                      argv=argv)
        with open(args.out, "w") as f:   # after every method: a killed call keeps the rest
            f.write(text)
    print(text)
