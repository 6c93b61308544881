"""Fixed-shape caches, kept outside the modules as explicit pytrees.

``KVCache``: the target's keys/values, one array ``[B, K, S, D]`` (batch, kv heads, cache slots,
head dim) per layer: a tuple of ``L`` arrays, not one stacked array. Slot ``s`` of a row holds
the token at absolute position ``s`` once committed; uncommitted slots are garbage that
attention never shows.

Why per layer and kv-head major: slicing layer ``i`` out of one stacked ``[L, ...]`` array
inside the jitted forward made XLA CPU run every attention product on a strided view, 3-8x
slower (``benchmarks/results/profile.md``); a ``[S, D]`` panel per (batch, kv head) is what
the attention matmuls read contiguously.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


if TYPE_CHECKING:   # shape annotations only; tests check them (tests/shape_check.py)
    from jaxtyping import Array, Float


class KVCache(NamedTuple):
    k: tuple[Float[Array, "B K S D"], ...]  # one per layer
    v: tuple[Float[Array, "B K S D"], ...]  # one per layer

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    @property
    def num_layers(self) -> int:
        return len(self.k)

    @classmethod
    def zeros(cls, num_layers, batch, max_len, num_kv_heads, head_dim, dtype=jnp.float32):
        shape = (batch, num_kv_heads, max_len, head_dim)
        return cls(tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
                   tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)))


class KVRows(NamedTuple):
    """The K/V of some rows (a round's kept path), row-major per layer: not a cache."""
    k: tuple[Float[Array, "B T K D"], ...]  # one per layer
    v: tuple[Float[Array, "B T K D"], ...]


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
    return write_rows_at(cache_BSX, new_BTX, start_B[:, None] + jnp.arange(new_BTX.shape[1])[None])


def write_rows_at(cache_BSX: jax.Array, new_BTX: jax.Array, slots_BT: jax.Array) -> jax.Array:
    """Write row ``t`` of batch row ``b`` at slot ``slots[b, t]`` (out-of-range slots: dropped)."""
    return _scatter_rows(cache_BSX, 0, slots_BT[..., None], new_BTX, (1,))


def write_layer(cache_BKSD: jax.Array, new_BTKD: jax.Array, start_B: jax.Array) -> jax.Array:
    """Write ``T`` new rows ``[B, T, K, D]`` at slots ``start_b ..`` of one layer's cache
    ``[B, K, S, D]`` (rows past the end are dropped), in place under jit."""
    slots_BT = start_B[:, None] + jnp.arange(new_BTKD.shape[1])[None]
    dnums = lax.ScatterDimensionNumbers(
        update_window_dims=(2, 3), inserted_window_dims=(2,), scatter_dims_to_operand_dims=(2,),
        operand_batching_dims=(0,), scatter_indices_batching_dims=(0,))
    return lax.scatter(cache_BKSD, slots_BT[..., None], new_BTKD.astype(cache_BKSD.dtype), dnums,
                       mode=lax.GatherScatterMode.FILL_OR_DROP)


def gather_rows(x_BSX: jax.Array, idx_BT: jax.Array) -> jax.Array:
    """``x[b, idx[b, t]]`` → ``[B, T, ...]``."""
    return jnp.take_along_axis(x_BSX, idx_BT.reshape(idx_BT.shape + (1,) * (x_BSX.ndim - 2)),
                               axis=1)
