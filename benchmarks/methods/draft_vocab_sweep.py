"""A draft vocabulary at decode time, side by side in one process: the shipped drafter over the
full vocabulary and restricted (exactly: ``model.drafter.restrict_to_draft_vocab``) to its
``|D|`` most frequent answer tokens, for ``|D|`` = 8k, 16k, 32k. Per variant: the held-out
coverage of ``D``, and on the benchmark prompts DominoTree's τ, tok/s and round cost in
``ar`` steps (``ar`` timed in the same pass over the prompts, every prompt running every
variant in turn).

    python -m benchmarks methods draft_vocab_sweep --num-prompts 3 --max-new-tokens 128 \\
        --json benchmarks/results/drafter_v5/draft_vocab_sweep.json
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8192,16384,32768")
    ap.add_argument("--datasets", default="humaneval,mtbench,math500")
    ap.add_argument("--num-prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--top-m", type=int, default=0)
    ap.add_argument("--data", default="data/smollm2")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import jax

    from benchmarks.methods.bench_run import CompiledDecoders, bucket_width, pad_prompt
    from dominotree_jax.measure import eval_prompts
    from dominotree_jax.measure.default_pair import load_models
    from dominotree_jax.model.drafter import restrict_to_draft_vocab
    from dominotree_jax.measure.timing import bf16_units, cpu_model
    from dominotree_jax.train.dataset import SequenceDataset
    from dominotree_jax.train.features import TokensOnly
    from dominotree_jax.train.draft_vocab import answer_token_counts, most_frequent, share_inside
    from dominotree_jax.train.data.shards import ShardStore

    pair, _, drafter_name = load_models(None, None, "float32")
    V = pair.target.config.vocab_size
    ds = SequenceDataset(ShardStore(args.data), TokensOnly(), seq_len=1 << 20)
    train_ids, held_ids = ds.split(5)
    train_counts = answer_token_counts(ds, train_ids, V)
    held_counts = answer_token_counts(ds, held_ids, V)
    variants = {"full": (pair.drafter_config, pair.params["drafter"], 1.0)}
    for size in (int(x) for x in args.sizes.split(",")):
        d2t = most_frequent(train_counts, size)
        cfg, params = restrict_to_draft_vocab(pair.drafter_config, pair.params["drafter"], d2t)
        variants[f"{size // 1024}k"] = (cfg, params, share_inside(held_counts, d2t))
    decoders, configs = {}, {}
    for name, (cfg, params, _) in variants.items():
        decoders[name] = CompiledDecoders({"target": pair.params["target"], "drafter": params})
        configs[name] = pair.config("dominotree", max_new_tokens=args.max_new_tokens,
                                    budget=args.budget, top_m=args.top_m).replace(drafter=cfg)
    ar_cfg = pair.config("ar", max_new_tokens=args.max_new_tokens)
    rows = {name: {"tokens": 0, "rounds": 0, "wall": 0.0} for name in ["ar", *variants]}
    mismatches = 0
    for dname in args.datasets.split(","):
        for text in eval_prompts.load(dname, args.num_prompts):
            ids = pair.target.chat_prompt(text)
            p = pad_prompt(ids, bucket_width(len(ids), (128, 256, 512, 1024)))
            key = jax.random.key(0)
            ref, wall = decoders["full"](ar_cfg, p, len(ids), key)
            rows["ar"]["tokens"] += int(ref.num_tokens[0])
            rows["ar"]["rounds"] += int(ref.num_rounds[0])
            rows["ar"]["wall"] += wall
            for name in variants:
                out, wall = decoders[name](configs[name], p, len(ids), key)
                mismatches += int(not np.array_equal(out.tokens, ref.tokens))
                r = rows[name]
                r["tokens"] += int(out.num_tokens[0])
                r["rounds"] += int(out.num_rounds[0])
                r["wall"] += wall
    ar_tok_s = rows["ar"]["tokens"] / rows["ar"]["wall"]
    table = []
    for name, r in rows.items():
        tok_s = r["tokens"] / r["wall"]
        tau = r["tokens"] / max(r["rounds"], 1)
        table.append({"variant": name, "coverage": None if name == "ar" else
                      round(variants[name][2], 4), "tau": round(tau, 3),
                      "tok_s": round(tok_s, 1), "x_ar": round(tok_s / ar_tok_s, 3),
                      "round_cost_ar_steps": round(tau * ar_tok_s / tok_s, 3)})
    out = {"cpu": f"{cpu_model()} ({bf16_units()})", "drafter": drafter_name,
           "date": time.strftime("%Y-%m-%d"), "settings": vars(args), "table": table,
           "t0_mismatches_vs_ar": mismatches}
    print("| variant | coverage | τ | tok/s | × ar | round / AR step |")
    print("|---|---:|---:|---:|---:|---:|")
    for t in table:
        print(f"| {t['variant']} | {t['coverage']} | {t['tau']} | {t['tok_s']} | {t['x_ar']} | "
              f"{t['round_cost_ar_steps']} |")
    print(f"T=0 mismatches against ar: {mismatches}; {out['cpu']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
