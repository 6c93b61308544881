"""Tree attention masks and chain trees (dominotree_jax/tree/mask.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dominotree_jax.tree import build_tree, chain_tree, tree_attention


def brute_force(parents_N, valid_N):
    N = len(parents_N)
    mask = np.zeros((N + 1, N + 1), bool)
    depth_plus_one = np.zeros(N + 1, np.int32)
    mask[0, 0] = True
    for i in range(N):
        row = i + 1
        mask[row, row] = mask[row, 0] = True
        if not valid_N[i]:
            depth_plus_one[row] = 1
            continue
        p, d = int(parents_N[i]), 1
        while p >= 0:
            mask[row, p + 1] = True
            p, d = int(parents_N[p]), d + 1
        depth_plus_one[row] = d
    return mask, depth_plus_one


def random_tree(rng, N):
    n = int(rng.integers(0, N + 1))
    parents = np.array([rng.integers(-1, i) if i < n else -1 for i in range(N)], np.int32)
    valid = np.arange(N) < n
    if rng.random() < 0.5:  # garbage parents in invalid slots must be ignored
        parents[n:] = rng.integers(-1, N, size=N - n)
    if rng.random() < 0.3:  # a long chain
        parents[:n] = np.arange(n) - 1
    return parents, valid


_tree_attention = jax.jit(tree_attention)


@pytest.mark.parametrize("N", [1, 2, 7, 16, 33])
@settings(max_examples=40, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1))
def test_matches_brute_force(N, seed):
    parents, valid = random_tree(np.random.default_rng(seed), N)
    mask, dp1 = _tree_attention(parents, valid)
    ref_mask, ref_dp1 = brute_force(parents, valid)
    assert mask.shape == (N + 1, N + 1) and mask.dtype == jnp.bool_
    assert dp1.dtype == jnp.int32
    np.testing.assert_array_equal(mask, ref_mask)
    np.testing.assert_array_equal(dp1, ref_dp1)


def test_on_built_tree():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(6, 40)).astype(np.float32) * 3
    tree = build_tree(base, None, 0, None, None, None, None, None, method="ddtree", budget=16,
                      node_topk=3, top_m=0, prefix_len=1)
    mask, dp1 = _tree_attention(tree.parents, tree.valid)
    np.testing.assert_array_equal(dp1[1:], np.asarray(tree.depths) + 1)
    assert dp1[0] == 0
    ref_mask, _ = brute_force(np.asarray(tree.parents), np.asarray(tree.valid))
    np.testing.assert_array_equal(mask, ref_mask)


def test_exhausted_tree_tail():
    base = np.zeros((2, 4), np.float32)
    tree = build_tree(base, None, 0, None, None, None, None, None, method="ddtree", budget=8,
                      node_topk=2, top_m=0, prefix_len=1)
    mask, dp1 = _tree_attention(tree.parents, tree.valid)
    for row in (7, 8):  # invalid nodes: themselves and the root only
        assert mask[row].sum() == 2 and mask[row, 0] and mask[row, row]
    np.testing.assert_array_equal(dp1, [0, 1, 1, 2, 2, 2, 2, 1, 1])


def test_vmap():
    rng = np.random.default_rng(1)
    trees = [random_tree(rng, 9) for _ in range(5)]
    parents = np.stack([t[0] for t in trees])
    valid = np.stack([t[1] for t in trees])
    masks, dp1s = jax.jit(jax.vmap(tree_attention))(parents, valid)
    for b in range(5):
        ref_mask, ref_dp1 = brute_force(parents[b], valid[b])
        np.testing.assert_array_equal(masks[b], ref_mask)
        np.testing.assert_array_equal(dp1s[b], ref_dp1)


def test_chain_tree():
    tokens = jnp.array([5, 3, 9, 9], jnp.int32)
    logprobs = jnp.array([-0.5, -1.0, -0.25, -2.0], jnp.float32)
    tree = jax.jit(chain_tree)(tokens, logprobs)
    np.testing.assert_array_equal(tree.tokens, tokens)
    np.testing.assert_array_equal(tree.parents, [-1, 0, 1, 2])
    np.testing.assert_array_equal(tree.depths, [0, 1, 2, 3])
    np.testing.assert_allclose(tree.scores, [-0.5, -1.5, -1.75, -3.75])
    assert int(tree.num_nodes) == 4 and bool(tree.valid.all())
    mask, dp1 = _tree_attention(tree.parents, tree.valid)
    np.testing.assert_array_equal(mask, np.tril(np.ones((5, 5), bool)))
    np.testing.assert_array_equal(dp1, np.arange(5))


def test_chain_tree_batched():
    tokens = jnp.arange(12, dtype=jnp.int32).reshape(3, 4)
    tree = chain_tree(tokens, jnp.zeros((3, 4)))
    assert tree.parents.shape == (3, 4) and tree.num_nodes.shape == (3,)
    np.testing.assert_array_equal(tree.depths[2], [0, 1, 2, 3])
