"""Single-stream ``ar`` under XLA:CPU flag sets: tokens/s (float32 and bf16) per flag set.

Each flag set runs in its own subprocess (``XLA_FLAGS`` is read at backend start): SmolLM2-135M,
batch 1, a 50-token chat prompt, ``--new-tokens`` tokens, median of 3 runs after a warm-up; the
last column says whether the tokens equal the default flags' run of the same dtype.

    python -m benchmarks step xla_flags [--new-tokens 48]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

from benchmarks.common import ROOT, python_m

FLAG_SETS = ("", "--xla_cpu_use_xnnpack=true", "--xla_cpu_use_onednn=true",
             "--xla_cpu_multi_thread_eigen=false")
PROMPT = "Write a short story about a robot who learns to paint, in the style of a fable."


def worker(n: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path
    from dominotree_jax.precision import BENCHMARKED_PRECISIONS

    res = {}
    for dtype in BENCHMARKED_PRECISIONS:
        t = dj.load_target(smollm2_gguf_path(), precision=dtype)
        ids = np.asarray([t.chat_prompt(PROMPT)], np.int32)
        cfg = dj.DecodeConfig(target=t.config, method="ar", max_new_tokens=n, stop_ids=())
        params = {"target": t.params, "drafter": None}
        prog = jax.jit(dj.decode, static_argnames="config").lower(
            params, jax.ShapeDtypeStruct(ids.shape, jnp.int32), config=cfg).compile()
        out = jax.block_until_ready(prog(params, ids))
        speeds = []
        for _ in range(3):
            t0 = time.perf_counter()
            jax.block_until_ready(prog(params, ids))
            speeds.append(n / (time.perf_counter() - t0))
        res[dtype] = dict(tok_s=statistics.median(speeds), tokens=np.asarray(out.tokens).tolist())
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.new_tokens)))
        return
    print("| XLA_FLAGS | float32 tok/s | bf16 tok/s | tokens = default (f32 / bf16) |")
    print("|---|---:|---:|---|")
    rows = {}
    for flags in FLAG_SETS:
        proc = subprocess.run(python_m("step", "xla_flags", "--worker", "--new-tokens",
                                       str(args.new_tokens)),
                              env=dict(os.environ, XLA_FLAGS=flags), cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            print(f"| `{flags or '(default)'}` | failed: {proc.stderr[-300:]!r} | | |")
            continue
        r = rows[flags] = json.loads(proc.stdout.strip().splitlines()[-1])
        base = rows.get("")
        same = [str(base is not None and r[d]["tokens"] == base[d]["tokens"])
                for d in ("float32", "bfloat16")]
        print(f"| `{flags or '(default)'}` | {r['float32']['tok_s']:.1f} | "
              f"{r['bfloat16']['tok_s']:.1f} | {' / '.join(same)} |", flush=True)
