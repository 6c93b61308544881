"""Reading a ``jax.profiler`` trace: each profiled operation's time, by the instruction of the
compiled program it ran, and by stage (``gpu ar_profile``, ``gpu round_profile``, ``round
inside``)."""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os

from benchmarks.hlo_text import CONTAINERS


def timed_and_traced(call, *, repeats: int, traced: int) -> tuple[list[float], list[dict]]:
    """``call`` (zero arguments, returns an array) once untimed, then ``repeats`` calls each
    timed alone (wall ms), then ``traced`` calls under ``jax.profiler``: ``(ms, events)``."""
    import tempfile
    import time

    import jax
    jax.block_until_ready(call())   # the first run's setup, untimed
    wall = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(call())
        wall.append(1e3 * (time.perf_counter() - t))
    with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir):
            for _ in range(traced):
                out = call()
            jax.block_until_ready(out)
        events = trace_events(log_dir)
    return wall, events


def trace_events(log_dir: str) -> list[dict]:
    """The trace events (Chrome trace format) a ``jax.profiler.trace(log_dir)`` wrote: its
    ``*.trace.json.gz`` where there is one (jax 0.10 writes it beside the ``*.xplane.pb``),
    else read from the ``*.xplane.pb`` itself (``xplane_events``)."""
    found = glob.glob(f"{log_dir}/**/*.trace.json.gz", recursive=True)
    if len(found) > 1:
        raise ValueError(f"{log_dir} holds {len(found)} traces; profile into an empty folder")
    if found:
        with gzip.open(found[0]) as f:
            return json.load(f)["traceEvents"]
    planes = glob.glob(f"{log_dir}/**/*.xplane.pb", recursive=True)
    if len(planes) != 1:
        raise ValueError(f"{log_dir} holds {len(planes)} profiles (*.xplane.pb), not one")
    return xplane_events(planes[0])


def xplane_events(path: str) -> list[dict]:
    """A ``*.xplane.pb`` profile as trace events: each plane a process (its ``process_name``
    the plane's name, e.g. ``/device:GPU:0``), each event a complete span (``ph`` "X") whose
    ``args`` are its stats (``hlo_op``, ...); durations in microseconds."""
    from jax.profiler import ProfileData
    events = []
    for pid, plane in enumerate(ProfileData.from_file(path).planes):
        events.append(dict(ph="M", name="process_name", pid=pid, args={"name": plane.name}))
        for tid, line in enumerate(plane.lines):
            for ev in line.events:
                events.append(dict(ph="X", pid=pid, tid=tid, name=ev.name,
                                   dur=ev.duration_ns * 1e-3,
                                   args={k: str(v) for k, v in ev.stats}))
    return events


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


def stage_totals(times: dict[str, list[float]], stage_of: dict[str, str | None],
                 rounds: int) -> dict[str, float]:
    """Microseconds per round of each stage: the operations' times (``{instruction: [us]}``,
    ``operation_times``) summed by the stage of their instruction (``{instruction: stage}``,
    ``hlo_text.instruction_stages``; ``None``: no stage), over ``rounds`` profiled rounds."""
    out: dict[str, float] = collections.defaultdict(float)
    for name, durs in times.items():
        stage = stage_of.get(name)
        if stage:
            out[stage] += sum(durs) / rounds
    return dict(out)


def matched_share(events: list[dict], known: dict[str, dict]) -> float | None:
    """The share of the profiled operations' time (the events ``operation_times`` reads) that
    names a known instruction of the program, containers left out. On a GPU, kernels run from a
    command buffer (a CUDA graph; XLA's default) name the buffer, not their instruction: such a
    profile matches little (run it with ``XLA_FLAGS=--xla_gpu_enable_command_buffer=``).
    ``None`` without events."""
    total = matched = 0.0
    for name, dur in _matched(events):
        if name in known and known[name]["opcode"] in CONTAINERS:
            continue   # a loop's or branch's own span covers its body's operations
        total += dur
        if name in known:
            matched += dur
    return matched / total if total > 0 else None


def matched_by(events: list[dict]) -> str:
    """How ``operation_times`` reads these events (for the report)."""
    return ("events' hlo_op" if any("hlo_op" in e.get("args", {}) for e in events)
            else "event names")


def flags_line(events: list[dict], known: dict[str, dict]) -> str:
    """A report's line: how the events were matched, the share matched, and ``XLA_FLAGS``."""
    share = matched_share(events, known)
    return (f"matched by {matched_by(events)}: "
            f"{'no events' if share is None else f'{100 * share:.0f} %'} of the profiled "
            f"operations' time names an instruction; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")


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
