"""Gated DeltaNet on paths: the tree-masked solve equals the token-by-token recurrence along
every root-to-node path, for chains and random trees, and ``absorb`` gives the state after a
kept path (NumPy references, float64)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from dominotree_jax.model.gated_deltanet import (RecurrentRows, RecurrentState, absorb,
                                                 path_conv, path_delta_rule)


def random_tree(rng, T):
    """Parents in topological order (parent < child; row 0 the root) and the inclusive
    ancestor mask."""
    parent = [-1] + [int(rng.integers(0, t)) for t in range(1, T)]
    vis = np.zeros((T, T), bool)
    for t in range(T):
        j = t
        while j >= 0:
            vis[t, j] = True
            j = parent[j]
    return parent, vis


def path_of(vis_TT, t):
    return [j for j in range(vis_TT.shape[0]) if vis_TT[t, j]]


def sequential(q, k, v, g, beta, S0, path):
    """The recurrence along ``path`` (float64): (outputs per path row, final state)."""
    S = S0.astype(np.float64).copy()
    outs = []
    for j in path:
        S = S * np.exp(g[j])[:, None, None]
        mem = np.einsum("nkv,nk->nv", S, k[j])
        delta = (v[j] - mem) * beta[j][:, None]
        S = S + k[j][:, :, None] * delta[:, None, :]
        outs.append(np.einsum("nkv,nk->nv", S, q[j]))
    return outs, S


def case(rng, T, heads=3, dk=4, dv=5):
    def unit(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)
    q = unit(rng.standard_normal((T, heads, dk))) * dk ** -0.5
    k = unit(rng.standard_normal((T, heads, dk)))
    v = rng.standard_normal((T, heads, dv))
    g = -rng.uniform(0.01, 1.0, (T, heads))
    beta = rng.uniform(0.1, 0.9, (T, heads))
    S0 = rng.standard_normal((heads, dk, dv))
    return q, k, v, g, beta, S0


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_row_gets_the_recurrence_of_its_own_path(shape, seed):
    rng = np.random.default_rng(seed)
    T = 9
    vis = (np.tril(np.ones((T, T), bool)) if shape == "chain" else random_tree(rng, T)[1])
    q, k, v, g, beta, S0 = case(rng, T)
    o, u, gcum = path_delta_rule(*(jnp.asarray(x[None], jnp.float32)
                                   for x in (q, k, v, g, beta, S0)), jnp.asarray(vis[None]))
    for t in range(T):
        outs, S_t = sequential(q, k, v, g, beta, S0, path_of(vis, t))
        np.testing.assert_allclose(np.asarray(o[0, t]), outs[-1], rtol=1e-5, atol=1e-5)
        # the state after row t, from the rows of its path, in path order
        path = path_of(vis, t)
        rows = RecurrentRows(conv_in=jnp.zeros((1, len(path), 2)), k=k[None, path].astype(
            np.float32), u=u[:, path], gcum=gcum[:, path])
        st = absorb(RecurrentState(jnp.zeros((1, 1, 2)), jnp.asarray(S0[None], jnp.float32)),
                    rows, jnp.asarray([len(path)]))
        np.testing.assert_allclose(np.asarray(st.ssm[0]), S_t, rtol=1e-5, atol=1e-5)


def test_absorb_takes_count_rows_per_batch_row_and_none_keeps_the_state():
    rng = np.random.default_rng(3)
    T, kernel, C = 6, 4, 3
    q, k, v, g, beta, S0 = case(rng, T)
    vis = np.tril(np.ones((T, T), bool))
    args = (jnp.asarray(np.stack([x, x]), jnp.float32) for x in (q, k, v, g, beta, S0))
    o, u, gcum = path_delta_rule(*args, jnp.asarray(np.stack([vis, vis])))
    conv_in = rng.standard_normal((2, T, C)).astype(np.float32)
    conv0 = rng.standard_normal((2, kernel - 1, C)).astype(np.float32)
    state = RecurrentState(jnp.asarray(conv0), jnp.asarray(np.stack([S0, S0]), jnp.float32))
    rows = RecurrentRows(jnp.asarray(conv_in), jnp.asarray(np.stack([k, k]), jnp.float32), u,
                         gcum)
    new = absorb(state, rows, jnp.asarray([2, 0]))
    _, S2 = sequential(q, k, v, g, beta, S0, [0, 1])
    np.testing.assert_allclose(np.asarray(new.ssm[0]), S2, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(new.ssm[1]), np.asarray(state.ssm[1]))
    np.testing.assert_array_equal(np.asarray(new.conv[0]),
                                  np.concatenate([conv0[0], conv_in[0]])[2:2 + kernel - 1])
    np.testing.assert_array_equal(np.asarray(new.conv[1]), conv0[1])


@pytest.mark.parametrize("seed", [0, 1])
def test_path_conv_reads_each_rows_ancestors_then_the_committed_inputs(seed):
    rng = np.random.default_rng(seed)
    T, kernel, C = 8, 4, 5
    parent, vis = random_tree(rng, T)
    depth = [0] * T
    for t in range(1, T):
        depth[t] = depth[parent[t]] + 1
    x = rng.standard_normal((T, C))
    conv0 = rng.standard_normal((kernel - 1, C))
    w = rng.standard_normal((C, kernel))
    got = path_conv(jnp.asarray(x[None], jnp.float32), jnp.asarray(conv0[None], jnp.float32),
                    jnp.asarray(w, jnp.float32), jnp.asarray(vis[None]),
                    jnp.asarray(np.asarray(depth)[None], jnp.int32))
    for t in range(T):
        seq = list(conv0) + [x[j] for j in path_of(vis, t)]
        window = np.stack(seq[-kernel:])             # oldest first
        want = np.sum(window * w.T, axis=0)
        np.testing.assert_allclose(np.asarray(got[0, t]), want, rtol=1e-5, atol=1e-5)
