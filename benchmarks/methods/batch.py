"""Batched speculative decoding on SmolLM2-135M: tokens/s per method and batch size.

Each batch size ``b`` decodes the same prompts (MT-Bench first turns from
``dominotree_jax.measure.eval_prompts`` when available, else a fixed list of 16 chat prompts) as
``len(prompts) / b`` right-padded batches of ``b`` rows. tokens/s = generated tokens (each row
stops at its own end token or ``--new-tokens``) / wall time of the compiled calls (compile and a
warm-up call excluded). Speedup is over batched ``ar`` at the same batch size. At temperature 0
every method must emit ``ar``'s tokens: mismatching rows are counted in the table.

The drafter is the shipped ``dominotree_jax/assets/smollm2-domino`` when present, else a
random-init Domino drafter (acceptance ~1 token per round: it measures costs, not speedups).

    python -m benchmarks methods batch [--batch-sizes 1 4 16] [--prompts 16] [--new-tokens 64]
        [--methods ar dominotree] [--budgets 16 auto]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import dominotree_jax as dj
from dominotree_jax.decoding.auto_size import initial_state
from dominotree_jax.decoding.config import METHODS
from dominotree_jax.measure.default_pair import load_models

FALLBACK_PROMPTS = [
    "Write a haiku about autumn leaves.", "Explain what a hash table is in two sentences.",
    "Give three tips for learning a new language.", "What causes the seasons on Earth?",
    "Write a Python function that reverses a string.", "Summarize the plot of Romeo and Juliet.",
    "List five fruits that are high in vitamin C.", "How does a rainbow form?",
    "Describe a cat to someone who has never seen one.", "What is the capital of Australia?",
    "Write a short thank-you note to a teacher.", "Explain recursion with a simple example.",
    "What are the benefits of regular exercise?", "Translate 'good morning' into French.",
    "Why is the sky blue?", "Suggest a name for a bakery and explain it.",
]


def load_prompts(n: int) -> tuple[list[str], str]:
    try:
        from dominotree_jax.measure import eval_prompts as prompts
        return prompts.mtbench(n), "mtbench (dominotree_jax.measure.eval_prompts)"
    except (ImportError, FileNotFoundError):
        return (FALLBACK_PROMPTS * (n // len(FALLBACK_PROMPTS) + 1))[:n], "fixed chat prompts"


def load_pair() -> tuple[dj.Pair, str]:
    """SmolLM2-135M and the shipped drafter (a random-init one when it is not there)."""
    pair, _, drafter_name = load_models()
    return pair, drafter_name


def batches(ids: list[list[int]], size: int, width: int):
    """Right-padded ``([size, width], [size])`` batches of consecutive prompts."""
    for i in range(0, len(ids) - size + 1, size):
        chunk = ids[i:i + size]
        prompt_BT = np.zeros((size, width), np.int32)
        for b, row in enumerate(chunk):
            prompt_BT[b, :len(row)] = row
        yield prompt_BT, np.array([len(r) for r in chunk], np.int32)


def run_method(pair, cfg, ids, size, width):
    """(tokens/s, rows [list of token lists], mean tau per round, compile s) for one method
    and batch size (the first token of each row comes from the prefill, not a round)."""
    fn = jax.jit(dj.decode, static_argnames="config")
    # budget="auto": the policy state is carried from batch to batch (as a server or RL loop
    # would); the first batch starts from the optimistic default
    state = initial_state(cfg, size) if cfg.is_auto else None
    t0 = time.perf_counter()
    compiled = fn.lower(pair.params, jax.ShapeDtypeStruct((size, width), jnp.int32), config=cfg,
                        prompt_lengths=jax.ShapeDtypeStruct((size,), jnp.int32),
                        auto_state=state).compile()
    compile_s = time.perf_counter() - t0
    todo = list(batches(ids, size, width))
    jax.block_until_ready(compiled(pair.params, todo[0][0], prompt_lengths=todo[0][1],
                                   auto_state=state))  # warm-up
    rows, wall, tokens, taus, rounds = [], 0.0, 0, 0, 0
    for prompt_BT, lengths_B in todo:
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(pair.params, prompt_BT, prompt_lengths=lengths_B,
                                             auto_state=state))
        wall += time.perf_counter() - t0
        state = out.auto_state
        n_B = np.asarray(out.num_tokens)
        tokens += int(n_B.sum())
        taus += int(np.asarray(out.accept_lengths).sum())
        rounds += int(np.asarray(out.num_rounds).sum())
        rows += [np.asarray(out.tokens)[b, :n].tolist() for b, n in enumerate(n_B)]
    return tokens / wall, rows, taus / max(rounds, 1), compile_s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--prompts", type=int, default=16, help="prompts per batch size")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--budgets", nargs="+", default=["16", "auto"],
                    help="draft budgets of the speculative methods: node counts and/or 'auto'")
    args = ap.parse_args(argv)
    budgets = [b if b == "auto" else int(b) for b in args.budgets]
    methods = ["ar"] + [m for m in args.methods if m != "ar"]

    pair, drafter_name = load_pair()
    texts, prompt_source = load_prompts(args.prompts)
    ids = [pair.target.chat_prompt(t) for t in texts]
    width = max(len(r) for r in ids)
    print(f"target: SmolLM2-135M-Instruct (fp32)   drafter: {drafter_name}")
    print(f"prompts: {len(ids)} from {prompt_source}, padded to {width} tokens; "
          f"{args.new_tokens} new tokens, temperature 0, {jax.device_count()} "
          f"{jax.devices()[0].platform} device(s)\n")
    print("| batch | method | budget | tokens/s | speedup vs ar | mean tau | rows != ar | "
          "compile s |")
    print("|---:|---|---|---:|---:|---:|---:|---:|")
    for size in args.batch_sizes:
        if size > len(ids):
            print(f"| {size} | (skipped: only {len(ids)} prompts) | | | | | |")
            continue
        ar_speed, ar_rows = None, None
        for method in methods:
            for budget in ([None] if method == "ar" else budgets):
                kw = {} if budget is None else {"budget": budget}
                cfg = pair.config(method, max_new_tokens=args.new_tokens, **kw)
                speed, rows, tau, compile_s = run_method(pair, cfg, ids, size, width)
                if method == "ar":
                    ar_speed, ar_rows = speed, rows
                bad = sum(r != a for r, a in zip(rows, ar_rows))
                print(f"| {size} | {method} | {'–' if budget is None else budget} | "
                      f"{speed:.1f} | {speed / ar_speed:.2f}x | {tau:.2f} | {bad} | "
                      f"{compile_s:.0f} |", flush=True)
