"""How far the ``budget="auto"`` policy's acceptance model is off at each temperature: every
round drafts a full DominoTree (a cost table where drafting is free), and the policy's own
EMAs of predicted (the drafter's path probabilities, uncalibrated) and accepted nodes are read
at the end of each decode; their ratio is the calibration factor ``c`` the policy learns.

    python -m benchmarks methods temperature_accept [--prompts 3] [--new 96]
        [--temperatures 0,0.7,0.9,1]

Real SmolLM2-135M + shipped drafter, float32, batch 1, budget 16 (k 8, M 0), one key per
prompt. Prints per temperature: decoded τ, the mean final EMAs, ``c`` per prompt, and the
policy's own per-round prediction (``DecodeOutput.predicted_lengths``: the expected tokens of
the round when it chose the size, calibrated by what earlier rounds measured) against the
tokens each drafted round committed: their means over all rounds and prompts, and the mean
per-round error (a round commits a whole number of tokens, so one round cannot match an
expectation; the means are what the cost model runs on).
"""

from __future__ import annotations

import argparse
import datetime

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.measure.timing import bf16_units, cpu_model


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=3, help="per dataset")
    ap.add_argument("--datasets", default="humaneval,math500,mtbench")
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--temperatures", default="0,0.7,0.9,1")
    args = ap.parse_args(argv)

    from dominotree_jax import decode
    from dominotree_jax.decoding.auto_size import initial_state
    from dominotree_jax.decoding.costs import CostTable
    from dominotree_jax.measure import eval_prompts
    from dominotree_jax.measure.default_pair import load_models

    pair = load_models(None, None, "float32")[0]
    prompts = [pair.target.chat_prompt(t) for d in args.datasets.split(",")
               for t in eval_prompts.load(d, args.prompts, 0)]
    width = -(-max(map(len, prompts)) // 128) * 128
    free = (CostTable(batch=1, verify=((1, 1.0), (17, 1.0001)), draft=(("dominotree", 0.0),)),)
    print(f"# auto's acceptance model at temperature — {cpu_model()} (bf16 units: "
          f"{bf16_units() or 'none'}), {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d} "
          f"UTC; {len(prompts)} prompts x {args.new} tokens, float32, budget 16\n")
    print("| T | decoded τ | accepted nodes (EMA) | predicted (EMA, uncalibrated) | c = accepted "
          "/ predicted, mean (per prompt min-max) | policy's expected τ / measured τ, drafted "
          "rounds | mean per-round abs. error / measured |")
    print("|---:|---:|---:|---:|---|---|---:|")
    rows = []
    for T in (float(t) for t in args.temperatures.split(",")):
        cfg = pair.config("dominotree", budget="auto", auto_sizes=(0, 16), auto_costs=free,
                          max_new_tokens=args.new, stop_ids=(), temperature=T, top_m=0)
        fn = jax.jit(lambda params, x, n, st, key: decode(
            params, x, config=cfg, prompt_lengths=n, auto_state=st, key=key))
        taus, real, pred, expected, measured = [], [], [], [], []
        for i, p in enumerate(prompts):
            x = np.pad(np.asarray(p, np.int32), (0, width - len(p)))[None]
            out = fn(pair.params, x, jnp.array([len(p)], jnp.int32), initial_state(cfg, 1),
                     jax.random.key(i))
            rounds = int(out.num_rounds[0])
            taus.append(float(out.num_tokens[0]) / rounds)
            real.append(float(out.auto_state.real))
            pred.append(float(out.auto_state.pred))
            # per drafted round, the last (cut by max_new_tokens) left out: the policy's
            # expected tokens when it chose the size, and the tokens the round committed
            drafted = np.asarray(out.draft_sizes[0, :rounds - 1]) > 0
            expected += list(np.asarray(out.predicted_lengths[0, :rounds - 1])[drafted])
            measured += list(np.asarray(out.accept_lengths[0, :rounds - 1])[drafted])
        c = np.asarray(real) / np.asarray(pred)
        e, m = np.asarray(expected), np.asarray(measured, np.float64)
        rows.append((T, e, m))
        print(f"| {T:g} | {np.mean(taus):.2f} | {np.mean(real):.2f} | {np.mean(pred):.2f} | "
              f"{c.mean():.2f} ({c.min():.2f}-{c.max():.2f}) | {e.mean():.2f} / {m.mean():.2f} "
              f"= {e.mean() / m.mean():.2f} | {np.mean(np.abs(e - m) / m):.2f} |", flush=True)

    # reliability: the drafted rounds binned by the policy's expected tokens; in each bin the
    # mean committed should be the mean expected
    edges = (1.0, 1.5, 2.0, 3.0, np.inf)
    print("\nBy the policy's expected tokens (drafted rounds): expected / measured, mean "
          "(rounds)\n")
    print("| T | " + " | ".join(f"{lo:g}-{hi:g}" for lo, hi in zip(edges, edges[1:])) + " |")
    print("|---:|" + "---|" * (len(edges) - 1))
    for T, e, m in rows:
        cells = []
        for lo, hi in zip(edges, edges[1:]):
            sel = (e >= lo) & (e < hi)
            cells.append(f"{e[sel].mean():.2f} / {m[sel].mean():.2f} ({sel.sum()})" if sel.any()
                         else "-")
        print(f"| {T:g} | " + " | ".join(cells) + " |", flush=True)
