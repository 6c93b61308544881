"""Fixed-shape caches, kept outside the modules as explicit pytrees.

``KVCache``: the target's keys/values ``[layers, batch, max_len, kv_heads, head_dim]``. Slot ``s``
of a row holds the token at absolute position ``s`` once committed; uncommitted slots are
garbage that attention masks never show.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


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


# Batched writes/moves are gathers/scatters with explicit *batching dims* (operand batch dim <->
# index batch dim) rather than an ``arange(B)`` index column: same result and speed on one
# device, but XLA's SPMD partitioner then keeps a batch-sharded cache local instead of
# all-gathering the new rows over the "data" mesh axis (dominotree_jax/sharding.py).

def _scatter_rows(cache, batch_dim: int, idx_BTI, new_BTX, index_dims: tuple[int, ...]):
    """``cache[.., b, ..][idx[b, t]] = new[b, t]`` (out-of-range rows dropped)."""
    window = tuple(range(2, new_BTX.ndim))
    dnums = lax.ScatterDimensionNumbers(
        update_window_dims=window, inserted_window_dims=index_dims,
        scatter_dims_to_operand_dims=index_dims, operand_batching_dims=(batch_dim,),
        scatter_indices_batching_dims=(0,))
    return lax.scatter(cache, idx_BTI, new_BTX.astype(cache.dtype), dnums,
                       mode=lax.GatherScatterMode.FILL_OR_DROP)


def write_rows(cache_BSX: jax.Array, new_BTX: jax.Array, start_B: jax.Array) -> jax.Array:
    """Write ``T`` new rows at slots ``start_b .. start_b+T-1`` of each batch row.

    Rows that would land past the end are dropped (never clamped onto committed slots).
    """
    slots_BT = start_B[:, None] + jnp.arange(new_BTX.shape[1])[None]
    return _scatter_rows(cache_BSX, 0, slots_BT[..., None], new_BTX, (1,))


def write_layer_rows(cache_LBSX: jax.Array, layer: int, new_BTX: jax.Array,
                     start_B: jax.Array) -> jax.Array:
    """``write_rows`` into layer ``layer`` of a stacked ``[L, B, S, ...]`` cache, in place."""
    slots_BT = start_B[:, None] + jnp.arange(new_BTX.shape[1])[None]
    idx_BT2 = jnp.stack([jnp.full_like(slots_BT, layer), slots_BT], axis=-1)
    return _scatter_rows(cache_LBSX, 1, idx_BT2, new_BTX, (0, 2))


def gather_rows(x_BSX: jax.Array, idx_BT: jax.Array) -> jax.Array:
    """``x[b, idx[b, t]]`` → ``[B, T, ...]``."""
    return jnp.take_along_axis(x_BSX, idx_BT.reshape(idx_BT.shape + (1,) * (x_BSX.ndim - 2)),
                               axis=1)


def compact_rows(cache_LBSX: jax.Array, start_B, src_BP) -> jax.Array:
    """Move rows ``src[b, :]`` (absolute slots) to ``start_b, start_b+1, ...`` in every layer.

    Trailing entries of ``src`` past the accepted path repeat its last row: they are copied
    too (garbage, never visible), which keeps shapes static.
    """
    L, _, _, *X = cache_LBSX.shape
    gdims = lax.GatherDimensionNumbers(
        offset_dims=tuple(range(2, 3 + len(X))), collapsed_slice_dims=(2,),
        start_index_map=(2,), operand_batching_dims=(1,), start_indices_batching_dims=(0,))
    moved_BPLX = lax.gather(cache_LBSX, src_BP[..., None], gdims,
                            slice_sizes=(L, 1, 1, *X), mode=lax.GatherScatterMode.CLIP)
    dst_BP = start_B[:, None] + jnp.arange(src_BP.shape[1])[None]
    return _scatter_rows(cache_LBSX, 1, dst_BP[..., None], moved_BPLX, (2,))
