"""Timing helpers shared by the benchmarks and the cost calibration, and the machine facts
named next to every timing (the CPU model, its bf16 matrix units)."""

from __future__ import annotations

import platform
import random
import statistics
import time

import jax


def interleaved_medians(fns: dict, repeats: int, inner: int = 1,
                        warmup: int = 2) -> dict[str, float]:
    """Median time (ms) per call of each ``fns[name]()`` (which returns arrays to wait for,
    or blocks itself and returns None).

    One sample is ``inner`` calls dispatched back to back, then one wait, divided by ``inner``:
    on a GPU, Python dispatch then overlaps with the device, as in the decode loop. Samples are
    interleaved over ``fns`` so that drifting load or clocks hit all of them alike, each pass in
    its own seeded order: in one fixed order the first function of every pass measured 20x its
    identically shaped twin (``q`` vs ``o`` at one row on a Zen 5 EPYC,
    ``benchmarks/results/precision/methods_zen5``), so no function keeps one place or one
    predecessor.
    """
    for _ in range(warmup):
        for fn in fns.values():
            jax.block_until_ready(fn())
    times = {name: [] for name in fns}
    names = list(fns)
    order = random.Random(0)
    for _ in range(repeats):
        order.shuffle(names)
        for name in names:
            fn = fns[name]
            t0 = time.perf_counter()
            for _ in range(inner):
                result = fn()
            jax.block_until_ready(result)
            times[name].append((time.perf_counter() - t0) / inner)
    return {name: 1e3 * statistics.median(ts) for name, ts in times.items()}


def _cpuinfo() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name (``/proc/cpuinfo``, or the text ``cpuinfo``), for naming the
    machine next to a timing."""
    text = _cpuinfo() if cpuinfo is None else cpuinfo
    for line in (text or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


BF16_UNIT_FLAGS = ("amx_bf16", "avx512_bf16")


def bf16_units(cpuinfo: str | None = None) -> str:
    """The CPU's bf16 matrix-unit flags (``amx_bf16``, ``avx512_bf16``) as one phrase: bf16
    products only beat float32 on a CPU that has one (docs/precision.md)."""
    text = _cpuinfo() if cpuinfo is None else cpuinfo
    if text is None:
        return "unknown"
    flags = set(text.split())
    have = [f for f in BF16_UNIT_FLAGS if f in flags]
    return ", ".join(have) if have else "none (no amx_bf16, no avx512_bf16)"
