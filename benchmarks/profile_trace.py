"""Reading a ``jax.profiler`` trace: each profiled operation's time, by the instruction of the
compiled program it ran (``gpu ar_profile``, ``gpu round_profile``)."""

from __future__ import annotations

import collections
import glob
import gzip
import json

from benchmarks.hlo_text import CONTAINERS


def trace_events(log_dir: str) -> list[dict]:
    """The events of the one ``*.trace.json.gz`` a ``jax.profiler.trace(log_dir)`` wrote."""
    (path,) = glob.glob(f"{log_dir}/**/*.trace.json.gz", recursive=True)
    with gzip.open(path) as f:
        return json.load(f)["traceEvents"]


def operation_times(events: list[dict], known: dict[str, dict]) -> dict[str, list[float]]:
    """Microseconds of each profiled operation of the program, by instruction name: the
    events that name their instruction in ``args.hlo_op`` (XLA's operation events, a GPU's
    kernels); where none does, the events named as an instruction. ``known``: the program's
    instructions, ``{name: {"opcode": ..., ...}}``; containers (loops, branches) are left out,
    their events span their bodies' operations."""
    out = collections.defaultdict(list)
    for name, dur in _matched(events):
        if name in known and known[name]["opcode"] not in CONTAINERS:
            out[name].append(dur)
    return dict(out)


def matched_by(events: list[dict]) -> str:
    """How ``operation_times`` reads these events (for the report)."""
    return ("events' hlo_op" if any("hlo_op" in e.get("args", {}) for e in events)
            else "event names")


def _matched(events: list[dict]):
    """``(instruction, us)`` per event; where the trace has device processes (a GPU's
    ``/device:...`` streams), only their events (host-side launch events may name the same
    instructions)."""
    device_pids = {e.get("pid") for e in events if e.get("ph") == "M"
                   and e.get("name") == "process_name"
                   and str(e.get("args", {}).get("name", "")).startswith("/device:")}
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e
             and (not device_pids or e.get("pid") in device_pids)]
    device = [e for e in spans if "hlo_op" in e.get("args", {})]
    for e in device or spans:
        yield (e["args"]["hlo_op"] if device else e["name"]), float(e["dur"])
