"""Fixed-shape caches, kept outside the modules as explicit pytrees.

``KVCache``: the target's keys/values, one array ``[B, K, S, D]`` (batch, kv heads, cache slots,
head dim) per layer: a tuple of ``L`` arrays, not one stacked array. Slot ``s`` of a row holds
the token at absolute position ``s`` once committed; uncommitted slots are garbage that
attention never shows.

Why per layer and kv-head major: slicing layer ``i`` out of one stacked ``[L, ...]`` array
inside the jitted forward made XLA CPU run every attention product on a strided view, 3-8x
slower (``benchmarks/results/profile.md``); a ``[S, D]`` panel per (batch, kv head) is what
the attention matmuls read contiguously.

Why a bfloat16 cache holds ``uint16``: XLA:CPU has no bfloat16 scatter or dynamic-update-slice;
it lowers one as "convert the whole layer cache to float32, write, convert back", O(cache) work
per layer per step (136 ms against 0.7 ms per batch-16 step of SmolLM2-135M on an Intel Xeon,
``benchmarks/results/precision/profile_bf16_xeon.md``). An integer scatter is done in place, and
a bitcast between same-width types on the (per-step, row-sized) new rows or inside the
attention read is free, so a bfloat16 cache stores the values' bits (``CACHE_BITS``): identical
values, the write in place. ``view_layer`` gives the bfloat16 view to read; ``write_layer``
takes rows in any float dtype. Other dtypes are stored as they are. The drafter's context K/V
(``model/drafter.py``) are stored the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


if TYPE_CHECKING:   # shape annotations only; tests check them (tests/shape_check.py)
    from jaxtyping import Array, Float, Shaped

# a bfloat16 cache layer is stored as its bits in this dtype (module docstring)
CACHE_BITS = jnp.dtype(jnp.uint16)


def storage_dtype(dtype) -> jnp.dtype:
    """The dtype a cache of values in ``dtype`` is stored in (``CACHE_BITS`` for bfloat16)."""
    return CACHE_BITS if jnp.dtype(dtype) == jnp.bfloat16 else jnp.dtype(dtype)


def value_dtype(stored_dtype) -> jnp.dtype:
    """The dtype of the values a cache array of ``stored_dtype`` holds."""
    stored_dtype = jnp.dtype(stored_dtype)
    return jnp.dtype(jnp.bfloat16) if stored_dtype == CACHE_BITS else stored_dtype


def view_layer(cache_BKSD: jax.Array) -> jax.Array:
    """One stored cache layer as its values (the bfloat16 view of a ``CACHE_BITS`` layer)."""
    if cache_BKSD.dtype == CACHE_BITS:
        return lax.bitcast_convert_type(cache_BKSD, jnp.bfloat16)
    return cache_BKSD


def as_stored(new: jax.Array, stored_dtype) -> jax.Array:
    """New rows in the cache's storage form (cast to its value dtype, then its bits)."""
    new = new.astype(value_dtype(stored_dtype))
    return lax.bitcast_convert_type(new, CACHE_BITS) if stored_dtype == CACHE_BITS else new


class RecurrentState(NamedTuple):
    """One linear-attention layer's committed state (float32; ``model/gated_deltanet.py``);
    ``shape``: a ``config.LinearAttentionShape``."""
    conv: jax.Array   # [B, conv_kernel - 1, C]: the last conv inputs, oldest first
    ssm: jax.Array    # [B, heads, dk, dv]

    @classmethod
    def zeros(cls, shape, batch: int) -> "RecurrentState":
        return cls(jnp.zeros((batch, shape.conv_kernel - 1, shape.conv_dim), jnp.float32),
                   jnp.zeros((batch, shape.num_value_heads, shape.key_head_dim,
                              shape.value_head_dim), jnp.float32))


class RecurrentRows(NamedTuple):
    """What a forward's rows leave for ``absorb`` (per row, float32)."""
    conv_in: jax.Array   # [B, T, C] the conv inputs
    k: jax.Array         # [B, T, heads, dk] normalised keys
    u: jax.Array         # [B, T, heads, dv] corrected values
    gcum: jax.Array      # [B, T, heads] summed log-decay along the row's path (incl. itself)


class KVCache(NamedTuple):
    """A target's cache: K/V per attention layer, and (hybrid targets) a recurrent state per
    Gated DeltaNet layer (``model/gated_deltanet.py``), each tuple in layer order."""
    # one per attention layer, stored: float values, or a bfloat16 layer's bits (``view_layer``)
    k: tuple[Shaped[Array, "B K S D"], ...]
    v: tuple[Shaped[Array, "B K S D"], ...]
    # one ``RecurrentState`` per linear-attention layer (float32); () for dense targets
    recurrent: tuple = ()

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    @property
    def num_layers(self) -> int:
        return len(self.k) + len(self.recurrent)

    @property
    def dtype(self) -> jnp.dtype:
        """The dtype of the values held (bfloat16 for a cache stored as bits)."""
        return value_dtype(self.k[0].dtype)

    @classmethod
    def zeros(cls, num_layers, batch, max_len, num_kv_heads, head_dim, dtype=jnp.float32):
        """A cache of values in ``dtype``, stored as ``storage_dtype(dtype)`` (zero bits: 0.0)."""
        shape = (batch, num_kv_heads, max_len, head_dim)
        dtype = storage_dtype(dtype)
        return cls(tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
                   tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)))

    @classmethod
    def for_target(cls, cfg, batch: int, max_len: int, dtype=jnp.float32) -> "KVCache":
        """An empty cache for target config ``cfg``: K/V slots for its attention layers, a zero
        recurrent state for its linear-attention ones."""
        kv = cls.zeros(len(cfg.attention_layers), batch, max_len, cfg.num_key_value_heads,
                       cfg.head_dim, dtype)
        return kv._replace(recurrent=tuple(RecurrentState.zeros(cfg.linear_attention, batch)
                                           for _ in cfg.linear_layers))


class KVRows(NamedTuple):
    """The K/V of some rows (a round's kept path), row-major per layer: not a cache."""
    k: tuple[Float[Array, "B T K D"], ...]  # one per attention layer
    v: tuple[Float[Array, "B T K D"], ...]
    # one ``RecurrentRows`` per linear-attention layer (what ``absorb`` needs); ()
    recurrent: tuple = ()


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


def write_layers_at(cache_LBSX: jax.Array, new_LBTX: jax.Array, slots_BT: jax.Array) -> jax.Array:
    """Every layer's ``write_rows_at`` in one scatter: row ``t`` of batch row ``b`` of each
    layer ``l`` at slot ``slots[b, t]`` (out-of-range slots: dropped)."""
    window = (0,) + tuple(range(3, new_LBTX.ndim))
    dnums = lax.ScatterDimensionNumbers(
        update_window_dims=window, inserted_window_dims=(2,), scatter_dims_to_operand_dims=(2,),
        operand_batching_dims=(1,), scatter_indices_batching_dims=(0,))
    return lax.scatter(cache_LBSX, slots_BT[..., None], new_LBTX.astype(cache_LBSX.dtype), dnums,
                       mode=lax.GatherScatterMode.FILL_OR_DROP)


def write_layer(cache_BKSD: jax.Array, new_BTKD: jax.Array, start_B: jax.Array) -> jax.Array:
    """Write ``T`` new rows ``[B, T, K, D]`` at slots ``start_b ..`` of one layer's cache
    ``[B, K, S, D]`` (rows past the end are dropped), in place under jit. ``new`` is cast to the
    cache's value dtype; a ``CACHE_BITS`` cache gets the bfloat16 rows' bits."""
    slots_BT = start_B[:, None] + jnp.arange(new_BTKD.shape[1])[None]
    dnums = lax.ScatterDimensionNumbers(
        update_window_dims=(2, 3), inserted_window_dims=(2,), scatter_dims_to_operand_dims=(2,),
        operand_batching_dims=(0,), scatter_indices_batching_dims=(0,))
    new_BTKD = as_stored(new_BTKD, cache_BKSD.dtype)
    return lax.scatter(cache_BKSD, slots_BT[..., None], new_BTKD, dnums,
                       mode=lax.GatherScatterMode.FILL_OR_DROP)


def gather_rows(x_BSX: jax.Array, idx_BT: jax.Array) -> jax.Array:
    """``x[b, idx[b, t]]`` → ``[B, T, ...]``."""
    return jnp.take_along_axis(x_BSX, idx_BT.reshape(idx_BT.shape + (1,) * (x_BSX.ndim - 2)),
                               axis=1)
