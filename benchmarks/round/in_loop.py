"""A round's cost inside the decode loop, per method and precision, in float32 ``ar`` steps.

Each (method, precision) decodes one prompt twice, to ``--short`` and ``--long`` new tokens (no
stop ids, so every call runs its whole length, T 0, batch 1, fixed ``--budget``); a round costs
the difference of the two calls' times over the difference of their rounds. What a call pays
once (prefill, the upcasts XLA hoists out of the loop, the first token) cancels, which the
stage benchmark's one-round ``fused`` program cannot do. The calls are interleaved, median of
``--runs``; the unit is float32 ``ar``'s round measured the same way.

    python -m benchmarks round in_loop [--methods ar,dominotree] [--precisions float32,bfloat16]
        [--short 16 --long 112] [--runs 5] [--budget 16]
"""

from __future__ import annotations

import argparse
import datetime

from benchmarks.common import command_line


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="ar,dominotree")
    ap.add_argument("--precisions", default="float32,bfloat16")
    ap.add_argument("--short", type=int, default=16)
    ap.add_argument("--long", type=int, default=112)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--dataset", default="humaneval")
    args = ap.parse_args(argv)
    if not 0 < args.short < args.long:
        ap.error("need 0 < --short < --long")

    import jax
    import jax.numpy as jnp

    from dominotree_jax.decoding.decode import decode
    from dominotree_jax.measure import eval_prompts
    from dominotree_jax.measure.default_pair import load_models
    from dominotree_jax.measure.timing import bf16_units, cpu_model, interleaved_medians

    pair32 = load_models(None, None, "float32")[0]
    pairs = {p: pair32 if p == "float32" else pair32.with_precision(p)
             for p in args.precisions.split(",")}
    if "float32" not in pairs:
        pairs["float32"] = pair32   # the unit
    methods = args.methods.split(",")
    runs = [(m, p) for p in pairs for m in methods] + ([("ar", "float32")]
                                                      if "ar" not in methods else [])
    x = jnp.asarray(pair32.target.chat_prompt(eval_prompts.load(args.dataset, 1, 0)[0]),
                    jnp.int32)[None]
    programs, rounds = {}, {}
    for m, p in runs:
        for n in (args.short, args.long):
            cfg = pairs[p].config(m, max_new_tokens=n, budget=args.budget, stop_ids=())
            fn = jax.jit(lambda params, x, cfg=cfg: decode(params, x, config=cfg))
            prog = fn.lower(pairs[p].params, x).compile()
            out = jax.block_until_ready(prog(pairs[p].params, x))   # the first run's setup
            rounds[m, p, n] = int(out.num_rounds[0])
            programs[f"{m}/{p}/{n}"] = (lambda prog=prog, params=pairs[p].params:
                                        jax.block_until_ready(prog(params, x)))
    med = interleaved_medians(programs, args.runs)   # ms

    per_round = {(m, p): (med[f"{m}/{p}/{args.long}"] - med[f"{m}/{p}/{args.short}"])
                 / (rounds[m, p, args.long] - rounds[m, p, args.short]) for m, p in runs}
    unit = per_round["ar", "float32"]
    print(f"# A round inside the decode loop — {cpu_model()} (bf16 units: "
          f"{bf16_units() or 'none'}), "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"`{command_line('round', 'in_loop', argv)}`: one {args.dataset} prompt, "
          f"{args.short} vs {args.long} new tokens, budget {args.budget}, T 0, batch 1, "
          f"median of {args.runs}\n")
    print("| method | precision | ms / round | float32 ar steps | rounds (short -> long) |")
    print("|---|---|---:|---:|---|")
    for (m, p), r in per_round.items():
        print(f"| {m} | {p} | {r:.1f} | {r / unit:.2f} | "
              f"{rounds[m, p, args.short]} -> {rounds[m, p, args.long]} |")
    return {key: r / unit for key, r in per_round.items()}
