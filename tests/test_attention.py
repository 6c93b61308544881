"""Blockwise attention over the cache (``layers.attend_cached``, ``TargetModel.forward_cached``,
chunked ``prefill``) against plain dense attention (``layers.attend``, ``TargetModel.__call__``)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dominotree_jax as dj
from dominotree_jax.api import Target
from dominotree_jax.config import TargetConfig
from dominotree_jax.decoding.verify import verify, verify_mask
from dominotree_jax.model import layers, target as target_mod
from dominotree_jax.model.cache import KVCache
from dominotree_jax.model.layers import attend, attend_cached
from dominotree_jax.model.target import bind_target, causal_mask, init_target_params, prefill


def _dense_reference(q, new_k, new_v, block_mask, cache_k, cache_v, prefix):
    """Write the new rows at ``prefix`` and run plain attention with the equivalent dense mask."""
    B, T = q.shape[:2]
    S = cache_k.shape[2]
    k = np.array(cache_k.transpose(0, 2, 1, 3))
    v = np.array(cache_v.transpose(0, 2, 1, 3))
    mask = np.zeros((B, T, S), bool)
    for b in range(B):
        p = int(prefix[b])
        k[b, p:p + T], v[b, p:p + T] = new_k[b], new_v[b]
        mask[b, :, :p] = True
        mask[b, :, p:p + T] = block_mask[b]
    return attend(q, jnp.asarray(k), jnp.asarray(v), jnp.asarray(mask))


@pytest.mark.parametrize("B,T,N,K,D,S,block", [
    (1, 1, 4, 2, 8, 16, 512),    # one AR row, the whole cache one block
    (3, 5, 6, 2, 16, 37, 8),     # S not a multiple of the block: the last block overlaps
    (2, 17, 9, 3, 8, 50, 16),    # a 17-row tree
    (2, 7, 4, 4, 8, 23, 23),     # no GQA grouping, block == S
    (4, 3, 8, 1, 4, 64, 5),      # MQA, many small blocks
    (3, 2, 6, 2, 8, 33, 8),      # two rows x group 3: 6 folded rows
])
@pytest.mark.parametrize("dense_rows", [0, 10**6], ids=["block-loop", "dense-buckets"])
@pytest.mark.parametrize("slot_major_rows,fused", [(0, False), (10**6, False), (0, True)],
                         ids=["scores-US", "scores-SU", "fused"])
def test_blockwise_matches_plain_attention(B, T, N, K, D, S, block, dense_rows,
                                           slot_major_rows, fused, monkeypatch):
    """Both score layouts of the cache pass (``SLOT_MAJOR_ROWS``/``SLOT_MAJOR_MIN_BATCH``:
    ``[U, S]``, or ``[S, U]`` for few rows in a large batch), its fused form (products and
    sums, no dots) and both ways over the prefix give plain attention's result."""
    monkeypatch.setattr("dominotree_jax.model.layers.SLOT_MAJOR_ROWS", slot_major_rows)
    monkeypatch.setattr("dominotree_jax.model.layers.SLOT_MAJOR_MIN_BATCH", 1)
    rng = np.random.default_rng(B * 100 + T)
    f32 = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    q, new_k, new_v = f32(B, T, N, D), f32(B, T, K, D), f32(B, T, K, D)
    cache_k, cache_v = f32(B, K, S, D), f32(B, K, S, D)
    prefix = rng.integers(0, S - T + 1, B)
    prefix[0] = 0  # an empty prefix: only the in-block rows are visible
    block_mask = rng.random((B, T, T)) < 0.5
    block_mask[:, np.arange(T), np.arange(T)] = True
    block_mask[-1, 0] = False  # a row that sees nothing in the block
    if T > 1:
        block_mask[0, 0] = False  # with an empty prefix: sees nothing at all -> zeros
    got = attend_cached(q, new_k, new_v, jnp.asarray(block_mask), cache_k, cache_v,
                        jnp.asarray(prefix, jnp.int32), block=block, dense_rows=dense_rows,
                        fused=fused)
    want = _dense_reference(q, new_k, new_v, block_mask, cache_k, cache_v, prefix)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=2e-6)
    assert np.all(np.isfinite(np.asarray(got)))
    if T > 1:
        np.testing.assert_array_equal(np.asarray(got[0, 0]), 0.0)


def _tiny(layers_=2, seed=0):
    cfg = TargetConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=layers_, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, rope_theta=1e4)
    params = jax.tree.map(lambda x: x * 4.0 if x.ndim == 2 else x, init_target_params(cfg, seed))
    return cfg, params


def test_verify_rows_match_the_dense_mask_forward():
    cfg, params = _tiny()
    model = bind_target(cfg, params)
    rng = np.random.default_rng(0)
    B, S, R = 2, 40, 6
    cache = KVCache.zeros(cfg.num_hidden_layers, B, S, cfg.num_key_value_heads, cfg.head_dim)
    cache = KVCache(tuple(c + jnp.asarray(rng.standard_normal(c.shape), jnp.float32)
                          for c in cache.k),
                    tuple(c + jnp.asarray(rng.standard_normal(c.shape), jnp.float32)
                          for c in cache.v))
    start = jnp.asarray([3, 30], jnp.int32)
    parents = np.array([-1, 0, 0, 1, 3])  # a small tree
    anc = np.eye(R, dtype=bool)
    anc[:, 0] = True
    for i, p in enumerate(parents):
        j = p + 1
        while j > 0:
            anc[i + 1, j] = True
            j = parents[j - 1] + 1
    ancestor = jnp.asarray(np.broadcast_to(anc, (B, R, R)))
    depths = jnp.asarray(np.broadcast_to([0, 1, 1, 2, 3], (B, R - 1)), jnp.int32)
    tokens = jnp.asarray(rng.integers(0, 64, (B, R - 1)), jnp.int32)
    t0 = jnp.asarray([5, 9], jnp.int32)
    logits, _, new_cache = verify(model, cache, t0, start, tokens, depths, ancestor, ())
    rows = jnp.concatenate([t0[:, None], tokens], 1)
    pos = start[:, None] + jnp.concatenate([jnp.zeros((B, 1), jnp.int32), 1 + depths], 1)
    ref = model(rows, pos, verify_mask(start, ancestor, S), cache, start)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(model.logits(ref.hidden)),
                               rtol=1e-5, atol=1e-5)
    for a, b in zip(new_cache.k + new_cache.v, ref.cache.k + ref.cache.v):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunk", [4, 7, 64])
def test_chunked_prefill_of_a_padded_batch_matches_one_dense_forward(chunk):
    cfg, params = _tiny()
    model = bind_target(cfg, params)
    rng = np.random.default_rng(chunk)
    B, T, S = 3, 19, 30
    lengths = np.array([19, 11, 1], np.int32)
    prompt = rng.integers(0, 64, (B, T)).astype(np.int32)
    taps = (0, 1)
    out, last = prefill(model, jnp.asarray(prompt), jnp.asarray(lengths), S, taps, chunk=chunk)
    for b in range(B):
        n = int(lengths[b])
        one = model(jnp.asarray(prompt[b:b + 1, :n]), jnp.arange(n)[None], causal_mask(1, n, n),
                    KVCache.zeros(cfg.num_hidden_layers, 1, n, cfg.num_key_value_heads,
                                  cfg.head_dim), jnp.zeros((1,), jnp.int32), tap_layers=taps)
        np.testing.assert_allclose(np.asarray(out.hidden[b, :n]), np.asarray(one.hidden[0]),
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(out.taps[b, :n]), np.asarray(one.taps[0]),
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(last[b]),
                                   np.asarray(model.logits(one.hidden[0, n - 1])),
                                   rtol=1e-5, atol=1e-5)
        for a, c in zip(out.cache.k + out.cache.v, one.cache.k + one.cache.v):
            np.testing.assert_allclose(np.asarray(a[b, :, :n]), np.asarray(c[0]),
                                       rtol=1e-5, atol=1e-5)


def test_long_prompt_decode_matches_the_plain_path(monkeypatch):
    """A prompt spanning many prefill chunks and key blocks decodes exactly as greedy argmax
    over plain dense forwards of the whole sequence."""
    monkeypatch.setattr(target_mod, "PREFILL_CHUNK", 16)
    monkeypatch.setattr(layers, "ATTENTION_BLOCK", 24)
    cfg, params = _tiny(layers_=2, seed=3)
    target = Target(cfg, params)
    P, n = 101, 12  # 7 chunks (the last one shifted), 5 key blocks
    prompt = np.random.default_rng(7).integers(0, 64, P).astype(np.int32)
    ours = np.asarray(dj.generate(target, prompt, max_new_tokens=n, stop_ids=()))
    seq = np.zeros((1, P + n), np.int32)
    seq[0, :P] = prompt
    for i in range(n):  # plain path: one dense causal forward per token, fixed width
        logits = dj.target_logits(target, seq)
        seq[0, P + i] = int(np.argmax(np.asarray(logits[0, P + i - 1])))
    np.testing.assert_array_equal(ours, seq[0, P:])


@pytest.mark.parametrize("mode", ["auto", "bucket", "dense"])
@pytest.mark.parametrize("B,T,N,K,D,S,block", [
    (1, 1, 4, 2, 8, 40, 8),      # an AR row over several buckets
    (2, 17, 4, 2, 8, 70, 16),    # a 17-row tree
])
def test_attention_modes_match_plain_attention(mode, B, T, N, K, D, S, block):
    """``bucket`` (a switch over prefix buckets), ``dense`` (one masked pass over every slot)
    and ``auto`` (bucket here, dense when lowered for a GPU) compute the same attention."""
    rng = np.random.default_rng(T)
    f32 = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    q, new_k, new_v = f32(B, T, N, D), f32(B, T, K, D), f32(B, T, K, D)
    cache_k, cache_v = f32(B, K, S, D), f32(B, K, S, D)
    prefix = rng.integers(1, S - T + 1, B)
    block_mask = np.tril(np.ones((B, T, T), bool))
    got = jax.jit(lambda *a: attend_cached(*a, block=block, mode=mode))(
        q, new_k, new_v, jnp.asarray(block_mask), cache_k, cache_v,
        jnp.asarray(prefix, jnp.int32))
    want = _dense_reference(q, new_k, new_v, block_mask, cache_k, cache_v, prefix)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=2e-6)


def test_fused_cache_pass_reads_a_bfloat16_cache_like_the_dots():
    """A decode row over a bfloat16 cache: the fused pass (float32 products of the bf16 values)
    agrees with the dots (bf16 operands, float32 accumulation) to float32 rounding, and both
    ignore slots at or past each row's prefix."""
    rng = np.random.default_rng(5)
    B, N, K, D, S = 3, 6, 2, 16, 48
    bf = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.bfloat16)  # noqa: E731
    q, new_k, new_v = bf(B, 1, N, D), bf(B, 1, K, D), bf(B, 1, K, D)
    cache_k, cache_v = bf(B, K, S, D), bf(B, K, S, D)
    prefix = jnp.asarray([0, 17, 40], jnp.int32)
    mask = jnp.ones((B, 1, 1), bool)
    run = jax.jit(lambda ck, cv, fused: attend_cached(q, new_k, new_v, mask, ck, cv, prefix,
                                                      mode="dense", fused=fused),
                  static_argnums=2)
    fused, dots = run(cache_k, cache_v, True), run(cache_k, cache_v, False)
    np.testing.assert_allclose(np.asarray(fused, np.float32), np.asarray(dots, np.float32),
                               rtol=1e-2, atol=1e-2)
    junk_k = cache_k.at[:, :, 40:].set(1e4)    # past every prefix: never read
    np.testing.assert_array_equal(np.asarray(run(junk_k, cache_v, True), np.float32),
                                  np.asarray(fused, np.float32))


def test_attention_mode_is_checked():
    z = jnp.zeros((1, 1, 2, 4))
    with pytest.raises(ValueError, match="attention mode"):
        attend_cached(z, z[:, :, :1], z[:, :, :1], jnp.ones((1, 1, 1), bool),
                      jnp.zeros((1, 1, 8, 4)), jnp.zeros((1, 1, 8, 4)),
                      jnp.ones((1,), jnp.int32), mode="flash")
    from dominotree_jax.config import ConfigError
    with pytest.raises(ConfigError, match="attention_impl"):
        TargetConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                     attention_impl="flash")


def test_auto_attention_lowers_to_one_dense_pass_for_cuda():
    """Lowered for ``cuda`` the ``auto`` mode holds no conditional; for ``cpu`` it is the
    bucket switch."""
    B, T, N, K, D, S = 1, 17, 4, 2, 8, 2048
    shapes = [(B, T, N, D), (B, T, K, D), (B, T, K, D), (B, T, T), (B, K, S, D), (B, K, S, D),
              (B,)]
    dtypes = [jnp.float32] * 3 + [bool, jnp.float32, jnp.float32, jnp.int32]
    args = [jax.ShapeDtypeStruct(s, d) for s, d in zip(shapes, dtypes)]
    traced = jax.jit(attend_cached).trace(*args)
    for platform, conditionals in (("cuda", 0), ("cpu", 1)):
        hlo = traced.lower(lowering_platforms=(platform,)).as_text(dialect="hlo")
        assert len(re.findall(r"\sconditional\(", hlo)) == conditionals, platform


def test_prefix_buckets_stop_below_half_the_cache():
    """The bucket switch's power-of-two slices stop below ``S / BUCKET_SHARE_MAX`` slots: a
    slice is a copy of the slots it reads, so a longer prefix reads the whole cache in place
    (a 4k-context SmolLM2 step: 24.5 -> 21.6 ms, Zen 5), but the first block's bucket stays,
    so a conditional remains (a whole-cache read outside one is copied every decode step).
    8-slot blocks: S = 40: 8, 16, 40; S = 12: 8, 12."""
    from dominotree_jax.model import layers
    assert layers.BUCKET_SHARE_MAX == 2
    B, T, N, K, D = 1, 1, 4, 2, 8
    for S, want in ((40, 3), (12, 2)):
        shapes = [(B, T, N, D), (B, T, K, D), (B, T, K, D), (B, T, T), (B, K, S, D),
                  (B, K, S, D), (B,)]
        dtypes = [jnp.float32] * 3 + [bool, jnp.float32, jnp.float32, jnp.int32]
        args = [jax.ShapeDtypeStruct(s, d) for s, d in zip(shapes, dtypes)]
        hlo = jax.jit(lambda *a: attend_cached(*a, block=8, mode="bucket")).lower(
            *args).as_text(dialect="hlo")
        (branches,) = re.findall(r"branch_computations=\{([^}]*)\}", hlo)
        assert len(branches.split(",")) == want, S


def _layer_sized_bf16_outside_the_branches(fn, B, K, S, D, *args) -> int:
    """Instructions of the compiled program's ENTRY computation (outside the bucket switch's
    branches) holding a whole bf16 cache layer ``[B, K, S, D]``."""
    hlo = jax.jit(fn).lower(*args).compile().as_text()
    entry = hlo[hlo.index("\nENTRY"):]
    return len(re.findall(rf"bf16\[{B},{K},{S},{D}\]", entry))


def test_a_bf16_cache_is_viewed_only_where_a_pass_reads_it():
    """A decode step over a bfloat16 cache stored as its bits (``cache.CACHE_BITS``) views only
    the slots each pass reads, inside the bucket ``switch``: the compiled target step holds no
    bf16 copy of a whole layer outside it (viewing the layer before ``attend_cached``, as the
    target once did, made XLA:CPU copy every slot of every layer at every step: a bf16 4k
    step 45.8 -> 30.2 ms, Zen 4). The values read are the bf16 layer's."""
    from dominotree_jax.model.cache import as_stored, storage_dtype, view_layer
    from dominotree_jax.precision import cast_params
    cfg, params = _tiny()
    model = bind_target(cfg, cast_params(params, "bfloat16"))
    B, S = 1, 2 * layers.ATTENTION_BLOCK + 64   # buckets: one block, then the whole cache
    K, D = cfg.num_key_value_heads, cfg.head_dim
    rng = np.random.default_rng(3)
    layers_kv = [as_stored(jnp.asarray(rng.standard_normal((B, K, S, D))),
                           storage_dtype(jnp.bfloat16)) for _ in range(2 * cfg.num_hidden_layers)]
    L = cfg.num_hidden_layers
    cache = KVCache(tuple(layers_kv[:L]), tuple(layers_kv[L:]))
    tok, pos = jnp.asarray([[7]], jnp.int32), jnp.asarray([9], jnp.int32)

    def step(cache, tok, pos):
        out = model.forward_cached(tok, pos[:, None], cache, pos, pos, jnp.ones((1, 1, 1), bool))
        return out.hidden, out.cache

    assert _layer_sized_bf16_outside_the_branches(step, B, K, S, D, cache, tok, pos) == 0
    q = jnp.asarray(rng.standard_normal((B, 1, cfg.num_attention_heads, D)), jnp.bfloat16)
    nk = jnp.asarray(rng.standard_normal((B, 1, K, D)), jnp.bfloat16)
    mask, prefix = jnp.ones((B, 1, 1), bool), jnp.asarray([40], jnp.int32)
    stored, viewed = cache.k[0], view_layer(cache.k[0])

    def read(kc, vc):
        return attend_cached(q, nk, nk, mask, kc, vc, prefix, block=32)
    np.testing.assert_array_equal(np.asarray(read(stored, stored), np.float32),
                                  np.asarray(read(viewed, viewed), np.float32))
    # the check can fail: the whole layer viewed first is a bf16 copy outside the switch
    if jax.default_backend() == "cpu":
        assert _layer_sized_bf16_outside_the_branches(
            lambda kc, vc: read(view_layer(kc), view_layer(vc)), B, K, S, D, stored, stored) > 0
