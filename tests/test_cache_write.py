"""The target cache's writes (dominotree_jax/model/cache.py): a bfloat16 cache stored as its bits
is written in place (no float32 copy of the layer in the compiled write) and holds exactly the
values the plain bfloat16 scatter wrote; float32 is unchanged."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from dominotree_jax.model.cache import (CACHE_BITS, KVCache, storage_dtype, view_layer,
                                        write_layer)


def plain_scatter(cache_BKSD, new_BTKD, start_B):
    """The write before the bits storage: a scatter in the cache's own (bf16) dtype."""
    slots_BT = start_B[:, None] + jnp.arange(new_BTKD.shape[1])[None]
    dnums = lax.ScatterDimensionNumbers(
        update_window_dims=(2, 3), inserted_window_dims=(2,), scatter_dims_to_operand_dims=(2,),
        operand_batching_dims=(0,), scatter_indices_batching_dims=(0,))
    return lax.scatter(cache_BKSD, slots_BT[..., None], new_BTKD.astype(cache_BKSD.dtype), dnums,
                       mode=lax.GatherScatterMode.FILL_OR_DROP)


B, K, S, D = 4, 2, 16, 8


def numpy_write(cache_BKSD, new_BTKD, start_B):
    out = np.array(cache_BKSD)
    for b in range(B):
        for t in range(new_BTKD.shape[1]):
            if 0 <= start_B[b] + t < S:
                out[b, :, start_B[b] + t] = new_BTKD[b, t]
    return out


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint16) if x.dtype.itemsize == 2 else x.view(np.uint32)


# AR step (T=1), a 5-row tree verify written at the round's start (T=1+N, rows at different
# positions per batch row, one running past the end: dropped, not clamped), and a kept path.
WRITES = [(1, [0, 5, 9, 15]), (5, [0, 3, 11, 13]), (3, [14, 2, 7, 16])]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("T,starts", WRITES)
def test_write_equals_the_plain_scatter_bit_for_bit(dtype, T, starts):
    rng = np.random.default_rng(T)
    old = jnp.asarray(rng.standard_normal((B, K, S, D)), jnp.float32).astype(dtype)
    new_f32 = jnp.asarray(rng.standard_normal((B, T, K, D)), jnp.float32)   # rows come in f32
    start_B = jnp.asarray(starts, jnp.int32)
    stored = KVCache.zeros(1, B, S, K, D, dtype).k[0]
    assert stored.dtype == storage_dtype(dtype)
    stored = (lax.bitcast_convert_type(old, CACHE_BITS) if stored.dtype == CACHE_BITS else old)
    got = view_layer(jax.jit(write_layer)(stored, new_f32, start_B))
    want = plain_scatter(old, new_f32, start_B)
    assert got.dtype == jnp.dtype(dtype)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    ref = numpy_write(old, np.asarray(new_f32.astype(dtype)), np.asarray(starts))
    np.testing.assert_array_equal(_bits(got), _bits(ref))


def test_bf16_cache_is_stored_as_bits_and_reads_as_bf16():
    cache = KVCache.zeros(2, B, S, K, D, jnp.bfloat16)
    assert cache.k[0].dtype == CACHE_BITS and cache.dtype == jnp.bfloat16
    assert view_layer(cache.v[1]).dtype == jnp.bfloat16 and not view_layer(cache.v[1]).any()
    f32 = KVCache.zeros(2, B, S, K, D, jnp.float32)
    assert f32.k[0].dtype == jnp.float32 and view_layer(f32.k[0]) is f32.k[0]


def _cache_sized_f32(fn, cache_shape, *args) -> int:
    hlo = jax.jit(fn, donate_argnums=0).lower(*args).compile().as_text()
    return len(re.findall(r"f32\[" + ",".join(map(str, cache_shape)) + r"\]", hlo))


def test_bf16_write_compiles_without_a_float32_copy_of_the_layer():
    shape = (16, 3, 256, 64)      # SmolLM2's layer cache at batch 16 (the profile's shape)
    new = jnp.ones((16, 1, 3, 64), jnp.bfloat16)
    start_B = jnp.arange(16, dtype=jnp.int32) * 9
    stored = jnp.zeros(shape, storage_dtype(jnp.bfloat16))
    assert _cache_sized_f32(write_layer, shape, stored, new, start_B) == 0
    # the check can fail: on XLA:CPU the plain bf16 scatter converts the whole layer to float32
    # and back (other backends may scatter bf16 natively)
    if jax.default_backend() == "cpu":
        assert _cache_sized_f32(plain_scatter, shape, jnp.zeros(shape, jnp.bfloat16), new,
                                start_B) > 0


def test_bf16_drafter_context_is_stored_as_bits_and_written_in_place():
    """The drafter's context K/V ring (``model/drafter.py``) follows the same storage: the
    written values are the bf16 rows, bit for bit, and the compiled write of the bf16 context
    holds no float32 array of the context's shape (as the plain bf16 write did, on CPU)."""
    from dominotree_jax.model.drafter import DrafterContext, bind_drafter, init_drafter_params

    from spec_fixtures import tiny_pair
    _, dcfg, _ = tiny_pair()
    drafter = bind_drafter(dcfg, jax.tree.map(lambda x: x.astype(jnp.bfloat16),
                                              init_drafter_params(dcfg, 1)))
    Bc, Sc, T = 16, 96, 5
    F = len(dcfg.target_layer_ids) * dcfg.hidden_size
    feats = jax.random.normal(jax.random.key(0), (Bc, T, F))
    pos = jnp.broadcast_to(jnp.arange(T) + 7, (Bc, T))
    start, num = jnp.full((Bc,), 7, jnp.int32), jnp.full((Bc,), T, jnp.int32)
    ctx = DrafterContext.zeros(dcfg, Bc, Sc, jnp.bfloat16)
    assert ctx.k.dtype == CACHE_BITS and ctx.dtype == jnp.bfloat16
    out = drafter.extend_context(ctx, feats, pos, start, num)
    k_rows, _ = drafter.context_rows(feats, pos)
    got_k, _ = out.layer_kv(0)
    assert got_k.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got_k[:, 7:7 + T]).view(np.uint16),
                                  np.asarray(k_rows[0].astype(jnp.bfloat16)).view(np.uint16))
    assert not np.asarray(got_k[:, :7]).any() and not np.asarray(got_k[:, 7 + T:]).any()

    def write(c, f):
        return drafter.extend_context(c, f, pos, start, num)
    whole = ctx.k.shape   # [L, B, S, K, D]: the layers are written with one scatter
    assert _cache_sized_f32(write, whole, ctx, feats) == 0
    if jax.default_backend() == "cpu":   # the check can fail: the plain bf16 context did this
        plain = DrafterContext(jnp.zeros(ctx.k.shape, jnp.bfloat16),
                               jnp.zeros(ctx.v.shape, jnp.bfloat16), ctx.length)
        assert _cache_sized_f32(write, whole, plain, feats) > 0


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_drafter_context_write_is_one_scatter_into_the_stacked_ring(dtype):
    """``Drafter.write_context`` writes every layer's rows with one scatter into the stacked
    ``[L, B, S, K, D]`` ring: the values equal per-layer ``write_rows_at`` (ring wrap, dropped
    rows included) and the compiled write builds no new context by concatenation (writing each
    layer and stacking the results rebuilt the whole context every round)."""
    import dataclasses

    from dominotree_jax.model.cache import as_stored, write_rows_at
    from dominotree_jax.model.drafter import DrafterContext, bind_drafter, init_drafter_params

    from spec_fixtures import tiny_pair
    _, dcfg, _ = tiny_pair()
    dcfg = dataclasses.replace(dcfg, num_hidden_layers=3)
    drafter = bind_drafter(dcfg, jax.tree.map(lambda x: x.astype(dtype),
                                              init_drafter_params(dcfg, 1)))
    Bc, Sc, T = 4, 12, 5
    feats = jax.random.normal(jax.random.key(0),
                              (Bc, T, len(dcfg.target_layer_ids) * dcfg.hidden_size))
    pos = jnp.broadcast_to(jnp.arange(T) + 7, (Bc, T))
    start = jnp.array([7, 0, 10, 11], jnp.int32)   # rows 2, 3 wrap around the ring
    num = jnp.array([5, 3, 5, 2], jnp.int32)
    ctx = DrafterContext.zeros(dcfg, Bc, Sc, dtype)
    old = jax.random.randint(jax.random.key(1), ctx.k.shape, 0, 1000).astype(ctx.k.dtype)
    ctx = ctx._replace(k=old, v=old + 1)

    def stacked_per_layer(c, f):
        k_rows, v_rows = drafter.context_rows(f, pos)
        t = jnp.arange(T)[None]
        slots = jnp.where(t < num[:, None], jnp.mod(start[:, None] + t, Sc), Sc)
        return (jnp.stack([write_rows_at(c.k[i], as_stored(k, c.k.dtype), slots)
                           for i, k in enumerate(k_rows)]),
                jnp.stack([write_rows_at(c.v[i], as_stored(v, c.v.dtype), slots)
                           for i, v in enumerate(v_rows)]))

    def write(c, f):
        return drafter.extend_context(c, f, pos, start, num)
    got = write(ctx, feats)
    want_k, want_v = stacked_per_layer(ctx, feats)
    np.testing.assert_array_equal(np.asarray(got.k), np.asarray(want_k))
    np.testing.assert_array_equal(np.asarray(got.v), np.asarray(want_v))
    np.testing.assert_array_equal(np.asarray(got.length), np.asarray(start + num))

    whole = re.escape("[" + ",".join(map(str, ctx.k.shape)) + "]")

    def concatenated_contexts(fn) -> int:
        hlo = jax.jit(fn, donate_argnums=0).lower(ctx, feats).compile().as_text()
        return len(re.findall(r"= \S+" + whole + r"\S* concatenate\(", hlo))
    assert concatenated_contexts(write) == 0
    assert concatenated_contexts(stacked_per_layer) > 0   # the check can fail
