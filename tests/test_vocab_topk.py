"""The exact two-stage top-k (``tree/topk.py``) against ``lax.top_k``, ties included, and the
tree builder with it in place of ``lax.top_k``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dominotree_jax.tree import builder, build_tree
from dominotree_jax.tree.reference import build_tree_numpy
from dominotree_jax.tree.topk import two_stage_top_k, vocab_top_k


def _same_as_lax(x, k, chunk):
    want_v, want_i = jax.lax.top_k(x, k)
    got_v, got_i = jax.jit(lambda a: two_stage_top_k(a, k, chunk))(x)
    np.testing.assert_array_equal(np.asarray(got_i), np.asarray(want_i))
    np.testing.assert_array_equal(np.asarray(got_v), np.asarray(want_v))
    assert got_i.dtype == want_i.dtype and got_v.dtype == x.dtype


@pytest.mark.parametrize("V,k,chunk", [(1000, 64, 128), (1000, 8, 128), (1024, 64, 64),
                                       (151936 // 16, 64, 2048), (300, 5, 7), (130, 64, 128)])
@pytest.mark.parametrize("seed", range(3))
def test_matches_lax_top_k(V, k, chunk, seed):
    rng = np.random.default_rng(seed)
    _same_as_lax(jnp.asarray(rng.normal(size=(3, V)), jnp.float32), k, chunk)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_ties_lower_index_first(dtype):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 4, size=(2, 5, 999)), dtype)  # massive ties across chunks
    _same_as_lax(x, 64, 100)
    _same_as_lax(jnp.zeros((999,), dtype), 40, 64)  # all equal: indices 0..39


def test_neg_inf_and_fewer_finite_than_k():
    x = np.full((700,), -np.inf, np.float32)
    x[[5, 400, 699]] = [1.0, 3.0, 2.0]
    _same_as_lax(jnp.asarray(x), 16, 64)  # -inf picks: real indices, never the padding


def test_integers_and_bad_k():
    x = jnp.asarray(np.random.default_rng(1).integers(-5, 5, size=(513,)), jnp.int32)
    _same_as_lax(x, 10, 32)
    with pytest.raises(ValueError, match="k="):
        two_stage_top_k(x, 514)


def test_vocab_top_k_is_lax_here():
    x = jnp.asarray(np.random.default_rng(2).normal(size=(4, 5000)), jnp.float32)
    for a, b in zip(vocab_top_k(x, 64), jax.lax.top_k(x, 64)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_builder_with_two_stage_top_k(monkeypatch):
    """The builder's trees do not change when its top-k runs in two stages (the GPU path)."""
    monkeypatch.setattr(builder, "vocab_top_k", lambda x, k: two_stage_top_k(x, k, 32))
    rng = np.random.default_rng(3)
    J, V, H, G, E = 4, 500, 16, 8, 12
    f32 = np.float32
    case = dict(base_logits=np.round(rng.normal(size=(J, V)) * 2, 1).astype(f32),  # ties
                hidden=rng.normal(size=(J, H)).astype(f32), root_token=np.int32(5),
                embed=rng.normal(size=(V, H)).astype(f32),
                gru_w_ih=(rng.normal(size=(3 * G, H)) * 0.4).astype(f32),
                gru_w_hh=(rng.normal(size=(3 * G, G)) * 0.4).astype(f32),
                proj_w1=(rng.normal(size=(E, H + G)) * 0.4).astype(f32),
                proj_w2=rng.normal(size=(V, E)).astype(f32))
    for method in ("ddtree", "dominotree"):
        statics = dict(method=method, budget=12, node_topk=4, top_m=64, prefix_len=1)
        ref = build_tree_numpy(**case, **statics)
        tree = build_tree(**case, **statics, use_pallas=False)
        for field in ("tokens", "parents", "depths", "num_nodes"):
            np.testing.assert_array_equal(getattr(tree, field), getattr(ref, field))
