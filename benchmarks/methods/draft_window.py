"""τ and tokens/s against prompt length, with and without a drafter window (issue 12 item 2).

SmolLM2-135M-Instruct (GGUF, context 8,192) with the shipped Domino drafter. Each prompt is a
long Python document (HumanEval prompts one after another) followed by one HumanEval task, in
the chat template, cut to exactly ``T`` tokens from the front. For every length and prompt,
``ar`` and each drafter setting decode ``--new`` tokens at temperature 0; every output must equal
``ar``'s (lossless). Prompts are right-padded to the longest length so that every setting
compiles once; timing is the compiled call up to ``block_until_ready`` (median of
``--repeats``), so it includes the (padded) prefill.

    python -m benchmarks methods draft_window --lengths 256 1024 2048 4096 --windows 256 \
        --out benchmarks/results/draft_window.md
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import dominotree_jax as dj
from dominotree_jax.assets import smollm2_drafter_path, smollm2_gguf_path
from dominotree_jax.measure.eval_prompts import humaneval


def long_prompt(pair, length: int, index: int) -> np.ndarray:
    tasks = humaneval()
    doc = "\n".join(t.split("```python\n", 1)[1].rstrip("`") for t in tasks[index + 1:])
    text = f"Here is some Python code:\n```python\n{doc}```\n\n{tasks[index]}"
    ids = pair.target.chat_prompt(text)
    if len(ids) < length:
        raise ValueError(f"prompt {index} has only {len(ids)} tokens, fewer than {length}")
    return np.asarray(ids[-length:], np.int32)


def run(args, report) -> None:
    """Prompts right-padded to one width (``prompt_lengths`` hides the padding), so each
    setting compiles once, ahead of time, for every length."""
    pair = dj.load_pair(smollm2_gguf_path(), smollm2_drafter_path())
    settings = [("ar", None)] + [(args.method, None)] + [(args.method, w) for w in args.windows]
    width = max(args.lengths)
    compiled = {}
    for method, window in settings:
        cfg = pair.config(method, max_new_tokens=args.new, temperature=0.0,
                          draft_window=window, stop_ids=())
        t = time.perf_counter()
        compiled[(method, window)] = jax.jit(dj.decode, static_argnames="config").lower(
            pair.params, jnp.zeros((1, width), jnp.int32), config=cfg,
            prompt_lengths=jnp.ones((1,), jnp.int32)).compile()
        print(f"compiled {method} window={window} in {time.perf_counter() - t:.0f} s",
              flush=True)
    for length in args.lengths:
        per = {s: {"tau": [], "tps": []} for s in settings}
        for index in range(args.prompts):
            ids = long_prompt(pair, length, index)
            prompt = jnp.asarray(np.pad(ids, (0, width - length)))[None]
            lengths = jnp.asarray([length], jnp.int32)
            ref = None
            for setting in settings:
                times = []
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    out = jax.block_until_ready(compiled[setting](pair.params, prompt,
                                                                  prompt_lengths=lengths))
                    times.append(time.perf_counter() - t)
                toks = np.asarray(out.tokens[0, :int(out.num_tokens[0])])
                if ref is None:
                    ref = toks
                elif not np.array_equal(toks, ref):
                    raise AssertionError(f"T={length} prompt {index} {setting}: output differs "
                                         "from ar")
                n, rounds = len(toks), max(int(out.num_rounds[0]), 1)
                per[setting]["tau"].append(n / rounds)
                per[setting]["tps"].append(n / statistics.median(times))
                print(f"T={length} prompt {index} {setting}: tau {n / rounds:.2f}, "
                      f"{per[setting]['tps'][-1]:.2f} tok/s", flush=True)
        report([f"| {length} | {method} | {window or '-'} | {statistics.mean(v['tau']):.2f} | "
                f"{statistics.median(v['tps']):.2f} |" for (method, window), v in per.items()])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048, 4096])
    ap.add_argument("--windows", type=int, nargs="+", default=[256])
    ap.add_argument("--method", default="dflash")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    table = ["| prompt T | method | draft_window | τ | tok/s (incl. prefill) |",
             "|---|---|---|---|---|"]

    def report(rows):  # rewrite the file after every length, so partial runs leave a table
        table.extend(rows)
        print("\n".join(table), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                f.write("# Drafter window: τ and speed against prompt length\n\n")
                f.write(f"- command: `python -m benchmarks methods draft_window --lengths "
                        f"{' '.join(map(str, args.lengths))} --windows "
                        f"{' '.join(map(str, args.windows))} --method {args.method} --prompts "
                        f"{args.prompts} --new {args.new} --repeats {args.repeats} --out "
                        f"{args.out}`\n")
                f.write(f"- machine: {jax.devices()[0].device_kind}; every prompt right-padded "
                        f"to {max(args.lengths)} tokens (one compile per setting); median of "
                        f"{args.repeats} timed call(s), compile excluded; every output equals "
                        "ar's (checked)\n\n")
                f.write("\n".join(table) + "\n")

    run(args, report)
