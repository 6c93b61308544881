"""Benchmark the decoding methods on HumanEval, MT-Bench and MATH500 prompts (batch 1).

    python -m benchmarks methods bench [--datasets humaneval,mtbench,math500]
        [--methods ar,dflash,domino,ddtree,condstatic,dominotree] [--temperatures 0,0.5,1]
        [--num-prompts 3] [--max-new-tokens 80] [--budget 16 --node-topk 8 --top-m 0]
        [--no-auto | --auto-only]
        [--drafter DIR|random] [--target PATH] [--precision float32|bfloat16|float32+bfloat16]
        [--out benchmarks/results]

Every drafting method runs at the fixed ``--budget`` and with ``budget="auto"`` (labelled
``<method>/auto``: each round picks its draft size by cost, see ``decoding/auto_size.py``; the
report gives the histogram of the sizes chosen).
Writes ``bench.json`` and ``bench.md`` under ``--out``.
The defaults are sized for a quick run on a 2-core CPU; a full run: ``--num-prompts 0``
(every prompt) and ``--max-new-tokens 256``. Without ``--drafter``
the shipped ``dominotree_jax/assets/smollm2-domino`` is used, or a random-init Domino drafter
(SmolLM2 shapes) when it is not there: τ is then ~1 and only the plumbing is measured.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from dominotree_jax.measure.default_pair import DEFAULT_DRAFTER, load_models, usable_methods
from dominotree_jax.precision import add_precision_argument

from benchmarks.common import command_line


def _csv(kind):
    return lambda s: tuple(kind(x) for x in s.split(",") if x.strip())


def parse_args(argv=None):
    from dominotree_jax.measure.eval_prompts import LOADERS
    from benchmarks.methods.bench_run import DEFAULT_BUCKETS, BenchSettings

    d = BenchSettings()
    ap = argparse.ArgumentParser(prog="python -m benchmarks methods bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", type=_csv(str), default=tuple(LOADERS))
    ap.add_argument("--methods", type=_csv(str), default=d.methods,
                    help="ar is always run: it is the speed and identity reference")
    ap.add_argument("--temperatures", type=_csv(float), default=d.temperatures)
    ap.add_argument("--num-prompts", type=int, default=3, help="per dataset; 0 = all")
    ap.add_argument("--sample-seed", type=int, default=None,
                    help="pick a seeded sample of prompts instead of the first N")
    ap.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    ap.add_argument("--budget", type=int, default=d.budget)
    ap.add_argument("--node-topk", type=int, default=d.node_topk)
    ap.add_argument("--top-m", type=int, default=d.top_m)
    auto = ap.add_mutually_exclusive_group()
    auto.add_argument("--no-auto", action="store_true", help="fixed budgets only")
    auto.add_argument("--auto-only", action="store_true",
                      help='budget="auto" only (and ar): no fixed-budget runs')
    ap.add_argument("--lookup", type=int, default=0, metavar="K",
                    help="also run each drafting method with K lookup paths (+lookup)")
    ap.add_argument("--buckets", type=_csv(int), default=DEFAULT_BUCKETS,
                    help="prompt pad widths (one compile per method, temperature and width)")
    ap.add_argument("--seed", type=int, default=d.seed, help="sampling seed (T > 0)")
    ap.add_argument("--target", default=None,
                    help="target .gguf / HF dir (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--drafter", default=None,
                    help=f"drafter dir, or 'random' (default: {DEFAULT_DRAFTER} if present, "
                         "else random)")
    add_precision_argument(ap, help="the pair's precision (one name, or target+drafter)")
    ap.add_argument("--out", default=os.path.join("benchmarks", "results"))
    ap.add_argument("--no-progress", action="store_true")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import jax

    from dominotree_jax.measure import eval_prompts as prompt_sets
    from benchmarks.methods.bench_run import BenchSettings, run_and_report

    command = command_line("methods", "bench", argv)
    t0 = time.perf_counter()
    pair, target_name, drafter_name = load_models(args.target, args.drafter, args.precision)
    settings = BenchSettings(
        methods=usable_methods(args.methods, pair.drafter_config),
        temperatures=args.temperatures, max_new_tokens=args.max_new_tokens, budget=args.budget,
        node_topk=args.node_topk, top_m=args.top_m, buckets=args.buckets, seed=args.seed,
        auto=not args.no_auto, auto_only=args.auto_only, lookup=args.lookup)
    n = args.num_prompts or None
    texts = {d: prompt_sets.load(d, n, args.sample_seed) for d in args.datasets}
    token_prompts = {d: [pair.target.chat_prompt(t) for t in ts] for d, ts in texts.items()}
    print(f"loaded models and prompts in {time.perf_counter() - t0:.1f}s; "
          f"{sum(map(len, token_prompts.values()))} prompts, "
          f"runs {[v[0] for v in settings.variants]}, "
          f"temperatures {settings.temperatures}, {jax.default_backend()}", file=sys.stderr)
    result = run_and_report(
        pair, token_prompts, settings, args.out, target_name=target_name,
        drafter_name=drafter_name, command=command, progress=not args.no_progress,
        extra_settings={"sample_seed": args.sample_seed, "dtype": str(args.precision)})
    from benchmarks.methods.bench_report import markdown
    print(markdown(result))
    print(f"wrote {', '.join(result['outputs'].values())}  (total {result['total_s']:.0f} s)",
          file=sys.stderr)
    if result["mismatches"]:
        print(f"!!! {len(result['mismatches'])} temperature-0 output(s) differ from ar",
              file=sys.stderr)
    return result
