"""Rows on their own in a ``budget="auto"`` batch (issue 46, item 3): a batch that mixes rows
lookup can copy for (copy-edit prompts) with rows it cannot (MT-Bench first turns), DominoTree +
lookup, ``budget="auto"``, against the same policy with one calibration for the whole batch
(the ablation: every row's ``c`` replaced by the batch's, compiled as a separate program), and
``ar``; all side by side in one process, the arms alternating.

    python -m benchmarks methods auto_rows [--batches 2] [--new 96] [--reps 2] [--lookup 4]

Real SmolLM2-135M + shipped drafter, float32 (so every arm must equal ``ar``'s tokens), T 0,
batches of 4 rows ``copyedit, mtbench, copyedit, mtbench``. Prints per arm: tokens/s and ×
``ar``, τ per row kind, and per row kind the policy's expected tokens against the tokens its
drafted-or-lookup rounds committed (``DecodeOutput.predicted_lengths`` / ``accept_lengths``).
Pause other CPU work while it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import time
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.measure.timing import bf16_units, cpu_model

KINDS = ("copyedit", "mtbench")


def _batch_calibration(self, st, lookup=False):
    """The ablation: every row counts with the batch's calibration."""
    return jnp.broadcast_to(self.calibration(st, lookup), (self.batch,))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=2, help="batches of 4 rows")
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--reps", type=int, default=2, help="timed calls per batch and arm")
    ap.add_argument("--lookup", type=int, default=4)
    args = ap.parse_args(argv)

    from dominotree_jax import decode
    from dominotree_jax.decoding.auto_size import AutoPolicy, initial_state
    from dominotree_jax.measure import eval_prompts
    from dominotree_jax.measure.default_pair import load_models

    pair = load_models(None, None, "float32")[0]
    n = 2 * args.batches
    texts = {k: eval_prompts.load(k, n, 0) for k in KINDS}
    batches = []
    for b in range(args.batches):
        rows = [pair.target.chat_prompt(texts[k][2 * b + i]) for i in range(2) for k in KINDS]
        batches.append(rows)
    kinds_B = np.array([KINDS[i % 2] for i in range(4)])
    width = -(-max(len(p) for rows in batches for p in rows) // 128) * 128
    inputs = [(np.stack([np.pad(np.asarray(p, np.int32), (0, width - len(p))) for p in rows]),
               jnp.asarray([len(p) for p in rows], jnp.int32)) for rows in batches]

    kw = dict(max_new_tokens=args.new, stop_ids=())
    arms = {"ar": pair.config("ar", **kw),
            "auto+lookup, rows on their own": pair.config(
                "dominotree", budget="auto", lookup=args.lookup, **kw),
            "auto+lookup, one calibration (ablation)": pair.config(
                "dominotree", budget="auto", lookup=args.lookup, **kw)}
    # every call starts from the initial policy state, built once (not inside the timing)
    starts = {label: initial_state(cfg, 4) if cfg.is_auto else None
              for label, cfg in arms.items()}
    programs = {}
    for label, cfg in arms.items():
        fn = jax.jit(lambda p, x, n, s, *, config: decode(p, x, config=config, prompt_lengths=n,
                                                         auto_state=s),
                     static_argnames="config")
        patch = (mock.patch.object(AutoPolicy, "row_calibration", _batch_calibration)
                 if "ablation" in label else contextlib.nullcontext())
        with patch:   # the ablation's program is traced with the batch's calibration
            programs[label] = fn.lower(pair.params, *inputs[0], starts[label],
                                       config=cfg).compile()

    def call(label, i):
        return programs[label](pair.params, *inputs[i], starts[label])

    results = {label: dict(wall=0.0, tokens=0, outs=[None] * len(inputs)) for label in arms}
    for i in range(len(inputs)):
        for label in arms:
            jax.block_until_ready(call(label, i))   # warm
        for _ in range(args.reps):
            for label in arms:
                t0 = time.perf_counter()
                out = jax.block_until_ready(call(label, i))
                results[label]["wall"] += time.perf_counter() - t0
                results[label]["tokens"] += int(np.asarray(out.num_tokens).sum())
                results[label]["outs"][i] = out

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    print(f"# auto with rows on their own, mixed batches — {cpu_model()} (bf16 units: "
          f"{bf16_units() or 'none'}), {stamp} UTC")
    print(f"{args.batches} batches x 4 rows ({', '.join(kinds_B)}), {args.new} new tokens, "
          f"float32, T 0, lookup {args.lookup}, {args.reps} timed calls each\n")
    print("| arm | tok/s | × ar | τ " + " | τ ".join(KINDS) + " | expected / committed, "
          + " | expected / committed, ".join(KINDS) + " | tokens equal ar's |")
    print("|---|---:|---:|" + "---:|" * len(KINDS) + "---|" * len(KINDS) + "---|")
    ar_tok_s = results["ar"]["tokens"] / results["ar"]["wall"]
    for label in arms:
        r = results[label]
        tok_s = r["tokens"] / r["wall"]
        tau = {k: [] for k in KINDS}
        exp = {k: [] for k in KINDS}
        got = {k: [] for k in KINDS}
        same = True
        for out, ref in zip(r["outs"], results["ar"]["outs"]):
            same &= bool(np.array_equal(np.asarray(out.tokens), np.asarray(ref.tokens)))
            for b in range(4):
                rounds = int(out.num_rounds[b])
                tau[kinds_B[b]].append(float(out.num_tokens[b]) / rounds)
                if out.predicted_lengths is None:
                    continue
                # rounds that verified nodes, the last (cut by max_new_tokens) left out
                sized = np.asarray(out.draft_sizes[b, :rounds - 1]) > 0
                exp[kinds_B[b]] += list(np.asarray(out.predicted_lengths[b, :rounds - 1])[sized])
                got[kinds_B[b]] += list(np.asarray(out.accept_lengths[b, :rounds - 1])[sized])
        taus = " | ".join(f"{np.mean(tau[k]):.2f}" for k in KINDS)
        pred = " | ".join(f"{np.mean(exp[k]):.2f} / {np.mean(got[k]):.2f} ({len(exp[k])})"
                          if exp[k] else "—" for k in KINDS)
        print(f"| {label} | {tok_s:.1f} | {tok_s / ar_tok_s:.2f}x | {taus} | {pred} | "
              f"{'—' if label == 'ar' else same} |", flush=True)
