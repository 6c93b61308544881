"""The fastest configurations on a CPU with bf16 units against float32 ``ar``, side by side in
one process (real SmolLM2-135M + shipped drafter): bf16 weights verify many rows at bf16
speed, and ``budget="auto"``'s plain steps run about as fast as float32 ``ar`` (one-row bf16
products padded to two rows; a drafting policy's on the float32 view at batch 1), so auto +
lookup on bf16 weights is the configuration to beat float32 ``ar`` with.

    python -m benchmarks methods bf16_host [--prompts 3] [--new 128] [--lookup 4] [--reps 2]
        [--datasets humaneval,mtbench,math500,copyedit] [--lookup-lengths 8,16] [--stop]
        [--json benchmarks/results/lookup/bf16_host_<machine>.json]

Runs, each one jitted ``decode`` compiled once, then every prompt decoded by every run in turn,
``--reps`` times (``run_configs``: a drift of the machine's speed falls on all runs
alike; batch 1, T 0, prompts right-padded to one bucket that holds the longest): float32 ``ar``
(the reference), bf16 ``ar``, bf16 DominoTree auto, bf16 DominoTree + lookup auto, float32
DominoTree + lookup auto, bf16 ``lookup`` at budget 16, ``lookup`` auto (no drafter: a plain
step or the lookup paths each round) on bf16 and float32 weights (and bf16 DominoTree + lookup
auto with each further ``--lookup-lengths``, and bf16 ``lookup`` auto with each). ``--stop``
ends each answer at the tokenizer's end-of-turn ids (default: ``--new`` tokens every call).
Prints tokens/s per dataset, x float32 ``ar``, tau and the plain-step share, and whether each
run's tokens equal its reference's: float32 ``ar``'s for float32 runs (always, or it is a bug);
bf16 ``ar``'s for bf16 runs, from which a many-row bf16 verify may part at near-ties
(docs/precision.md). ``--json`` also writes the table's numbers with the command, machine and
date: ``python -m benchmarks tables`` renders the README's table from that file. Pause other CPU
work while it runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import command_line
from dominotree_jax.measure.timing import bf16_units, cpu_model


def run_configs(runs: dict, prompts_by_set: dict, width: int, reps: int = 1) -> dict:
    """``{label: {set: {tok_s, tau, plain, outs}}}`` for ``runs = {label: (pair, config)}``:
    one jitted ``decode`` per run, compiled first, then ``reps`` passes over every prompt
    (batch 1, right-padded to ``width``), each prompt decoded by every run in turn, in an order
    rotated from prompt to prompt, so a drift of the machine's speed falls on every run alike.
    ``tok_s``: tokens / seconds over all reps; ``tau``: tokens / rounds over the set;
    ``plain``: the share of plain-step rounds; ``outs``: each prompt's tokens (first rep)."""
    from dominotree_jax import decode
    from dominotree_jax.decoding.auto_size import initial_state

    def compiled(pair, cfg):
        state = initial_state(cfg, 1) if cfg.is_auto else None
        jfn = jax.jit(lambda params, x, n, st: decode(params, x, config=cfg, prompt_lengths=n,
                                                      auto_state=st))

        def one(p):
            x = np.pad(np.asarray(p, np.int32), (0, width - len(p)))[None]
            return jfn(pair.params, x, jnp.array([len(p)], jnp.int32), state)

        jax.block_until_ready(one(next(iter(prompts_by_set.values()))[0]))   # compile
        return one

    fns = {label: compiled(*run) for label, run in runs.items()}
    labels = list(fns)
    acc = {label: {name: dict(tokens=0, secs=0.0, rounds=0, sizes=[], outs=[])
                   for name in prompts_by_set} for label in labels}
    turn = 0
    for rep in range(reps):
        for name, prompts in prompts_by_set.items():
            for p in prompts:
                turn += 1
                for label in labels[turn % len(labels):] + labels[:turn % len(labels)]:
                    t0 = time.perf_counter()
                    o = jax.block_until_ready(fns[label](p))
                    a = acc[label][name]
                    a["secs"] += time.perf_counter() - t0
                    k, r = int(o.num_tokens[0]), int(o.num_rounds[0])
                    a["tokens"] += k
                    a["rounds"] += r
                    if rep == 0:
                        a["sizes"].extend(np.asarray(o.draft_sizes[0, :r]).tolist())
                        a["outs"].append(np.asarray(o.tokens[0, :k]))
    return {label: {name: dict(tok_s=a["tokens"] / a["secs"],
                               tau=a["tokens"] / max(a["rounds"], 1),
                               plain=float(np.mean(np.asarray(a["sizes"]) == 0))
                               if a["sizes"] else 1.0, outs=a["outs"])
                    for name, a in by_set.items()}
            for label, by_set in acc.items()}


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
    ap.add_argument("--json", default=None, help="also write the table's numbers here")
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
    results = run_configs({label: (pair, cfg) for label, pair, cfg, _ in runs}, prompts, width,
                          args.reps)
    print(f"  {len(runs)} runs x {args.reps} reps: {time.perf_counter() - t0:.0f} s", flush=True)

    machine = (f"{cpu_model()} ({bf16_units() or 'no bf16 units'}), {os.cpu_count()} cores, "
               f"{jax.devices()[0].platform}, jax {jax.__version__}")
    date = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
    print(f"\n# {m} + lookup on bf16 weights vs float32 ar — {machine}, {date}")
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
    if args.json:
        keys = ("tok_s", "tau", "plain")
        runs_out = {label: {d: {k: round(results[label][d][k], 4) for k in keys} for d in sets}
                    for label, _, _, _ in runs}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"command": command_line("methods", "bf16_host", argv), "machine": machine,
                       "date": date, "reference": "float32 ar", "runs": runs_out}, f, indent=1)
            f.write("\n")
