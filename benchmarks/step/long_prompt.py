"""Long prompts on SmolLM2-135M (fp32): prefill time, per-token decode time and peak memory at
512 .. 8k prompt tokens, ours vs transformers, plus speculative tau and tokens/s.

The prompt is one chat turn: the repository's own documentation (README and docs/, repeated as
needed) cut to the target length, then "Summarize the document above". Every (engine, length)
runs in a fresh subprocess so that its peak resident memory (``ru_maxrss``) is its own:

- ours: ``prefill`` jitted alone (prefill s); per-token decode = (``decode`` AR of 5 + D new
  tokens - ``decode`` of 5) / D with D = ``--decode-tokens``, the two calls interleaved (the
  prefill they share cancels, with its noise). Compile excluded.
- transformers: ``generate`` with 1 new token (prefill s); per-token decode likewise from
  ``generate`` of 5 + D and of 5 tokens.
- speculative (ours): ``dominotree`` with the shipped drafter, budget 16, ``--spec-tokens``
  new tokens at temperature 0: mean tau and decode tokens/s (the time of a 1-token ``decode``
  subtracted).

2 threads each. "8k" is 8,000 tokens so that prompt + new tokens fit SmolLM2's 8,192 positions.

    python -m benchmarks step long_prompt [--lengths 512 1024 2048 4096 8000] [--runs 1]
        [--precision float32|bfloat16] [--hf-dtype float32|bfloat16] [--prefill-only]
        [--side-by-side]

``--precision`` (alias ``--dtype``): our pair's precision (docs/precision.md); ``--hf-dtype``:
transformers' torch dtype; ``--prefill-only``: only the prefill columns (no decode or
speculative runs); with ``--side-by-side`` both engines' prefills run in one subprocess, their
calls alternated run by run, so that a host whose speed drifts from minute to minute (a shared
2-core machine) gives a ratio of calls made in the same minutes (no peak memory then).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import time
from pathlib import Path

from benchmarks.common import RESULTS as RESULTS_DIR
from benchmarks.common import ROOT, python_m

RESULTS = RESULTS_DIR / "long_prompt.md"
WARM_TOKENS = 4   # per-token decode = (decode of 1 + 4 + D tokens - decode of 1 + 4) / D
QUESTION = "\n\nSummarize the document above in three sentences."


def prompt_ids(target, n_tokens: int) -> list[int]:
    """A chat prompt of exactly ``n_tokens`` tokens: documentation text, then the question."""
    tok = target.tokenizer
    docs = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
    text = "\n\n".join(p.read_text() for p in docs if p.exists())
    body = tok.encode(text, add_special_tokens=False)
    frame = len(target.chat_prompt(QUESTION))
    need = n_tokens - frame
    body = (body * (need // max(len(body), 1) + 1))[:need]
    ids = target.chat_prompt(tok.decode(body) + QUESTION)
    while len(ids) > n_tokens:  # re-tokenising the joined text can merge or split a token
        body = body[:len(body) - (len(ids) - n_tokens)]
        ids = target.chat_prompt(tok.decode(body) + QUESTION)
    return ids


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _median_time(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _median_times(fns, runs: int) -> list[float]:
    """Median seconds of each ``fn``, the calls interleaved run by run."""
    times = [[] for _ in fns]
    for _ in range(runs):
        for ts, fn in zip(times, fns):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def ours_prefill_call(n: int, precision="float32"):
    """``(call, pair, ids, compile_s, model_mb)``: our jitted ``prefill`` of an ``n``-token
    prompt; ``model_mb``: peak resident MB once the models are loaded, before any compile."""
    import jax
    import numpy as np

    from dominotree_jax.model.target import bind_target, prefill
    from dominotree_jax.measure.default_pair import load_models

    pair, _, _ = load_models(None, None, precision)
    target = pair.target
    ids = np.asarray([prompt_ids(target, n)], np.int32)
    lengths = np.asarray([ids.shape[1]], np.int32)
    cfg = target.config
    model_mb = _rss_mb()

    @jax.jit
    def prefill_only(params, prompt_BT, lengths_B):
        _, last = prefill(bind_target(cfg, params), prompt_BT, lengths_B, ids.shape[1] + 1)
        return last

    t0 = time.perf_counter()
    pre = prefill_only.lower(target.params, ids, lengths).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(pre(target.params, ids, lengths))
    return ((lambda: jax.block_until_ready(pre(target.params, ids, lengths))), pair, ids,
            compile_s, model_mb)


def transformers_generate(n: int, dtype: str = "float32"):
    """``(gen, ids, model_mb)``: ``gen(k)`` runs transformers' ``generate`` of ``k`` new tokens
    after the same ``n``-token prompt (greedy, no early stop), warmed up once; ``model_mb``: peak
    resident MB once the model is loaded, before the warm-up."""
    import torch
    from transformers import AutoModelForCausalLM

    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path

    torch.set_num_threads(2)
    path = smollm2_gguf_path()
    target = dj.load_target(path)
    ids = torch.tensor([prompt_ids(target, n)])
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                                 gguf_file=os.path.basename(path),
                                                 dtype=getattr(torch, dtype)).eval()
    model.generation_config.eos_token_id = None
    model_mb = _rss_mb()

    def gen(k):
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=k,
                                 min_new_tokens=k, do_sample=False, pad_token_id=0)
        assert out.shape[1] == ids.shape[1] + k

    gen(1)  # warm-up
    gen.attn_implementation = str(getattr(model.config, "_attn_implementation", "?"))
    return gen, ids, model_mb


def worker_side_by_side(n: int, runs: int, precision="float32", hf_dtype="float32") -> list:
    """Both prefills in this one process, their calls alternated run by run (``--side-by-side``:
    the host's drift lands on both); no peak memory (the process holds both models)."""
    ours, pair, ids, compile_s, _ = ours_prefill_call(n, precision)
    gen, _, _ = transformers_generate(n, hf_dtype)
    ours_s, hf_s = _median_times([ours, lambda: gen(1)], runs)
    return [dict(engine="ours", dtype=str(pair.precision), tokens=int(ids.shape[1]),
                 prefill_s=ours_s, compile_prefill_s=compile_s, side_by_side=True),
            dict(engine="transformers", dtype=hf_dtype, tokens=int(ids.shape[1]),
                 prefill_s=hf_s, side_by_side=True)]


def worker_ours(n: int, runs: int, decode_tokens: int, spec_tokens: int,
                precision="float32", prefill_only: bool = False) -> dict:
    import jax
    import jax.numpy as jnp

    import dominotree_jax as dj

    pre, pair, ids, compile_s, base_mb = ours_prefill_call(n, precision)
    target, cfg = pair.target, pair.target.config
    dtype = str(pair.precision)   # as the results record it
    prefill_s = _median_time(pre, runs)

    if prefill_only:
        return dict(engine="ours", dtype=dtype, tokens=int(ids.shape[1]), prefill_s=prefill_s,
                    compile_prefill_s=compile_s, peak_mb=_rss_mb(), model_mb=base_mb)
    fn = jax.jit(dj.decode, static_argnames="config")
    params = {"target": target.params, "drafter": None}

    def ar_program(new_tokens):
        c = dj.DecodeConfig(target=cfg, method="ar", max_new_tokens=new_tokens, stop_ids=())
        prog = fn.lower(params, jax.ShapeDtypeStruct(ids.shape, jnp.int32), config=c).compile()
        out = jax.block_until_ready(prog(params, ids))
        assert int(out.num_tokens[0]) == new_tokens
        return lambda: jax.block_until_ready(prog(params, ids))

    # per-token decode: the difference of two decodes that share the prefill, so the prefill's
    # own run-to-run noise does not land on a few decode tokens
    short, long_ = ar_program(1 + WARM_TOKENS), ar_program(1 + WARM_TOKENS + decode_tokens)
    short_s, long_s = _median_times([short, long_], runs)
    res = dict(engine="ours", tokens=int(ids.shape[1]), prefill_s=prefill_s,
               decode_ms=1e3 * max(long_s - short_s, 0.0) / decode_tokens,
               compile_prefill_s=compile_s)

    if spec_tokens:
        sc = pair.config("dominotree", max_new_tokens=spec_tokens, budget=16, stop_ids=())
        sp_c = fn.lower(pair.params, jax.ShapeDtypeStruct(ids.shape, jnp.int32),
                        config=sc).compile()
        out = jax.block_until_ready(sp_c(pair.params, ids))
        sp_s = _median_time(lambda: jax.block_until_ready(sp_c(pair.params, ids)), runs)
        got = int(out.num_tokens[0])
        rounds = max(int(out.num_rounds[0]), 1)
        # decode time = the call minus a 1-token call (prefill + first token) of the same width
        one_s = _median_time(ar_program(1), runs)
        res.update(spec_tau=(got - 1) / rounds,
                   spec_tok_s=(got - 1) / max(sp_s - one_s, 1e-9),
                   ar_tok_s=1e3 / max(res["decode_ms"], 1e-9))
    res.update(peak_mb=_rss_mb(), model_mb=base_mb)
    return res


def worker_transformers(n: int, runs: int, decode_tokens: int, dtype: str = "float32",
                        prefill_only: bool = False) -> dict:
    gen, ids, base_mb = transformers_generate(n, dtype)
    prefill_s = _median_time(lambda: gen(1), runs)
    if prefill_only:
        return dict(engine="transformers", dtype=dtype, tokens=int(ids.shape[1]),
                    prefill_s=prefill_s, peak_mb=_rss_mb(), model_mb=base_mb)
    short_s, long_s = _median_times([lambda: gen(1 + WARM_TOKENS),
                                     lambda: gen(1 + WARM_TOKENS + decode_tokens)], runs)
    return dict(engine="transformers", tokens=int(ids.shape[1]), prefill_s=prefill_s,
                decode_ms=1e3 * max(long_s - short_s, 0.0) / decode_tokens,
                peak_mb=_rss_mb(), model_mb=base_mb,
                attn=gen.attn_implementation)


def run_worker(engine: str, n: int, args) -> dict | None:
    cmd = python_m("step", "long_prompt", "--worker", engine, "--lengths", str(n), "--runs",
                   str(args.runs), "--decode-tokens", str(args.decode_tokens), "--spec-tokens",
                   str(args.spec_tokens), "--precision", str(args.precision),
                   "--hf-dtype", args.hf_dtype)
    cmd += ["--prefill-only"] if args.prefill_only else []
    cmd += ["--side-by-side"] if engine == "both" else []
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
    if proc.returncode != 0:
        print(f"{engine} @ {n}: failed\n{proc.stderr[-2000:]}", flush=True)
        return None
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    wall = time.perf_counter() - t0
    for r in res if isinstance(res, list) else [res]:
        r["wall_s"] = wall
        print(json.dumps(r), flush=True)
    return res


def table(rows: list[dict], args) -> str:
    by = {(r["engine"], r["tokens"]): r for r in rows}
    lengths = sorted({r["tokens"] for r in rows if r["engine"] == "ours"})
    short = by.get(("ours", lengths[0])) if lengths else None
    lines = [
        "| prompt tokens | prefill ours s | prefill transformers s | prefill ours / transformers "
        "| decode ours ms/tok "
        "| decode transformers ms/tok | ours decode / shortest | peak MB ours (+ over model) "
        "| peak MB transformers (+) | dominotree tau | dominotree tok/s | ar tok/s |",
        "|---:|" + "---:|" * 11]
    for n in lengths:
        o = by[("ours", n)]
        h = next((r for r in rows if r["engine"] == "transformers"
                  and abs(r["tokens"] - n) <= 2), None)
        cell = lambda r, k, f: (f.format(r[k]) if r and k in r else "–")  # noqa: E731
        ratio = f"{o['prefill_s'] / h['prefill_s']:.2f}" if h else "–"
        lines.append(
            f"| {n} | {o['prefill_s']:.2f} | {cell(h, 'prefill_s', '{:.2f}')} | {ratio} | "
            f"{o['decode_ms']:.1f} | {cell(h, 'decode_ms', '{:.1f}')} | "
            f"{o['decode_ms'] / short['decode_ms']:.2f} | "
            f"{o['peak_mb']:.0f} (+{o['peak_mb'] - o['model_mb']:.0f}) | "
            + (f"{h['peak_mb']:.0f} (+{h['peak_mb'] - h['model_mb']:.0f})" if h else "–")
            + f" | {cell(o, 'spec_tau', '{:.2f}')} | {cell(o, 'spec_tok_s', '{:.1f}')} | "
            f"{cell(o, 'ar_tok_s', '{:.1f}')} |")
    return "\n".join(lines)


def prefill_table(rows: list[dict], args) -> str:
    """Prefill seconds per prompt length: ours (``--precision``) vs transformers
    (``--hf-dtype``)."""
    lines = [f"Prefill, SmolLM2-135M-Instruct, batch 1, 2 threads, median of {args.runs}: ours "
             f"{args.precision}, transformers {args.hf_dtype}"
             + ("; both in one process, calls alternated run by run." if args.side_by_side
                else "; each engine in its own process.") + "", "",
             "| prompt tokens | prefill ours s | prefill transformers s | transformers / ours "
             "| peak MB ours | peak MB transformers |", "|---:|---:|---:|---:|---:|---:|"]
    for r in (r for r in rows if r["engine"] == "ours"):
        h = next((x for x in rows if x["engine"] == "transformers"
                  and abs(x["tokens"] - r["tokens"]) <= 2), None)
        lines.append(f"| {r['tokens']} | {r['prefill_s']:.2f} | "
                     + (f"{h['prefill_s']:.2f} | {h['prefill_s'] / r['prefill_s']:.2f}x | "
                        if h else "– | – | ")
                     + (f"{r['peak_mb']:.0f} | " if "peak_mb" in r else "– | ")
                     + (f"{h['peak_mb']:.0f} |" if h and "peak_mb" in h else "– |"))
    return "\n".join(lines)


def main(argv=None):
    from dominotree_jax.precision import BENCHMARKED_PRECISIONS, add_precision_argument
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8000])
    ap.add_argument("--engines", nargs="+", default=["ours", "transformers"])
    ap.add_argument("--runs", type=int, default=1, help="timed runs per measurement (median)")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--spec-tokens", type=int, default=64, help="0 = skip speculative")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per subprocess")
    ap.add_argument("--out", type=Path, default=RESULTS)
    add_precision_argument(ap, help="our pair's precision")
    ap.add_argument("--hf-dtype", default="float32", choices=BENCHMARKED_PRECISIONS,
                    help="transformers' torch dtype")
    ap.add_argument("--prefill-only", action="store_true")
    ap.add_argument("--side-by-side", action="store_true",
                    help="with --prefill-only: both engines in one process, their calls "
                         "alternated run by run (no peak memory)")
    ap.add_argument("--worker", choices=["ours", "transformers", "both"],
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.side_by_side and not args.prefill_only:
        ap.error("--side-by-side times the prefill only: add --prefill-only")
    if args.worker == "both":
        print(json.dumps(worker_side_by_side(args.lengths[0], args.runs, args.precision,
                                             args.hf_dtype)))
        return
    if args.worker:
        n = args.lengths[0]
        res = (worker_ours(n, args.runs, args.decode_tokens, args.spec_tokens, args.precision,
                           args.prefill_only)
               if args.worker == "ours" else worker_transformers(
                   n, args.runs, args.decode_tokens, args.hf_dtype, args.prefill_only))
        print(json.dumps(res))
        return
    rows = []
    for n in args.lengths:
        for engine in (["both"] if args.side_by_side else args.engines):
            r = run_worker(engine, n, args)
            if r:
                rows += r if isinstance(r, list) else [r]
    if args.prefill_only:
        text = prefill_table(rows, args)
        print(text)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        return
    text = (f"SmolLM2-135M-Instruct fp32, batch 1, 2 threads, {args.runs} timed run(s) per "
            f"cell, {args.decode_tokens} decode tokens, speculative: dominotree budget 16, "
            f"{args.spec_tokens} new tokens, T=0. Shared, noisy 2-core machine.\n\n"
            + table(rows, args))
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    (args.out.with_suffix(".json")).write_text(json.dumps(rows, indent=1) + "\n")
