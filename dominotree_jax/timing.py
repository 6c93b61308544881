"""Timing helper shared by the benchmarks and the cost calibration."""

from __future__ import annotations

import platform
import statistics
import time

import jax


def interleaved_medians(fns: dict, repeats: int, inner: int = 1,
                        warmup: int = 2) -> dict[str, float]:
    """Median time (ms) per call of each ``fns[name]()`` (which returns arrays to wait for,
    or blocks itself and returns None).

    One sample is ``inner`` calls dispatched back to back, then one wait, divided by ``inner``:
    on a GPU, Python dispatch then overlaps with the device, as in the decode loop. Samples are
    interleaved round-robin over ``fns`` so that drifting load or clocks hit all of them alike.
    """
    for _ in range(warmup):
        for fn in fns.values():
            jax.block_until_ready(fn())
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                result = fn()
            jax.block_until_ready(result)
            times[name].append((time.perf_counter() - t0) / inner)
    return {name: 1e3 * statistics.median(ts) for name, ts in times.items()}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), for naming the machine next to a timing."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
