"""Domino head (SPEC §3): a bias-free GRU over the drafted path and the causal correction.

All functions broadcast over leading batch dimensions. Weight layouts are the checkpoint's
(PyTorch) layouts: ``w_ih [3G, H]``, ``w_hh [3G, G]`` (gate order r, z, n),
``w1 [E, H+G]``, ``w2 [V, E]`` (or ``[C, E]`` for a gathered subset of rows).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _matvec(x_sI: jax.Array, w_OI: jax.Array) -> jax.Array:
    """``x @ w.T`` with the weight kept in ``[out, in]`` layout."""
    return jax.lax.dot_general(x_sI, w_OI, (((x_sI.ndim - 1,), (1,)), ((), ())))


def gru_step(x_sH: jax.Array, s_sG: jax.Array, w_ih_3GH: jax.Array, w_hh_3GG: jax.Array) -> jax.Array:
    """One PyTorch-semantics GRU step without biases; returns the new state ``[..., G]``."""
    gi_r, gi_z, gi_n = jnp.split(_matvec(x_sH, w_ih_3GH), 3, axis=-1)
    gh_r, gh_z, gh_n = jnp.split(_matvec(s_sG, w_hh_3GG), 3, axis=-1)
    r = jax.nn.sigmoid(gi_r + gh_r)
    u = jax.nn.sigmoid(gi_z + gh_z)
    n = jnp.tanh(gi_n + r * gh_n)
    return (1.0 - u) * n + u * s_sG


def correction_hidden(z_sH: jax.Array, s_sG: jax.Array, w1_EHG: jax.Array) -> jax.Array:
    """``SiLU(W1 · [z ; s])`` → ``[..., E]``."""
    zs = jnp.concatenate([z_sH, s_sG.astype(z_sH.dtype)], axis=-1)
    return jax.nn.silu(_matvec(zs, w1_EHG))


def corrected_logits(base_sV: jax.Array, z_sH: jax.Array, s_sG: jax.Array,
                     w1_EHG: jax.Array, w2_VE: jax.Array) -> jax.Array:
    """``base + W2 · SiLU(W1 · [z ; s])`` over the rows of ``w2`` (full vocab or a subset)."""
    return base_sV + _matvec(correction_hidden(z_sH, s_sG, w1_EHG), w2_VE)
