"""Where the AR step's time goes on the device (issue 47 item 3): a profile of one pair's AR
step, kernel by kernel, against the bandwidth roof.

The pair's AR step, as the suite times it (the ``ar`` round: a one-row verify, argmax, commit;
random bf16 weights at real size, ``--context`` committed slots), runs ``--steps`` times under
``jax.profiler``. Each profiled operation is matched to its instruction in the compiled program
(by the event's ``hlo_op``, which XLA's CPU and GPU events carry) and its time per step
is set beside the bytes that instruction names: its operands' and its result's sizes, an upper
bound of what it reads and writes (a slice reads less than its operand). The table lists the
instructions by time, with the achieved GB/s of each; the summary sets the kernels' total and
the step's wall time beside the roof (the weights and the live cache read once at the device's
peak bandwidth, ``configs.peak_bandwidth``).

    python -m benchmarks gpu ar_profile [--pair qwen3-4b-domino] [--steps 20] [--context 512]
        [--top 30] [--out FILE.md] [--tiny]

On a GPU at real size (the prepared device run); ``--tiny`` anywhere (the CPU's own operations).
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import time

import jax

from benchmarks.common import RESULTS, command_line
from benchmarks.gpu.configs import add_pair_arguments, chosen_pair, peak_bandwidth
from benchmarks.gpu.measure import ar_bytes, compiled_round, prepare_pair
from benchmarks.hlo_text import instructions as hlo_text_instructions
from benchmarks.profile_trace import flags_line, operation_times, timed_and_traced

_ARRAY = re.compile(r"\b(pred|[a-z]+\d+(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
             "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape text (an array ``f32[3,4]{1,0}`` or a tuple of them); 8-bit
    floats count 1 byte."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _ITEMSIZE.get(dtype, 1)
    return total


def instructions(hlo_text: str) -> dict[str, dict]:
    """``{name: {opcode, kind, bytes}}`` of a compiled module's instructions: ``bytes`` = the
    result's size + each operand's; ``kind`` = the opcode, or a custom call's target."""
    rows = hlo_text_instructions(hlo_text)
    shapes = {ins.name: shape_bytes(ins.shape) for ins in rows}
    out = {}
    for ins in rows:
        target = _TARGET.search(ins.rest)
        out[ins.name] = dict(opcode=ins.opcode, kind=target.group(1) if target else ins.opcode,
                             bytes=shapes[ins.name] + sum(shapes.get(a, 0)
                                                          for a in ins.operands))
    return out


def profile_rows(times: dict[str, list[float]], known: dict[str, dict], steps: int) -> list:
    rows = []
    for name, durs in times.items():
        us = sum(durs) / steps
        calls = len(durs) / steps
        moved = known[name]["bytes"] * calls
        rows.append(dict(name=name, kind=known[name]["kind"], calls=calls, us=us,
                         bytes=moved, gbps=moved / (us * 1e3) if us > 0 else 0.0))
    return sorted(rows, key=lambda r: -r["us"])


def profile_ar_step(spec, *, context: int, steps: int, repeats: int) -> dict:
    """The AR step's wall time (median of ``repeats``), its compiled program's instructions and
    their profiled time per step over ``steps`` steps."""
    run = prepare_pair(spec, context=context, max_new_tokens=max(32, steps), repeats=repeats,
                       inner=1, use_pallas=False)
    text, call = compiled_round(run, run.configs["ar"])
    known = instructions(text)
    wall, events = timed_and_traced(call, repeats=repeats, traced=steps)
    rows = profile_rows(operation_times(events, known), known, steps)
    return dict(rows=rows, step_ms=statistics.median(wall), matched=flags_line(events, known),
                roof_bytes=ar_bytes(spec, context), instructions=len(known))


def report(result: dict, *, spec_name: str, context: int, steps: int, top: int, argv) -> str:
    device = jax.devices()[0]
    peak = peak_bandwidth(device.device_kind)
    rows = result["rows"]
    kernel_us = sum(r["us"] for r in rows)
    named = sum(r["bytes"] for r in rows)
    roof_ms = result["roof_bytes"] / peak * 1e3 if peak else None
    lines = [f"# The AR step, kernel by kernel: {spec_name}", "",
             f"`{command_line('gpu', 'ar_profile', argv)}`", "",
             f"{device.device_kind} ({jax.default_backend()}), jax {jax.__version__}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; context {context}, "
             f"{steps} profiled steps.", "",
             f"- step (wall, unprofiled, median): {result['step_ms']:.3f} ms; profiled "
             f"operations: {kernel_us / 1e3:.3f} ms a step in {len(rows)} instructions (of "
             f"{result['instructions']} in the program)",
             f"- {result['matched']}",
             f"- bytes a step must read (weights + live cache): "
             f"{result['roof_bytes'] / 1e9:.4g} GB"
             + (f"; at {peak / 1e12:.2f} TB/s that is {roof_ms:.3f} ms: the step runs at "
                f"{100 * roof_ms / result['step_ms']:.0f} % of the roof" if peak else
                " (device peak unknown)"),
             f"- bytes the profiled instructions name (operands + results, an upper bound): "
             f"{named / 1e9:.4g} GB a step", "",
             "| instruction | kind | calls / step | us / step | share | MB / step | GB/s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows[:top]:
        lines.append(f"| {r['name']} | {r['kind']} | {r['calls']:.0f} | {r['us']:.1f} | "
                     f"{100 * r['us'] / kernel_us:.1f} % | {r['bytes'] / 1e6:.2f} | "
                     f"{r['gbps']:.0f} |")
    rest = rows[top:]
    if rest:
        us = sum(r["us"] for r in rest)
        lines.append(f"| ({len(rest)} more) | | | {us:.1f} | {100 * us / kernel_us:.1f} % | "
                     f"{sum(r['bytes'] for r in rest) / 1e6:.2f} | |")
    kinds = collections.Counter()
    for r in rows:
        kinds[r["kind"]] += r["us"]
    lines += ["", "By kind: " + "; ".join(f"{k} {us / 1e3:.3f} ms ({100 * us / kernel_us:.0f} %)"
                                          for k, us in kinds.most_common())]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="AR steps profiled")
    ap.add_argument("--repeats", type=int, default=20, help="unprofiled steps timed")
    ap.add_argument("--top", type=int, default=30, help="instructions listed")
    add_pair_arguments(ap, RESULTS / "gpu" / "ar_profile.md")
    args = ap.parse_args(argv)
    spec, context = chosen_pair(ap, args)
    if args.steps < 1 or args.repeats < 1:
        ap.error("--steps and --repeats must be >= 1")
    result = profile_ar_step(spec, context=context, steps=args.steps, repeats=args.repeats)
    text = report(result, spec_name=spec.name, context=context, steps=args.steps,
                  top=args.top, argv=argv)
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
