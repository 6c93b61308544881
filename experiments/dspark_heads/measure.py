"""The DSpark heads against v5, decoded (issue 65 §3 and §5): τ and speed of ``dspark``,
``dsparktree``, v5's ``dominotree`` and ``ddtree`` (and ``ar``) on the benchmark sets, batch
1, T 0 and 0.9, float32, each prompt decoded by every method in turn; and ``budget="auto"``'s
per-round prediction error on ``dspark`` chains with the path-probability predictor
(``confidence_share=0``, today's) against the confidence head's survival (``1``): mean
absolute error of the round's expected against committed tokens over drafted rounds, under a
cost table that makes drafting cheap so that most rounds draft (the predictor, not the
speed, is measured). Writes ``decoded.json`` here.

    python -m experiments.dspark_heads.measure --drafter runs/dspark-heads/drafter --prompts 4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SETS = ("humaneval", "mtbench", "math500")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--drafter", required=True, help="the DSpark drafter directory")
    p.add_argument("--prompts", type=int, default=4, help="prompts per set")
    p.add_argument("--new", type=int, default=96, help="new tokens per prompt")
    p.add_argument("--temperatures", default="0,0.9")
    p.add_argument("--arms", default=None, help="comma-separated subset of the arms (default: "
                   "all); one process compiled ~14 programs and ran out of LLVM section memory "
                   "on a 2-core Xeon (2026-12-07): run one temperature per process")
    p.add_argument("--no-predictors", action="store_true", help="skip the auto predictor runs")
    p.add_argument("--out", default=os.path.join(HERE, "decoded.json"))
    return p.parse_args(argv)


def arms(v5, ds):
    """``{name: (pair, DecodeConfig kwargs)}`` of the decoded comparison."""
    tree = dict(budget=16, node_topk=8, top_m=0)
    return {"ar": (v5, dict(method="ar")),
            "v5 ddtree": (v5, dict(method="ddtree", **tree)),
            "v5 dominotree": (v5, dict(method="dominotree", **tree)),
            "dspark": (ds, dict(method="dspark")),
            "dsparktree": (ds, dict(method="dsparktree", **tree))}


def round_errors(out) -> tuple[float, int]:
    """``(sum |expected − committed|, rounds)`` over the drafted rounds of a decode."""
    drafted = np.asarray(out.draft_sizes) > 0
    err = np.abs(np.asarray(out.predicted_lengths) - np.asarray(out.accept_lengths))
    return float(err[drafted].sum()), int(drafted.sum())


def main(argv=None):
    import jax
    import jax.numpy as jnp

    import dominotree_jax as dj
    from convert.drafter import load_drafter
    from dominotree_jax.assets import smollm2_drafter_path, smollm2_gguf_path
    from dominotree_jax.decoding.costs import CostTable
    from dominotree_jax.measure import eval_prompts
    from dominotree_jax.measure.timing import bf16_units, cpu_model

    args = parse_args(argv)
    temps = [float(t) for t in args.temperatures.split(",")]
    v5 = dj.load_pair(smollm2_gguf_path(), smollm2_drafter_path())
    dcfg, dparams = load_drafter(args.drafter, dtype="float32", target_cfg=v5.target.config)
    ds = dj.Pair(v5.target, dcfg, dparams)
    cheap = CostTable(verify=((1, 1.0), (17, 1.1)), draft=(("dspark", 0.05),), source="cheap")
    decode = jax.jit(dj.decode, static_argnames="config")
    chosen = arms(v5, ds)
    if args.arms:
        chosen = {k: chosen[k] for k in args.arms.split(",")}
    rows, warmed = {}, set()
    for T in temps:
        results = {name: {s: {"tokens": 0, "rounds": 0, "seconds": 0.0} for s in SETS}
                   for name in chosen}
        errors = {share: {s: [0.0, 0] for s in SETS}
                  for share in (() if args.no_predictors else (0.0, 1.0))}
        for s in SETS:
            for i, text in enumerate(eval_prompts.load(s, args.prompts)):
                ids = jnp.asarray(v5.target.chat_prompt(text))
                key = jax.random.key(i)
                for name, (pair, kw) in chosen.items():
                    cfg = pair.config(max_new_tokens=args.new, temperature=T, **kw)
                    if (name, T) not in warmed:   # compile outside the timing
                        jax.block_until_ready(decode(pair.params, ids, config=cfg, key=key))
                        warmed.add((name, T))
                    t0 = time.perf_counter()
                    out = jax.block_until_ready(decode(pair.params, ids, config=cfg, key=key))
                    r = results[name][s]
                    r["seconds"] += time.perf_counter() - t0
                    r["tokens"] += int(out.num_tokens[0])
                    r["rounds"] += int(out.num_rounds[0])
                for share in errors:
                    cfg = ds.config("dspark", max_new_tokens=args.new, temperature=T,
                                    budget="auto", auto_costs=cheap, confidence_share=share)
                    e, n = round_errors(decode(ds.params, ids, config=cfg, key=key))
                    errors[share][s][0] += e
                    errors[share][s][1] += n
        ar = results.get("ar")
        rows[f"T={T}"] = {
            "decoded": {name: {s: {"tau": round((r[s]["tokens"] - args.prompts)
                                                / max(r[s]["rounds"], 1), 3),
                                   "tok_s": round(r[s]["tokens"] / r[s]["seconds"], 1),
                                   "x_ar": None if ar is None else round(
                                       (r[s]["tokens"] / r[s]["seconds"])
                                       / (ar[s]["tokens"] / ar[s]["seconds"]), 3)}
                               for s in SETS} for name, r in results.items()},
            "auto_round_mae": {("path probability (share 0)" if share == 0 else
                                "confidence survival (share 1)"):
                               {s: {"mae": round(e / max(n, 1), 4), "rounds": n}
                                for s, (e, n) in errors[share].items()}
                               for share in errors}}
        print(json.dumps(rows[f"T={T}"], indent=1), flush=True)
    run = {"command": "python -m experiments.dspark_heads.measure "
                      f"--drafter {args.drafter} --prompts {args.prompts} --new {args.new} "
                      f"--temperatures {args.temperatures}"
                      + (f" --arms {args.arms}" if args.arms else "")
                      + (" --no-predictors" if args.no_predictors else ""),
           "machine": f"{cpu_model()} ({bf16_units()}), 2 cores, {platform.node()}",
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    merged = {"note": "tau = committed tokens per round (first token excluded); x_ar: tok/s "
                      "over ar's on the same prompts in the same process; float32; "
                      "dspark/dsparktree: the DSpark heads on v5's backbone; one process per "
                      "temperature (runs)", "runs": [], "results": {}}
    if os.path.exists(args.out):   # one process per temperature: results accumulate
        with open(args.out) as f:
            merged = json.load(f)
    merged["runs"].append(run)
    merged["results"].update(rows)
    with open(args.out, "w") as f:
        json.dump(merged, f, indent=1)


if __name__ == "__main__":
    main()
