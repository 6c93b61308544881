"""Teacher-forced per-depth acceptance of drafters on benchmark prompts and held-out data.

    python -m dominotree_jax.train.eval acceptance --drafter shipped --drafter runs/d1/drafter \\
        --n 10 --heldout-data data/smollm2 --json benchmarks/results/acceptance.json

For each prompt set, the target's greedy answers (``generate.generate_answers``, cached as
shards under ``--cache``, outside the repository: benchmark answers are never training data)
are drafted at anchors inside the answers; per depth we report how often the drafter's
corrected (Domino) and base (DFlash) heads predict the target's token when everything before
it is right, and the offline chain τ (leading correct depths + 1). Held-out data: the prompts
of a data directory whose hash falls in the held-out split (``dataset.heldout_bucket``).

The same measurement is a campaign's ship gate (``BenchmarkEval``), and ``tree`` and ``ablate``
read their held-out sequences through ``heldout_set``.
"""

from __future__ import annotations

import argparse
import json
import os

DEFAULT_SETS = ("humaneval", "mtbench", "math500")


def benchmark_store(target, name: str, n: int, seed: int, max_new: int, cache: str):
    """A shard store holding the target's greedy answers to ``n`` prompts of ``name``."""
    from dominotree_jax.measure.eval_prompts import load
    from dominotree_jax.train.data.generate import generate_answers
    from dominotree_jax.train.data.shards import ShardStore
    store = ShardStore(os.path.join(cache, f"{name}_n{n}_s{seed}_m{max_new}"),
                       vocab_size=target.config.vocab_size)
    items = [(target.chat_prompt(t), name) for t in load(name, n, seed)]
    generate_answers(target, store, items, batch=max(1, min(len(items), 16)), max_new=max_new,
                     seed=seed, log=lambda m: print(f"  {name}: {m}", flush=True))
    return store


def benchmark_sets(target, names, *, n: int, taps, precision="float32", seed: int = 123,
                   max_new: int = 128, cache: str = "runs/acceptance") -> dict:
    """``{name: SequenceDataset}`` of the target's greedy answers to ``n`` prompts of each set
    (``benchmark_store``), with the features of ``taps`` cached beside them."""
    from dominotree_jax.train.dataset import SequenceDataset
    from dominotree_jax.train.features import FeatureCache
    out = {}
    for name in names:
        store = benchmark_store(target, name, n, seed, max_new, cache)
        feats = FeatureCache(os.path.join(store.root, "features"), target.config,
                             target.params, taps, precision=precision)
        out[name] = SequenceDataset(store, feats, seq_len=512)
    return out


def heldout_set(target, data: str, taps, *, features: str = "runs/features",
                precision="float32", pct: int = 5, seqs: int = 64, shards: int | None = None,
                shard_from: int = 0, trim_loops: int = 0, seq_len: int = 320, log=None):
    """``(dataset, ids)``: the held-out sequences of a data directory (``dataset.split(pct)``;
    the first ``seqs``, an even count), features cached under ``features`` as training does."""
    from dominotree_jax.train.data.shards import ShardStore
    from dominotree_jax.train.dataset import SequenceDataset
    from dominotree_jax.train.features import FeatureCache, cache_root
    store = ShardStore(data, vocab_size=target.config.vocab_size)
    feats = FeatureCache(cache_root(features, data), target.config, target.params, taps,
                         precision=precision, log=log)
    ds = SequenceDataset(store, feats, seq_len=seq_len, max_shards=shards,
                         first_shard=shard_from, trim_loops=trim_loops)
    held = ds.split(pct)[1][:seqs]
    return ds, held[:len(held) // 2 * 2]


def chain_metrics(target, dcfg, params, ds, ids, anchors: int, seed: int = 0) -> dict:
    """Teacher-forced per-depth accuracies and chain τ of both heads on blocks anchored inside
    the answers of ``ds``'s sequences ``ids`` (``trainer.evaluate``, pairs of sequences)."""
    from dominotree_jax.train.trainer import evaluate
    return evaluate(dcfg, params, target.config, target.params, ds, list(ids), anchors=anchors,
                    batch=2, seed=seed, answer_frac=1.0)


class BenchmarkEval:
    """Chain τ of both heads on the benchmark sets (``benchmark_sets``; cached under ``runs/``,
    never training data): a campaign's ship gate. ``evaluator(dcfg, params)`` returns
    ``{set: {"tau_corr", "tau_base"}, "mean_tau_corr"}``."""

    def __init__(self, target, taps, *, sets=DEFAULT_SETS, n: int = 10, anchors: int = 24,
                 precision="float32", cache: str = "runs/acceptance"):
        self.target, self.anchors = target, anchors
        self.sets = benchmark_sets(target, sets, n=n, taps=taps, precision=precision,
                                   cache=cache)

    def __call__(self, dcfg, params) -> dict:
        import numpy as np
        out = {}
        for name, ds in self.sets.items():
            m = chain_metrics(self.target, dcfg, params, ds, range(len(ds)), self.anchors)
            out[name] = {"tau_corr": m["tau_corr"], "tau_base": m["tau_base"]}
        out["mean_tau_corr"] = float(np.mean([v["tau_corr"] for v in out.values()]))
        return out


def measure(target, drafters: dict, ds, seq_ids, anchors: int, seed: int = 0) -> dict:
    out = {}
    for label, (cfg, params) in drafters.items():
        m = chain_metrics(target, cfg, params, ds, seq_ids, anchors, seed)
        out[label] = {k: (v if isinstance(v, (int, float)) else [round(x, 4) for x in v])
                      for k, v in m.items()}
    return out


def parse_args(argv=None):
    from dominotree_jax.precision import add_precision_argument
    p = argparse.ArgumentParser(prog="python -m dominotree_jax.train.eval acceptance",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drafter", action="append", required=True,
                   help="released-format drafter directory, or 'shipped' (repeatable)")
    p.add_argument("--sets", default=",".join(DEFAULT_SETS))
    p.add_argument("--n", type=int, default=10, help="prompts per benchmark set")
    p.add_argument("--prompt-seed", type=int, default=123)
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--heldout-data", default=None, help="data directory for held-out prompts")
    p.add_argument("--heldout-pct", type=int, default=5)
    p.add_argument("--heldout-shards", type=int, default=None,
                   help="held-out prompts of the answer shards before this one (default: all)")
    p.add_argument("--heldout-trim-loops", type=int, default=0, metavar="W",
                   help="held-out answers end at their repetition loop (train/data/loops.py)")
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


def main(argv=None):
    args = parse_args(argv)
    import dominotree_jax as dj
    from convert.drafter import load_drafter
    from dominotree_jax.assets import smollm2_gguf_path
    from dominotree_jax.train.run import drafter_path
    target = dj.load_target(smollm2_gguf_path())
    drafters = {d: load_drafter(drafter_path(d), dtype="float32", target_cfg=target.config)
                for d in args.drafter}
    taps = {cfg.target_layer_ids for cfg, _ in drafters.values()}
    if len(taps) != 1:
        raise ValueError(f"drafters tap different target layers {taps}; evaluate separately")
    taps = taps.pop()
    results = {"settings": vars(args), "sets": {}}
    names = [s for s in args.sets.split(",") if s]
    for name in names:   # one set at a time: each printed as soon as it is measured
        ds = benchmark_sets(target, [name], n=args.n, taps=taps, seed=args.prompt_seed,
                            max_new=args.max_new, precision=args.feature_precision,
                            cache=args.cache)[name]
        results["sets"][name] = measure(target, drafters, ds, range(len(ds)), args.anchors)
        results["sets"][name]["_data"] = dict(zip(("prompt_tokens", "answer_tokens"),
                                                  ds.num_tokens()), seqs=len(ds))
        print(name, json.dumps(results["sets"][name]), flush=True)
    if args.heldout_data:
        ds, held = heldout_set(target, args.heldout_data, taps, features=args.features,
                               precision=args.feature_precision, pct=args.heldout_pct,
                               seqs=args.heldout_seqs, shards=args.heldout_shards,
                               shard_from=args.heldout_shard_from,
                               trim_loops=args.heldout_trim_loops)
        results["sets"]["heldout"] = measure(target, drafters, ds, held, args.anchors)
        results["sets"]["heldout"]["_data"] = dict(zip(("prompt_tokens", "answer_tokens"),
                                                       ds.num_tokens(held)), seqs=len(held))
        print("heldout", json.dumps(results["sets"]["heldout"]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)   # a Precision as its text
    return 0
