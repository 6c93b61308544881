"""The verify's sampling at the target's vocabulary: ``jax.random.categorical`` (Gumbel noise
for every entry, what ``sampling.sample_tokens`` drew with before) vs ``sampling.draw`` (exact
inverse CDF, one uniform a row), and ``jnp.argmax`` vs ``sampling.first_argmax`` at T 0; each
on the logits alone and behind the LM-head product that makes them (XLA:CPU fuses a reduction
over the vocabulary into the product, which at 68 rows ran ~6x slower than the product).

    python -m benchmarks step sampling [--shapes 4x17,1x17,16x1,1x1] [--repeats 9]

Prints a markdown table: median ms per call, batch x rows of ``V = 49,152`` logits (SmolLM2).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from dominotree_jax.measure.timing import bf16_units, cpu_model, interleaved_medians
from dominotree_jax.sampling import draw, first_argmax, sampling_logprobs

VOCAB, HIDDEN, TEMPERATURE = 49152, 576, 0.9


def _programs(key):
    def head(h, head_VH):
        return jnp.einsum("brh,vh->brv", h, head_VH)

    def gumbel(x):
        return jax.random.categorical(key, sampling_logprobs(x, TEMPERATURE), axis=-1)

    def inverse_cdf(x):
        return draw(key, x / TEMPERATURE)

    pairs = {"categorical (before)": gumbel, "draw": inverse_cdf,
             "jnp.argmax (before)": lambda x: jnp.argmax(x, -1), "first_argmax": first_argmax}
    progs = {}
    for name, fn in pairs.items():
        progs[f"logits → {name}"] = (jax.jit(lambda x, w, fn=fn: fn(x)), "logits")
        progs[f"head + {name}"] = (jax.jit(lambda h, w, fn=fn: fn(head(h, w))), "hidden")
    return progs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="4x17,1x17,16x1,1x1", help="batch x rows, comma-separated")
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    key = jax.random.key(0)
    head_VH = jax.random.normal(jax.random.key(1), (VOCAB, HIDDEN)) * 0.05
    progs = _programs(key)
    cols = {}
    for B, R in shapes:
        hidden = jax.random.normal(jax.random.key(2), (B, R, HIDDEN))
        logits = jnp.einsum("brh,vh->brv", hidden, head_VH)
        inputs = {"logits": logits, "hidden": hidden}
        cols[(B, R)] = interleaved_medians(
            {n: (lambda f=f, x=inputs[kind]: f(x, head_VH)) for n, (f, kind) in progs.items()},
            repeats=args.repeats, inner=3)
    print(f"{cpu_model()} ({bf16_units()}), jax {jax.__version__}, V = {VOCAB}, "
          f"T {TEMPERATURE}; median ms per call\n")
    print("| program | " + " | ".join(f"{B} x {R}" for B, R in shapes) + " |")
    print("|---|" + "---:|" * len(shapes))
    for name in progs:
        print(f"| {name} | " + " | ".join(f"{cols[s][name]:.2f}" for s in shapes) + " |")
