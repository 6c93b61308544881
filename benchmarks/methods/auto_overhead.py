"""What ``budget="auto"`` costs over plain decoding: paired decodes of one batch of MT-Bench
prompts with ``ar``, with auto mode forced to plain steps (a cost table whose draft costs 100 AR
steps: it can never pay, so the loop compiles to plain steps), and with auto mode as it comes.

    python -m benchmarks methods auto_overhead [--batch 16] [--new-tokens 64] [--repeats 3]

Prints the draft sizes auto mode chose for the first row and the median wall time of each
program (compiled first; the three calls interleaved, ``--repeats`` times) with its ratio to
``ar`` (tokens/s ratio: > 1 is faster than ``ar``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

import dominotree_jax as dj
from dominotree_jax.assets import smollm2_drafter_path, smollm2_gguf_path
from dominotree_jax.measure import eval_prompts as prompts
from dominotree_jax.decoding.costs import CostTable


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--method", default="dominotree")
    args = ap.parse_args(argv)
    pair = dj.load_pair(smollm2_gguf_path(), smollm2_drafter_path())
    ids = [pair.target.chat_prompt(t) for t in prompts.mtbench(args.batch)]
    prompt_BT = np.zeros((len(ids), max(map(len, ids))), np.int32)
    for b, row in enumerate(ids):
        prompt_BT[b, :len(row)] = row
    lengths_B = np.array([len(r) for r in ids], np.int32)
    never = CostTable(draft=((args.method, 100.0),), source="never drafts")
    configs = {
        "ar": pair.config("ar", max_new_tokens=args.new_tokens),
        "auto, plain steps only": pair.config(args.method, max_new_tokens=args.new_tokens,
                                              budget="auto", auto_costs=never),
        "auto": pair.config(args.method, max_new_tokens=args.new_tokens, budget="auto"),
    }
    run = jax.jit(dj.decode, static_argnames="config")
    for name, cfg in configs.items():
        out = jax.block_until_ready(run(pair.params, prompt_BT, config=cfg,
                                        prompt_lengths=lengths_B))
        rounds = int(out.num_rounds[0])
        print(f"{name}: draft sizes of row 0 {np.asarray(out.draft_sizes[0, :rounds]).tolist()}",
              flush=True)
    times = {name: [] for name in configs}
    for _ in range(args.repeats):
        for name, cfg in configs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(run(pair.params, prompt_BT, config=cfg,
                                      prompt_lengths=lengths_B))
            times[name].append(time.perf_counter() - t0)
    ar = statistics.median(times["ar"])
    print(f"\nbatch {args.batch}, {args.new_tokens} new tokens, median of {args.repeats}:")
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"  {name:24s} {t * 1e3:9.1f} ms   speed vs ar {ar / t:.3f}")
