"""GPU suite: is the Pallas kernel right on this GPU, and how long does a round take at real size?

One-shot: built to get every number it can out of a single ~10-minute call on a lent GPU.

    python -m benchmarks gpu suite --deadline 500     # on a GPU: real sizes, bf16, random weights
    python -m benchmarks gpu suite --tiny              # anywhere (CPU: Pallas in interpret mode)

The prepared command for one 10-minute call on a lent H200 is ``bash
benchmarks/gpu_device_run.sh`` (``benchmarks/README.md``): the image's own python3 and jax, no
wheels to carry, 6 files under ``$OUT`` (nvidia-smi, versions, this report's .md and .json, the
suite's stdout and stderr), the Qwen3-4B + Domino pair first. Its suite call is:

    python3 -m benchmarks gpu suite --deadline 500 --reserve 60 --compile-cache /tmp/jax_cache \\
        --pairs qwen3-4b-domino,qwen3-8b-domino --kernel-variants 4x1,8x1,4x2 \\
        --out $OUT/gpu_suite.md

What it measures, in this order (the report, markdown at ``--out`` and JSON beside it, is
rewritten after every method, so a run cut short keeps what it measured):

1. Environment: jax / jaxlib / flax versions, device kind, compute capability, platform version,
   ``XLA_FLAGS`` and the ``JAX_*`` / ``XLA_*`` environment, the switches below.
2. Kernel check (``--skip-kernel`` to leave out): the Pallas top-M expansion
   (``pallas_kernels/topm_expand.py``) against its jnp twin (``domino_head.expand_split_jnp``)
   at each pair's Domino-head shapes: identical indices and log-probs within 1e-5, the time of
   one pop with each, ``build_tree`` with vs without the kernel (identical trees, time per
   tree), and on a GPU the pop time of each Triton launch variant (``--kernel-variants``,
   ``num_warps x num_stages``). On a CPU the kernel runs in interpret mode. The first pair's
   head shapes are checked before any pair (``--tree-kernel auto`` takes the kernel only if
   that check passed); the other shapes (other pairs, the SmolLM2-135M drafter) after the pairs.
3. Per pair (``--pairs``, default Qwen3-4B + Domino-b16 first, then Qwen3-8B + Domino-b16;
   Qwen3-4B + DFlash-b16 on request), random bf16 weights drawn on the device, batch 1,
   ``--context`` committed tokens:
   a. every method's whole round (one jitted function) timed side by side with the AR step
      (the ``ar`` round: a one-row verify, argmax, commit), one method at a time;
   b. then (``--stages all``, the default) every method's stages: draft (drafter block forward,
      LM head included), build (chain or tree and its verify mask), verify (target forward over
      the draft rows), accept/commit (argmax, acceptance walk, cache compaction, drafter-context
      extend, output write).
   The table puts next to each method: our round / AR step, the paper-implied round / AR step
   (published tau / published speedup; Qwen3-4B only: 1.52 / 1.62 / 1.56 / 1.66 for DFlash /
   Domino / DDTree / DominoTree), the speedup our round would give at the published tau, the
   build share of the round (paper: 3.67 of 26.54 ms, 14%), the compiled round programs (at
   most 1) and the AR step's achieved bandwidth (weights + live cache read per step) as a share
   of the device's peak (``--peak-gbps`` or a table of known devices: H200 4.8 TB/s).

One-shot safety:
- each method (and each kernel check) runs isolated: an exception is recorded with its
  traceback in the report and the next method runs;
- ``--deadline`` (seconds from the start, or a UTC time ``HH:MM[:SS]`` / ISO) stops compiling
  new programs ``--reserve`` seconds before it: what is not started is marked "skipped
  (deadline)", and the report holds everything measured;
- ``--tree-kernel {auto,pallas,jnp}`` (auto: the Pallas kernel where it compiles, CUDA compute
  capability >= 8.0, and only if the kernel check passed) and ``--attention
  {auto,bucket,dense}`` (``TargetConfig.attention_impl``; auto = one dense masked pass over the
  cache on a GPU, buckets on a CPU) choose the paths;
- ``--merge`` keeps the methods of an existing report (same device) that this run does not
  redo; ``--compile-cache DIR`` lets a rerun on the same machine skip compiles.

Random weights do not change any stage's cost: every shape is static (the tree always pops
``budget`` nodes, the acceptance walk always takes ``max_depth`` steps), so a round costs the
same whatever the weights draft. Caches are zero-filled with ``--context`` committed slots
(a prefill would add nothing but a compile). Each time is the median of ``--repeats`` samples
after warm-up, interleaved round-robin; a sample is ``--inner`` calls dispatched back to back and
one wait, per call (Python dispatch overlaps with the GPU, as in the jitted decode loop).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import functools
import json
import sys
import time
from pathlib import Path

import jax

from benchmarks.common import RESULTS, command_line
from benchmarks.gpu import control, kernel
from benchmarks.gpu.configs import DEFAULT_PAIRS, METHODS, peak_bandwidth, real_pairs, tiny_pairs
from benchmarks.gpu.measure import ar_bytes, measure_pair, pair_entry
from benchmarks.gpu.report import (
    bandwidth_line, device_line, environment, kernel_table, merge_into, overall, pair_table,
    verdict, write_report,
)

DEFAULT_OUT = RESULTS / "gpu_suite.md"
DEFAULT_TINY_OUT = RESULTS / "gpu_suite_tiny.md"
TREE_KERNEL_MODES = ("auto", "pallas", "jnp")
ATTENTION_MODES = ("auto", "bucket", "dense")


def parse_variants(text: str) -> tuple[tuple[int, int], ...]:
    try:
        out = tuple(tuple(int(n) for n in v.split("x")) for v in text.split(",") if v)
    except ValueError:
        out = ((),)
    if not out or any(len(v) != 2 or min(v) < 1 for v in out):
        raise ValueError(f"--kernel-variants {text!r}: give WARPSxSTAGES,... e.g. 4x1,8x2")
    return out


def parser() -> argparse.ArgumentParser:
    """The suite's command line (``python -m benchmarks gpu suite --help``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU tests)")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"markdown table (and .json beside it); default {DEFAULT_OUT} "
                    f"({DEFAULT_TINY_OUT} with --tiny)")
    ap.add_argument("--pairs", default=DEFAULT_PAIRS,
                    help="comma-separated, run in this order: qwen3-4b-domino, "
                    f"qwen3-8b-domino, qwen3-4b-dflash (default {DEFAULT_PAIRS})")
    ap.add_argument("--methods", default=None, help="comma-separated subset of each pair's "
                    "methods (default: all it supports)")
    ap.add_argument("--stages", choices=("all", "round"), default="all",
                    help="round: only each method's whole round and the AR step")
    ap.add_argument("--deadline", default=None, help="stop compiling new programs --reserve "
                    "seconds before this: seconds from the start, HH:MM[:SS] UTC or ISO")
    ap.add_argument("--reserve", type=float, default=None, help="seconds kept free before "
                    "--deadline (default 60; 0 with --tiny)")
    ap.add_argument("--tree-kernel", choices=TREE_KERNEL_MODES, default="auto",
                    help="top-M expansions: auto (Pallas where it compiles and the kernel "
                    "check passed), pallas (forced; interpret mode off a GPU), jnp")
    ap.add_argument("--attention", choices=ATTENTION_MODES, default="auto",
                    help="decode/verify attention over the cache: auto (dense on a GPU, "
                    "buckets elsewhere), bucket, dense")
    ap.add_argument("--kernel-variants", default=None, help="WARPSxSTAGES,... timed in the "
                    "kernel check (default on a GPU: " + ",".join(
                        f"{w}x{s}" for w, s in kernel.KERNEL_VARIANTS) + "; none elsewhere)")
    ap.add_argument("--peak-gbps", type=float, default=None, help="device memory bandwidth "
                    "for the AR step's share (default: known device kinds, H200 4800)")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls per stage "
                    "(default 30; 5 with --tiny)")
    ap.add_argument("--inner", type=int, default=None, help="calls dispatched back to back per "
                    "timed sample (default 10; 1 with --tiny)")
    ap.add_argument("--context", type=int, default=None,
                    help="committed tokens in the caches (default 512; 32 with --tiny)")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="sizes the cache like a decode of this many tokens (default 512; 32 "
                    "with --tiny)")
    ap.add_argument("--merge", action="store_true", help="keep the methods of an existing "
                    "--out report (same device) that this run does not redo")
    ap.add_argument("--compile-cache", type=Path, default=None, help="persistent XLA "
                    "compilation cache directory: a rerun on the same machine skips compiles")
    ap.add_argument("--skip-kernel", action="store_true", help="no kernel check")
    ap.add_argument("--skip-stages", action="store_true", help="kernel check only")
    return ap


def main(argv=None) -> int:
    start = control.now()
    ap = parser()
    args = ap.parse_args(argv)
    pairs = tiny_pairs() if args.tiny else real_pairs()
    names = [n for n in args.pairs.split(",") if n]
    unknown = [n for n in names if n not in pairs]
    if unknown or not names:
        ap.error(f"unknown --pairs {unknown or names}; choose from {sorted(pairs)}")
    if args.methods:
        wanted = tuple(m for m in args.methods.split(",") if m)
        bad = [m for m in wanted if m not in METHODS]
        if bad or not wanted:
            ap.error(f"unknown --methods {bad or wanted}; choose from {sorted(METHODS)}")
        pairs = {n: dataclasses.replace(p, methods=tuple(m for m in p.methods if m in wanted))
                 for n, p in pairs.items()}
        empty = [n for n in names if not pairs[n].methods]
        if empty:
            ap.error(f"--methods {args.methods} leaves nothing to run for {empty}")
    repeats = args.repeats or (5 if args.tiny else 30)
    inner = args.inner or (1 if args.tiny else 10)
    context = args.context or (32 if args.tiny else 512)
    max_new = args.max_new_tokens or (32 if args.tiny else 512)
    if min(repeats, inner, context, max_new) < 1:
        ap.error("--repeats, --inner, --context and --max-new-tokens must be >= 1")
    try:
        deadline = control.Deadline(
            None if args.deadline is None else control.parse_deadline(args.deadline, start),
                            args.reserve if args.reserve is not None
                            else (0.0 if args.tiny else 60.0))
        on_gpu = jax.default_backend() == "gpu"
        variants = (parse_variants(args.kernel_variants) if args.kernel_variants
                    else (kernel.KERNEL_VARIANTS if on_gpu else ()))
    except ValueError as err:
        ap.error(str(err))
    if not (args.tiny or on_gpu):
        ap.error(f"real sizes need a GPU (backend is {jax.default_backend()!r}); use --tiny")
    out = args.out or (DEFAULT_TINY_OUT if args.tiny else DEFAULT_OUT)
    if args.compile_cache:  # before the first compile
        jax.config.update("jax_compilation_cache_dir", str(args.compile_cache))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    pairs = {n: dataclasses.replace(p, target=dataclasses.replace(
        p.target, attention_impl=args.attention)) for n, p in pairs.items()}

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    env = environment(dict(tree_kernel=args.tree_kernel, attention=args.attention,
                           repeats=repeats, inner=inner, context=context,
                           max_new_tokens=max_new, stages=args.stages,
                           deadline_utc=None if deadline.at is None else
                           datetime.datetime.fromtimestamp(deadline.at, datetime.timezone.utc)
                           .isoformat(timespec="seconds"), reserve_s=deadline.reserve))
    env["peak_bandwidth"] = (args.peak_gbps * 1e9 if args.peak_gbps
                             else peak_bandwidth(env["device_kind"]))
    report = dict(command=command_line("gpu", "suite", argv), environment=env, kernel={},
                  pairs={})
    log(device_line(env))
    previous = out.with_suffix(".json")
    if args.merge and previous.exists():
        old = json.loads(previous.read_text())
        if device_line(old.get("environment", {}) or env) != device_line(env):
            ap.error(f"--merge: {previous} was measured on "
                     f"{device_line(old['environment'])!r}, not here")
        merge_into(report, old)
    write = functools.partial(write_report, report, out)
    write()
    outcomes = collections.Counter()
    checks = [] if args.skip_kernel else kernel.kernel_checks(pairs, names, tiny=args.tiny)
    kernel_status = dict(ok=True, broken=False)

    def run_kernel_checks(batch):
        """The kernel checks in ``batch``, each isolated; the first pair's runs before any
        pair (``auto`` takes the kernel only if it passed), the rest after the pairs."""
        for shapes, name in batch:
            if not deadline.allows_new_work():
                outcomes["skipped"] += 1
                log(f"kernel check {name}: skipped (deadline)")
                continue
            t = time.perf_counter()
            try:
                r = kernel.check_kernel(shapes, interpret=not on_gpu, seeds=3 if args.tiny else 20,
                                 repeats=repeats, inner=inner, variants=variants)
            except Exception as err:  # noqa: BLE001  (report it and go on to the timings)
                r = kernel.failed_kernel_row(shapes, not on_gpu, err)
                kernel_status["broken"] = True
            report["kernel"][name] = r
            kernel_status["ok"] &= r["kernel_ok"] and r["trees_equal"]
            log(f"kernel check {name}: {verdict(r['kernel_ok'] and r['trees_equal'])} "
                f"({time.perf_counter() - t:.1f} s){' ' + r['error'] if r.get('error') else ''}")
            write()
        if batch:
            print("\n".join(kernel_table(report["kernel"])) + "\n", flush=True)

    run_kernel_checks(checks[:1])
    if not args.skip_stages:
        use_pallas, tree_kernel = kernel.tree_kernel_choice(
            args.tree_kernel, on_gpu=on_gpu,
            kernel_broken=kernel_status["broken"] or not kernel_status["ok"])
        for name in names:
            spec = pairs[name]
            settings = dict(context=context, tree_kernel=tree_kernel, attention=args.attention,
                            ar_bytes=ar_bytes(spec, context))
            entry = report["pairs"].get(name)
            if entry is None or entry.get("title") != spec.name:
                entry = report["pairs"][name] = pair_entry(spec, settings)
            entry.update(settings)
            for m in spec.methods:
                entry["methods"].setdefault(m, {})
            outcomes += measure_pair(spec, entry, deadline=deadline, stages=args.stages,
                                     context=context, max_new_tokens=max_new, repeats=repeats,
                                     inner=inner, use_pallas=use_pallas, write=write, log=log)
            print(f"{entry['title']} (context {context}, {device_line(env)})")
            print(bandwidth_line(entry, env))
            print("\n".join(pair_table(entry, env)) + "\n", flush=True)
    run_kernel_checks(checks[1:])
    write()
    log(f"wrote {out} and {out.with_suffix('.json')}")
    verdict_text = overall(outcomes, kernel_status["ok"])
    print(f"OVERALL: {verdict_text}")
    return 1 if verdict_text == "FAIL" else 0
