"""One-row products (an AR step's matvecs) in every form we could run them: layout and bf16 form.

For each SmolLM2-135M weight shape ``[O, I]`` (the LM head once; the layer weights as a jitted
chain of 30, like 30 layers, to amortise the dispatch), ``x [1, I]`` times the weight as: the
float32 dot over ``[O, I]`` (the checkpoint layout, what ``linalg.matmul_t`` runs) and over a
transposed ``[I, O]`` copy; a fused multiply + row sum; the bf16 x bf16 -> float32 dot in both
layouts; a fused bf16 -> float32 convert + multiply + sum; and the bf16 weight upcast then the
float32 dot. Median ms of ``--repeats`` calls, and the weight bytes read per second.

    python -m benchmarks step matvec_forms [--repeats 30]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.step.profile import timed

SHAPES = ((49152, 576), (1536, 576), (576, 1536), (576, 576))   # head, gate/up, down, q/o
OI = (((1,), (1,)), ((), ()))   # x [1, I] . w [O, I]
IO = (((1,), (0,)), ((), ()))   # x [1, I] . w [I, O]
BF16 = jnp.bfloat16
F32 = jnp.float32

FORMS = {   # name: (weight layout, weight dtype, product)
    "f32 dot [O,I]": ("OI", F32, lambda x, w: jax.lax.dot_general(x, w, OI)),
    "f32 dot [I,O]": ("IO", F32, lambda x, w: jax.lax.dot_general(x, w, IO)),
    "f32 mul+sum [O,I]": ("OI", F32, lambda x, w: jnp.sum(w * x, axis=1)[None]),
    "bf16 dot ->f32 [O,I]": ("OI", BF16, lambda x, w: jax.lax.dot_general(
        x.astype(BF16), w, OI, preferred_element_type=F32)),
    "bf16 dot ->f32 [I,O]": ("IO", BF16, lambda x, w: jax.lax.dot_general(
        x.astype(BF16), w, IO, preferred_element_type=F32)),
    "bf16->f32 mul+sum [O,I]": ("OI", BF16, lambda x, w: jnp.sum(w.astype(F32) * x,
                                                                 axis=1)[None]),
    "bf16 upcast, f32 dot": ("OI", BF16, lambda x, w: jax.lax.dot_general(x, w.astype(F32), OI)),
}


def chained(product):
    @jax.jit
    def run(x, ws):
        acc = jnp.float32(0)
        for w in ws:
            acc = acc + product(x, w)[0, 0]
        return acc
    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print("| weight [O, I] | " + " | ".join(FORMS) + " |")
    print("|---|" + "---|" * len(FORMS))
    for O, I in SHAPES:
        n = 1 if O > 10000 else 30
        w32 = [jnp.asarray(rng.standard_normal((O, I)) * 0.02, F32) for _ in range(n)]
        x = jnp.asarray(rng.standard_normal((1, I)), F32)
        cells = []
        for layout, dtype, product in FORMS.values():
            ws = [(w if layout == "OI" else w.T.copy()).astype(dtype) for w in w32]
            ms = timed(chained(product), x, ws, repeats=args.repeats,
                       clock_fn=time.perf_counter) / n
            gbs = O * I * jnp.dtype(dtype).itemsize / ms / 1e6
            cells.append(f"{ms:.3f} ({gbs:.0f} GB/s)")
        print(f"| {O}x{I} | " + " | ".join(cells) + " |", flush=True)
