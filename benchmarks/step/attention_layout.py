"""The score layout of the cache pass (``model/layers.py SLOT_MAJOR_ROWS``), side by side.

A decode step has ``U = group`` folded query rows per kv head (3 for SmolLM2). Its scores
over ``S`` cache slots are a batch of ``[U, D] x [D, S]`` products; XLA:CPU runs that product
several times faster when the slots are the result's rows (``[S, U]``: keys as the left operand)
than its columns (``[U, S]``) at large batches on some hosts (an Intel Xeon, batch 64); at
small batches, and on a Zen 5, ``[U, S]`` is faster (its softmax reduces along the contiguous
axis). This times, in one process, both layouts (``SLOT_MAJOR_ROWS``,
``SLOT_MAJOR_MIN_BATCH``):

1. one layer's cache pass (``attend_cached``) at decode and verify shapes;
2. the whole SmolLM2 AR step (``profile.profile_shape``: 30 layers, a full cache) at the
   batches of data collection and RL rollouts.

    python -m benchmarks step attention_layout \
        --out benchmarks/results/precision/attention_layout_xeon.md
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import dominotree_jax as dj
import dominotree_jax.model.layers as layers
from dominotree_jax.assets import smollm2_gguf_path
from dominotree_jax.measure.timing import cpu_model

from benchmarks.step.profile import profile_shape, timed

# name: (SLOT_MAJOR_ROWS, SLOT_MAJOR_MIN_BATCH)
LAYOUTS = {"[U, S]": (0, 1), "[S, U] (slot-major)": (10**6, 1)}


def _use(layout):
    layers.SLOT_MAJOR_ROWS, layers.SLOT_MAJOR_MIN_BATCH = layout


def layer_pass(B: int, T: int, S: int, repeats: int) -> dict[str, float]:
    """ms of one SmolLM2-shaped layer's ``attend_cached`` (9 query heads, 3 kv heads, D 64)
    over a cache of ``S`` slots, ``S - T`` of them committed, per layout."""
    Q, K, D = 9, 3, 64
    ks = jax.random.split(jax.random.key(0), 5)
    q = jax.random.normal(ks[0], (B, T, Q, D))
    nk, nv = jax.random.normal(ks[1], (B, T, K, D)), jax.random.normal(ks[2], (B, T, K, D))
    ck, cv = jax.random.normal(ks[3], (B, K, S, D)), jax.random.normal(ks[4], (B, K, S, D))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
    prefix = jnp.full((B,), S - T, jnp.int32)
    out, ref = {}, None
    for name, layout in LAYOUTS.items():
        _use(layout)
        fn = jax.jit(lambda *a: layers.attend_cached(*a))
        got = np.asarray(fn(q, nk, nv, mask, ck, cv, prefix))
        if ref is None:
            ref = got
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)   # same attention
        out[name] = timed(fn, q, nk, nv, mask, ck, cv, prefix, repeats=repeats,
                          clock_fn=time.perf_counter)
    return out


def whole_step(target, B: int, S: int, repeats: int) -> dict[str, float]:
    out = {}
    for name, layout in LAYOUTS.items():
        _use(layout)
        out[name] = profile_shape(target, target.params, B, 1, S, repeats, steps_only=True)[
            "whole step"]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", default=None, help="write the markdown table here")
    args = p.parse_args(argv)
    default = (layers.SLOT_MAJOR_ROWS, layers.SLOT_MAJOR_MIN_BATCH)
    cpu = cpu_model()
    names = list(LAYOUTS)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"Score layout of the cache pass, {cpu}, float32, median of {args.repeats}, wall ms; "
             f"`python -m benchmarks step attention_layout`, {when}.",
             "", "| what | batch | new rows | cache slots | " + " | ".join(names)
             + " | [U, S] / slot-major |", "|---|---:|---:|---:|" + "---:|" * (len(names) + 1)]

    def row(what, B, T, S, res):
        lines.append(f"| {what} | {B} | {T} | {S} | " + " | ".join(f"{res[n]:.2f}" for n in names)
                     + f" | {res[names[0]] / res[names[1]]:.2f}x |")
        print(lines[-1], flush=True)
    try:
        for B, T, S in ((1, 1, 640), (1, 1, 4038), (16, 1, 640), (64, 1, 192), (64, 1, 640),
                        (64, 1, 1024), (1, 17, 640)):
            row("one layer's cache pass", B, T, S, layer_pass(B, T, S, args.repeats))
        target = dj.load_target(smollm2_gguf_path(), dtype="float32", tokenizer=False)
        for B, S in ((1, 640), (1, 4038), (16, 640), (64, 192), (64, 640)):
            row("whole AR step (30 layers)", B, 1, S, whole_step(target, B, S, args.repeats))
    finally:
        _use(default)
    lines += ["", f"The default (`SLOT_MAJOR_ROWS = {default[0]}`, `SLOT_MAJOR_MIN_BATCH = "
              f"{default[1]}`): slot-major for at most {default[0]} folded rows per kv head in "
              f"a batch of at least {default[1]} rows, `[U, S]` otherwise."]
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
