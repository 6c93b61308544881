"""The fastest configurations on a CPU with bf16 units against float32 ``ar``, side by side in
one process (real SmolLM2-135M + shipped drafter): bf16 weights verify many rows at bf16
speed, and ``budget="auto"``'s plain steps run about as fast as float32 ``ar`` (one-row bf16
products padded to two rows; a drafting policy's on the float32 view at batch 1), so auto +
lookup on bf16 weights is the configuration to beat float32 ``ar`` with.

    python -m benchmarks methods bf16_host [--prompts 3] [--new 128] [--lookup 4] [--reps 2]
        [--datasets humaneval,mtbench,math500,copyedit] [--lookup-lengths 8,16] [--stop]

Runs, each one jitted ``decode`` compiled once, then every prompt decoded by every run in turn,
``--reps`` times (``auto_view.run_configs``: a drift of the machine's speed falls on all runs
alike; batch 1, T 0, prompts right-padded to one bucket that holds the longest): float32 ``ar``
(the reference), bf16 ``ar``, bf16 DominoTree auto, bf16 DominoTree + lookup auto, float32
DominoTree + lookup auto, bf16 ``lookup`` at budget 16, ``lookup`` auto (no drafter: a plain
step or the lookup paths each round) on bf16 and float32 weights (and bf16 DominoTree + lookup
auto with each further ``--lookup-lengths``, and bf16 ``lookup`` auto with each). ``--stop``
ends each answer at the tokenizer's end-of-turn ids (default: ``--new`` tokens every call).
Prints tokens/s per dataset, x float32 ``ar``, tau and the plain-step share, and whether each
run's tokens equal its reference's: float32 ``ar``'s for float32 runs (always, or it is a bug);
bf16 ``ar``'s for bf16 runs, from which a many-row bf16 verify may part at near-ties
(docs/precision.md). Pause other CPU work while it runs.
"""

from __future__ import annotations

import argparse
import datetime
import time

import jax
import numpy as np

from benchmarks.methods.auto_view import run_configs
from dominotree_jax.measure.timing import bf16_units, cpu_model


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=3, help="per dataset")
    ap.add_argument("--datasets", default="humaneval,mtbench,math500,copyedit")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--lookup", type=int, default=4, help="lookup paths per round")
    ap.add_argument("--method", default="dominotree")
    ap.add_argument("--lookup-lengths", default="8",
                    help="lookup path lengths of the bf16 auto + lookup run (e.g. 8,16: one "
                         "row each; the first is every other lookup run's)")
    ap.add_argument("--reps", type=int, default=2,
                    help="passes over the prompts (each prompt decoded by every run in turn)")
    ap.add_argument("--stop", action="store_true",
                    help="stop at the tokenizer's end-of-turn ids (default: every call decodes "
                         "--new tokens, past the answer's end)")
    args = ap.parse_args(argv)

    from dominotree_jax.measure import eval_prompts
    from dominotree_jax.measure.default_pair import load_models

    pair32 = load_models(None, None, "float32")[0]
    pair16 = pair32.with_precision("bfloat16")
    prompts = {d: [pair32.target.chat_prompt(t) for t in eval_prompts.load(d, args.prompts, 0)]
               for d in args.datasets.split(",")}
    longest = max(len(p) for ps in prompts.values() for p in ps)
    width = -(-longest // 128) * 128   # one bucket holds every prompt whole
    kw = dict(max_new_tokens=args.new)
    if not args.stop:
        kw["stop_ids"] = ()
    lengths = [int(x) for x in args.lookup_lengths.split(",")]
    m, look = args.method, dict(lookup=args.lookup, lookup_length=lengths[0])
    runs = [  # (label, pair, config, the run whose tokens it must equal)
        ("float32 ar", pair32, pair32.config("ar", **kw), None),
        ("bf16 ar", pair16, pair16.config("ar", **kw), None),
        (f"bf16 {m} auto", pair16, pair16.config(m, budget="auto", **kw), "bf16 ar"),
        (f"bf16 {m}+lookup auto", pair16, pair16.config(m, budget="auto", **look, **kw),
         "bf16 ar"),
        *[(f"bf16 {m}+lookup auto, paths of {n}", pair16,
           pair16.config(m, budget="auto", **{**look, "lookup_length": n}, **kw), "bf16 ar")
          for n in lengths[1:]],
        (f"float32 {m}+lookup auto", pair32, pair32.config(m, budget="auto", **look, **kw),
         "float32 ar"),
        ("bf16 lookup, budget 16", pair16, pair16.config("lookup", budget=16, **look, **kw),
         "bf16 ar"),
        ("bf16 lookup auto", pair16, pair16.config("lookup", budget="auto", **look, **kw),
         "bf16 ar"),
        *[(f"bf16 lookup auto, paths of {n}", pair16,
           pair16.config("lookup", budget="auto", **{**look, "lookup_length": n}, **kw),
           "bf16 ar") for n in lengths[1:]],
        ("float32 lookup auto", pair32, pair32.config("lookup", budget="auto", **look, **kw),
         "float32 ar"),
    ]
    t0 = time.perf_counter()
    results = run_configs({label: (pair, cfg, None) for label, pair, cfg, _ in runs}, prompts,
                          width, args.reps)
    print(f"  {len(runs)} runs x {args.reps} reps: {time.perf_counter() - t0:.0f} s", flush=True)

    print(f"\n# {m} + lookup on bf16 weights vs float32 ar — {cpu_model()} "
          f"(bf16 units: {bf16_units() or 'none'}), {jax.devices()[0].platform}, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"{args.prompts} prompts per set x {args.new} new tokens x {args.reps} reps, T 0, "
          f"batch 1, prompt "
          f"bucket {width}; lookup {args.lookup} paths of {lengths[0]}"
          f"{'; stopping at end of turn' if args.stop else ''}\n")
    sets = list(prompts)
    print("| run | " + " | ".join(sets) + " | tokens equal the reference's |")
    print("|---|" + "---:|" * len(sets) + "---|")
    for label, _, _, ref in runs:
        r = results[label]
        cells = [f"{r[d]['tok_s'] / results['float32 ar'][d]['tok_s']:.2f}x "
                 f"({r[d]['tok_s']:.1f} tok/s, τ {r[d]['tau']:.2f}, plain {r[d]['plain']:.0%})"
                 for d in sets]
        same = "—" if ref is None else str(all(
            np.array_equal(a, b) for d in sets
            for a, b in zip(r[d]["outs"], results[ref][d]["outs"])))
        print(f"| {label} | " + " | ".join(cells) + f" | {same} |")
