"""Fixed-shape caches, kept outside the modules as explicit pytrees.

``KVCache``: the target's keys/values ``[layers, batch, max_len, kv_heads, head_dim]``. Slot ``s``
of a row holds the token at absolute position ``s`` once committed; uncommitted slots are
garbage that attention masks never show.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class KVCache(NamedTuple):
    k: jax.Array  # [L, B, S, K, D]
    v: jax.Array  # [L, B, S, K, D]

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @classmethod
    def zeros(cls, num_layers, batch, max_len, num_kv_heads, head_dim, dtype=jnp.float32):
        shape = (num_layers, batch, max_len, num_kv_heads, head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


def write_rows(cache_BSX: jax.Array, new_BTX: jax.Array, start_B: jax.Array) -> jax.Array:
    """Write ``T`` new rows at slots ``start_b .. start_b+T-1`` of each batch row.

    Rows that would land past the end are dropped (never clamped onto committed slots).
    """
    B, T = new_BTX.shape[:2]
    slots_BT = start_B[:, None] + jnp.arange(T)[None]
    return cache_BSX.at[jnp.arange(B)[:, None], slots_BT].set(new_BTX.astype(cache_BSX.dtype),
                                                              mode="drop")


def write_layer_rows(cache_LBSX: jax.Array, layer: int, new_BTX: jax.Array,
                     start_B: jax.Array) -> jax.Array:
    """``write_rows`` into layer ``layer`` of a stacked ``[L, B, S, ...]`` cache, in place."""
    B, T = new_BTX.shape[:2]
    slots_BT = start_B[:, None] + jnp.arange(T)[None]
    return cache_LBSX.at[layer, jnp.arange(B)[:, None], slots_BT].set(
        new_BTX.astype(cache_LBSX.dtype), mode="drop")


def gather_rows(x_BSX: jax.Array, idx_BT: jax.Array) -> jax.Array:
    """``x[b, idx[b, t]]`` → ``[B, T, ...]``."""
    return jnp.take_along_axis(x_BSX, idx_BT.reshape(idx_BT.shape + (1,) * (x_BSX.ndim - 2)),
                               axis=1)


def compact_rows(cache_LBSX: jax.Array, start_B, src_BP) -> jax.Array:
    """Move rows ``src[b, :]`` (absolute slots) to ``start_b, start_b+1, ...`` in every layer.

    Trailing entries of ``src`` past the accepted path repeat its last row: they are copied
    too (garbage, never visible), which keeps shapes static.
    """
    B, P = src_BP.shape
    b_B1 = jnp.arange(B)[:, None]
    moved = cache_LBSX[:, b_B1, src_BP]
    dst_BP = start_B[:, None] + jnp.arange(P)[None]
    return cache_LBSX.at[:, b_B1, dst_BP].set(moved, mode="drop")
