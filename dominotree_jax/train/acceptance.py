"""Teacher-forced per-depth acceptance of drafters on benchmark prompts and held-out data.

    python -m dominotree_jax.train.acceptance --drafter shipped --drafter runs/d1/drafter \\
        --n 10 --heldout-data data/smollm2 --json benchmarks/results/acceptance.json

For each prompt set, the target's greedy answers (``generate.generate_answers``, cached as
shards under ``--cache``, outside the repository: benchmark answers are never training data)
are drafted at anchors inside the answers; per depth we report how often the drafter's
corrected (Domino) and base (DFlash) heads predict the target's token when everything before
it is right, and the offline chain τ (leading correct depths + 1). Held-out data: the prompts
of a data directory whose hash falls in the held-out split (``dataset.heldout_bucket``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def parse_args(argv=None):
    from dominotree_jax.precision import add_precision_argument
    p = argparse.ArgumentParser(prog="python -m dominotree_jax.train.acceptance",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drafter", action="append", required=True,
                   help="released-format drafter directory, or 'shipped' (repeatable)")
    p.add_argument("--sets", default="humaneval,mtbench,math500")
    p.add_argument("--n", type=int, default=10, help="prompts per benchmark set")
    p.add_argument("--prompt-seed", type=int, default=123)
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--heldout-data", default=None, help="data directory for held-out prompts")
    p.add_argument("--heldout-pct", type=int, default=5)
    p.add_argument("--heldout-shards", type=int, default=None,
                   help="held-out prompts of the answer shards before this one (default: all)")
    p.add_argument("--heldout-trim-loops", type=int, default=0, metavar="W",
                   help="held-out answers end at their repetition loop (train/loops.py)")
    p.add_argument("--heldout-shard-from", type=int, default=0,
                   help="... from this answer shard on (e.g. a training run's --shard-from)")
    p.add_argument("--heldout-seqs", type=int, default=64)
    p.add_argument("--features", default="runs/features",
                   help="feature cache shared with training (the held-out data's features)")
    add_precision_argument(p, "--feature-precision", aliases=(), pairs=False,
                           help="weights of the target's features forward (train "
                                "--feature-precision)")
    p.add_argument("--anchors", type=int, default=24, help="blocks per sequence")
    p.add_argument("--cache", default="runs/acceptance")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def benchmark_store(target, name: str, n: int, seed: int, max_new: int, cache: str):
    """A shard store holding the target's greedy answers to ``n`` prompts of ``name``."""
    from dominotree_jax.measure.eval_prompts import load
    from dominotree_jax.train.generate import generate_answers
    from dominotree_jax.train.shards import ShardStore
    store = ShardStore(os.path.join(cache, f"{name}_n{n}_s{seed}_m{max_new}"),
                       vocab_size=target.config.vocab_size)
    items = [(target.chat_prompt(t), name) for t in load(name, n, seed)]
    generate_answers(target, store, items, batch=max(1, min(len(items), 16)), max_new=max_new,
                     seed=seed, log=lambda m: print(f"  {name}: {m}", flush=True))
    return store


def measure(target, drafters: dict, ds, seq_ids, anchors: int, seed: int = 0) -> dict:
    from dominotree_jax.train.trainer import evaluate
    out = {}
    for label, (cfg, params) in drafters.items():
        m = evaluate(cfg, params, target.config, target.params, ds, list(seq_ids),
                     anchors=anchors, batch=2, seed=seed, answer_frac=1.0)
        out[label] = {k: (v if isinstance(v, (int, float)) else [round(x, 4) for x in v])
                      for k, v in m.items()}
    return out


def main(argv=None):
    args = parse_args(argv)
    import dominotree_jax as dj
    from convert.drafter import load_drafter
    from dominotree_jax.assets import smollm2_drafter_path, smollm2_gguf_path
    from dominotree_jax.train.dataset import SequenceDataset
    from dominotree_jax.train.features import FeatureCache, cache_root
    from dominotree_jax.train.shards import ShardStore
    target = dj.load_target(smollm2_gguf_path())
    drafters = {}
    for d in args.drafter:
        path = smollm2_drafter_path() if d == "shipped" else d
        drafters[d] = load_drafter(path, dtype="float32", target_cfg=target.config)
    taps = {cfg.target_layer_ids for cfg, _ in drafters.values()}
    if len(taps) != 1:
        raise ValueError(f"drafters tap different target layers {taps}; evaluate separately")
    taps = taps.pop()
    results = {"settings": vars(args), "sets": {}}
    for name in [s for s in args.sets.split(",") if s]:
        store = benchmark_store(target, name, args.n, args.prompt_seed, args.max_new,
                                args.cache)
        feats = FeatureCache(os.path.join(store.root, "features"), target.config,
                             target.params, taps, precision=args.feature_precision)
        ds = SequenceDataset(store, feats, seq_len=512)
        results["sets"][name] = measure(target, drafters, ds, range(len(ds)), args.anchors)
        results["sets"][name]["_data"] = dict(zip(("prompt_tokens", "answer_tokens"),
                                                  ds.num_tokens()), seqs=len(ds))
        print(name, json.dumps(results["sets"][name]), flush=True)
    if args.heldout_data:
        store = ShardStore(args.heldout_data, vocab_size=target.config.vocab_size)
        hcache = FeatureCache(cache_root(args.features, args.heldout_data), target.config,
                              target.params, taps, precision=args.feature_precision)
        ds = SequenceDataset(store, hcache, seq_len=320, max_shards=args.heldout_shards,
                             first_shard=args.heldout_shard_from,
                             trim_loops=args.heldout_trim_loops)
        _, held = ds.split(args.heldout_pct)
        held = held[:args.heldout_seqs]
        held = held[:len(held) // 2 * 2]
        results["sets"]["heldout"] = measure(target, drafters, ds, held, args.anchors)
        results["sets"]["heldout"]["_data"] = dict(zip(("prompt_tokens", "answer_tokens"),
                                                       ds.num_tokens(held)), seqs=len(held))
        print("heldout", json.dumps(results["sets"]["heldout"]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)   # a Precision as its text
    return 0


if __name__ == "__main__":
    sys.exit(main())
