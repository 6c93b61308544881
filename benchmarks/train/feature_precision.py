"""The features stage's teacher-forced target forward (``train/features.py teacher_forced``) on
float32 and on bf16 weights, side by side in one process: tokens/s of each and how far the bf16
final hidden states are from float32's (relative Frobenius norm). Random token ids; each shape
compiles once per precision, then the timed calls interleave (``timing.interleaved_medians``).
Prints a markdown table.

    python -m benchmarks train feature_precision [--shapes 8x256,8x512] [--repeats 4]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in (s for s in text.split(",") if s):
        try:
            b, w = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--shapes: {item!r} is not BATCHxWIDTH (e.g. 8x256)") from None
        if b < 1 or w < 1:
            raise SystemExit(f"--shapes: {item!r} needs a positive batch and width")
        shapes.append((b, w))
    if not shapes:
        raise SystemExit("--shapes: give at least one BATCHxWIDTH")
    return shapes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8x256,8x512", help="BATCHxWIDTH, comma-separated")
    ap.add_argument("--taps", default="1,15,27")
    ap.add_argument("--repeats", type=int, default=4)
    args = ap.parse_args(argv)
    shapes = parse_shapes(args.shapes)
    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path
    from dominotree_jax.precision import cast_params
    from dominotree_jax.measure.timing import bf16_units, cpu_model, interleaved_medians
    from dominotree_jax.train.features import teacher_forced
    target = dj.load_target(smollm2_gguf_path(), tokenizer=False)
    cfg, taps = target.config, tuple(int(t) for t in args.taps.split(","))
    params = {"float32": target.params, "bfloat16": cast_params(target.params, "bfloat16")}
    print(f"features forward, {cpu_model()} (bf16 units: {bf16_units() or 'none'}), "
          f"jax {jax.__version__}, taps {taps}, median of {args.repeats} interleaved calls\n")
    print("| batch x width | float32 s | float32 tok/s | bf16 s | bf16 tok/s | bf16 speed-up "
          "| hidden rel. diff |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for B, W in shapes:
        toks = jnp.asarray(np.random.default_rng(0).integers(100, cfg.vocab_size, (B, W)),
                           jnp.int32)
        fns = {p: (lambda p=p: teacher_forced(params[p], toks, cfg=cfg, taps=taps))
               for p in params}
        ms = interleaved_medians(fns, repeats=args.repeats, warmup=1)
        h32, h16 = (fns[p]()[1].astype(jnp.float32) for p in ("float32", "bfloat16"))
        rel = float(jnp.linalg.norm(h32 - h16) / jnp.linalg.norm(h32))
        s32, s16 = ms["float32"] / 1e3, ms["bfloat16"] / 1e3
        print(f"| {B} x {W} | {s32:.2f} | {B * W / s32:.0f} | {s16:.2f} | {B * W / s16:.0f} "
              f"| {s32 / s16:.2f}x | {rel:.4f} |", flush=True)
