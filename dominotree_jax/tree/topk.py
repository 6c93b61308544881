"""Exact top-k over a long last axis (the vocabulary) without sorting all of it.

XLA:GPU lowers ``lax.top_k`` with a large ``k`` (the builder's ``top_m = 64``) over ``V =
151,936`` logits to a sort of the whole row. ``two_stage_top_k`` takes the top ``k`` of each
``chunk``-wide slice (a batch of short sorts), then the top ``k`` of those ``ceil(V / chunk) *
k`` candidates. It is exact, ties included: the candidates stay in index order for equal values
(chunks in order, and within a chunk ``lax.top_k`` puts the lower index first), so the second
stage, which also prefers the lower position, picks the same indices as ``lax.top_k(x, k)``.
Padding of the last chunk is ``-inf`` (or the dtype's minimum) at indices ``>= V``: it can only
be picked after every real entry of equal value.

``vocab_top_k`` is what the tree builder calls: the two stages where the program is lowered for
a GPU, ``lax.top_k`` elsewhere (XLA:CPU rewrites it to a fast partial sort).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

TOPK_CHUNK = 2048  # slice width of the first stage (unmeasured on a GPU; a power of two)


def two_stage_top_k(x_sV: jax.Array, k: int, chunk: int = TOPK_CHUNK):
    """``(values [..., k], indices [..., k] int32)``, equal to ``lax.top_k(x, k)``."""
    V = x_sV.shape[-1]
    if not 1 <= k <= V:
        raise ValueError(f"k={k} must be in [1, V={V}]")
    n = -(-V // chunk)
    if n == 1 or k >= chunk:  # nothing to split: one stage
        return tuple(jax.lax.top_k(x_sV, k))
    low = (-jnp.inf if jnp.issubdtype(x_sV.dtype, jnp.floating)
           else jnp.iinfo(x_sV.dtype).min)
    pad = [(0, 0)] * (x_sV.ndim - 1) + [(0, n * chunk - V)]
    x_snC = jnp.pad(x_sV, pad, constant_values=low).reshape(x_sV.shape[:-1] + (n, chunk))
    vals_snk, idx_snk = jax.lax.top_k(x_snC, k)
    idx_snk = idx_snk + (chunk * jnp.arange(n, dtype=idx_snk.dtype))[:, None]
    flat = x_sV.shape[:-1] + (n * k,)
    vals_sk, pos_sk = jax.lax.top_k(vals_snk.reshape(flat), k)
    return vals_sk, jnp.take_along_axis(idx_snk.reshape(flat), pos_sk, axis=-1)


def vocab_top_k(x_sV: jax.Array, k: int):
    """``lax.top_k`` semantics; two stages when lowered for ``cuda``/``rocm``."""
    def gpu(x):
        return two_stage_top_k(x, k)

    def other(x):
        return tuple(jax.lax.top_k(x, k))

    return jax.lax.platform_dependent(x_sV, cuda=gpu, rocm=gpu, default=other)
