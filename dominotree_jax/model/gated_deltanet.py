"""Gated DeltaNet, the linear-attention layer of the Qwen3.5 / Qwen3-Next hybrids, verified on
draft trees (docs/algorithm.md §1.1, §5.1).

A layer keeps a recurrent state instead of a KV cache: the last ``conv_kernel - 1`` inputs of a
short causal depthwise convolution, and per value head a ``[key_dim, value_dim]`` matrix
``S`` that every token updates by the gated delta rule

    S ← exp(g_t) S;   S ← S + k_t (β_t (v_t − Sᵀ k_t))ᵀ;   o_t = Sᵀ q_t.

Rows of a forward (a prefill chunk, a chain, a draft tree) each see the rows of their own
root-to-row path (``vis_BTT``, the attention layers' in-block mask). Unrolled along a path the
state after row ``t`` is ``exp(Γ_t) S₀ + Σ_{j ≤ t on the path} exp(Γ_t − Γ_j) k_j u_jᵀ``
(``Γ``: the summed log-decays ``g`` along the path, ``S₀``: the committed state), with the
corrected values ``u`` the solution of one unit lower-triangular system over the rows
``(I + M) U = β (V − exp(Γ) K S₀)``, ``M[t, j] = β_t exp(Γ_t − Γ_j) k_t·k_j`` for ``j`` a
strict ancestor of ``t``. Row ``t``'s equation only involves its ancestors, so one solve with
the tree's ancestor mask gives every node the values of its own path: a chain is the causal
mask, the chunked form of prefill; a tree costs the same ``T × T`` products. Nothing is
written during the forward: the rows (``RecurrentRows``) are returned, and ``absorb`` moves
the state along the kept path once acceptance is known (``decoding/commit.py``).

Shapes here are named in words (the per-layer head counts are not the attention's ``K``):
``heads`` = value heads, ``dk`` / ``dv`` = key / value head dims, ``C`` = conv channels
(``2 · key heads · dk + heads · dv``).
"""

from __future__ import annotations

import functools
import jax
import jax.numpy as jnp
from flax import nnx

from dominotree_jax.config import LinearAttentionShape
from dominotree_jax.model.cache import RecurrentRows, RecurrentState
from dominotree_jax.model.layers import Linear
from dominotree_jax.sharding import declare


def _path_masks(vis_BTT):
    """(inclusive, strict) ancestor masks: every row is on its own path; a row's strict
    ancestors come before it (rows are in topological order: chains, pop-ordered trees)."""
    T = vis_BTT.shape[-1]
    eye = jnp.eye(T, dtype=bool)
    strict = vis_BTT & jnp.tril(jnp.ones((T, T), bool), -1)[None]
    return strict | eye[None], strict


def path_delta_rule(q, k, v, g, beta, ssm0, vis_BTT):
    """Gated delta rule over ``T`` rows, each along its own path (module docstring).

    ``q``, ``k`` ``[B, T, heads, dk]`` (normalised, ``q`` scaled), ``v`` ``[B, T, heads, dv]``,
    ``g`` (log-decay, ≤ 0) and ``beta`` ``[B, T, heads]``, ``ssm0`` ``[B, heads, dk, dv]``.
    Returns ``(o [B, T, heads, dv], u, gcum)``.
    """
    f32 = jnp.float32
    q, k, v, g, beta = (x.astype(f32) for x in (q, k, v, g, beta))
    incl_BTT, strict_BTT = _path_masks(vis_BTT)
    gcum = jnp.einsum("btj,bjn->btn", incl_BTT.astype(f32), g)
    diff = gcum.transpose(0, 2, 1)[:, :, :, None] - gcum.transpose(0, 2, 1)[:, :, None, :]

    def decay(mask_BTT):   # [B, heads, T, T]: exp(Γ_t − Γ_j) on the mask, 0 elsewhere
        return jnp.exp(jnp.where(mask_BTT[:, None], diff, -jnp.inf))

    kk = jnp.einsum("btnd,bjnd->bntj", k, k)
    m = beta.transpose(0, 2, 1)[..., None] * decay(strict_BTT) * kk
    eg = jnp.exp(gcum)[..., None]
    rhs = beta[..., None] * (v - eg * jnp.einsum("btnk,bnkv->btnv", k, ssm0))
    u = unit_lower_solve(m, rhs.transpose(0, 2, 1, 3))       # [B, heads, T, dv]
    qk = jnp.einsum("btnd,bjnd->bntj", q, k) * decay(incl_BTT)
    o = eg * jnp.einsum("btnk,bnkv->btnv", q, ssm0) + jnp.einsum("bntj,bnjv->btnv", qk, u)
    return o, u.transpose(0, 2, 1, 3), gcum


def unit_lower_solve(m, rhs):
    """``(I + m)⁻¹ rhs`` for strictly lower-triangular ``m`` ``[..., T, T]`` (nilpotent:
    ``m^T = 0``), as ``(I − m)(I + m²)(I + m⁴)…`` applied to ``rhs`` ``[..., T, X]``: matrix
    products only (XLA:CPU's triangular solve ran as a serial custom call that kept the layer's
    other products from running beside it)."""
    T = m.shape[-1]
    out = rhs - m @ rhs
    power = m @ m
    span = 2
    while span < T:
        out = out + power @ out
        span *= 2
        if span < T:
            power = power @ power
    return out


def path_conv(x_BTC, conv0, weight, vis_BTT, rel_BT):
    """Causal depthwise conv of each row over its own path: row ``r`` at depth ``rel_r`` in
    the block reads its ``m``-th ancestor (the path row at depth ``rel_r − m``), or, before the
    block, the committed inputs ``conv0`` ``[B, kernel − 1, C]``. ``weight`` ``[C, kernel]``
    (the last tap multiplies the row itself). Returns ``[B, T, C]`` float32 (no activation)."""
    f32 = jnp.float32
    x = x_BTC.astype(f32)
    kernel = weight.shape[-1]
    incl_BTT, _ = _path_masks(vis_BTT)
    out = jnp.zeros_like(x)
    for m in range(kernel):
        want_BT = rel_BT - m
        sel_BTT = incl_BTT & (rel_BT[:, None, :] == want_BT[:, :, None])
        x_m = jnp.einsum("brj,bjc->brc", sel_BTT.astype(f32), x)
        if m:
            idx_BT = jnp.clip(kernel - 1 + want_BT, 0, kernel - 2)
            before = jnp.take_along_axis(conv0.astype(f32), idx_BT[..., None], axis=1)
            x_m = x_m + jnp.where((want_BT < 0)[..., None], before, 0.0)
        out = out + x_m * weight[:, kernel - 1 - m].astype(f32)
    return out


def absorb(state: RecurrentState, rows: RecurrentRows, count_B) -> RecurrentState:
    """The state after the first ``count_b`` rows of ``rows``, which are in path order (a
    kept path, or a prefill chunk's rows); ``count_b = 0`` keeps row ``b``'s state."""
    f32 = jnp.float32
    T = rows.k.shape[1]
    last_B = jnp.clip(count_B - 1, 0, T - 1)
    g_last = jnp.take_along_axis(rows.gcum, last_B[:, None, None], axis=1)[:, 0]  # [B, heads]
    live_BT = jnp.arange(T)[None] < count_B[:, None]
    w = jnp.where(live_BT[..., None], jnp.exp(jnp.where(live_BT[..., None],
                                                        g_last[:, None] - rows.gcum, 0.0)), 0.0)
    ssm = (jnp.exp(g_last)[..., None, None] * state.ssm
           + jnp.einsum("btnk,btnv,btn->bnkv", rows.k, rows.u, w))
    keep = state.conv.shape[1]
    hist = jnp.concatenate([state.conv, rows.conv_in.astype(f32)], axis=1)
    conv = jnp.take_along_axis(hist, (count_B[:, None] + jnp.arange(keep)[None])[..., None],
                               axis=1)
    some_B = count_B > 0
    return RecurrentState(conv=jnp.where(some_B[:, None, None], conv, state.conv),
                          ssm=jnp.where(some_B[:, None, None, None], ssm, state.ssm))


def gather_path(rows: RecurrentRows, take) -> RecurrentRows:
    """``rows`` with every field passed through ``take`` (a gather of the kept path's rows)."""
    return RecurrentRows(*(take(x) for x in rows))


def _l2norm(x, eps=1e-6):
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


class GatedRMSNorm(nnx.Module):
    """RMSNorm of the value heads' outputs, then times ``silu(z)`` (float32)."""

    def __init__(self, dim: int, eps: float, *, dtype):
        self.weight = nnx.Param(jnp.ones((dim,), dtype), **declare("head_dim"))
        self.eps = eps

    def __call__(self, x, z):
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(jnp.float32) * x32 * jax.nn.silu(z.astype(jnp.float32))


class GatedDeltaNet(nnx.Module):
    """The Qwen3.5 layout: separate ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``,
    ``in_proj_a``; ``conv1d.weight`` ``[C, 1, kernel]`` as released."""

    def __init__(self, hidden: int, shape: LinearAttentionShape, eps: float, *, dtype,
                 operand_dtype=None, rngs: nnx.Rngs):
        self.shape = shape
        s = shape
        lin = functools.partial(Linear, dtype=dtype, operand_dtype=operand_dtype, rngs=rngs)
        self.in_proj_qkv = lin(hidden, s.conv_dim, axes=("linear_channels", "embed"))
        self.in_proj_z = lin(hidden, s.value_dim, axes=("linear_channels", "embed"))
        self.in_proj_b = lin(hidden, s.num_value_heads, axes=("linear_heads", "embed"))
        self.in_proj_a = lin(hidden, s.num_value_heads, axes=("linear_heads", "embed"))
        self.conv1d = _Conv(s.conv_dim, s.conv_kernel, dtype=dtype, rngs=rngs)
        self.dt_bias = nnx.Param(jnp.ones((s.num_value_heads,), dtype),
                                 **declare("linear_heads"))
        self.A_log = nnx.Param(
            jnp.log(jax.random.uniform(rngs.params(), (s.num_value_heads,), jnp.float32, 1.0,
                                       16.0)).astype(dtype), **declare("linear_heads"))
        self.norm = GatedRMSNorm(s.value_head_dim, eps, dtype=dtype)
        self.out_proj = lin(s.value_dim, hidden, axes=("embed", "linear_channels"))

    def __call__(self, x_BTH, state: RecurrentState, vis_BTT, rel_BT):
        """``(out [B, T, H], RecurrentRows)``; ``state`` is only read."""
        s = self.shape
        B, T, _ = x_BTH.shape
        mixed_BTC = self.in_proj_qkv(x_BTH)
        z = self.in_proj_z(x_BTH).reshape(B, T, s.num_value_heads, s.value_head_dim)
        beta = jax.nn.sigmoid(self.in_proj_b(x_BTH))
        a = self.in_proj_a(x_BTH)
        g = (-jnp.exp(self.A_log[...].astype(jnp.float32))
             * jax.nn.softplus(a + self.dt_bias[...].astype(jnp.float32)))
        conv_BTC = jax.nn.silu(path_conv(mixed_BTC, state.conv, self.conv1d.weight[...][:, 0],
                                         vis_BTT, rel_BT))
        q, k, v = jnp.split(conv_BTC, [s.key_dim, 2 * s.key_dim], axis=-1)
        rep = s.num_value_heads // s.num_key_heads
        q = jnp.repeat(q.reshape(B, T, s.num_key_heads, s.key_head_dim), rep, axis=2)
        k = jnp.repeat(k.reshape(B, T, s.num_key_heads, s.key_head_dim), rep, axis=2)
        v = v.reshape(B, T, s.num_value_heads, s.value_head_dim)
        q = _l2norm(q) * (s.key_head_dim ** -0.5)
        k = _l2norm(k)
        o, u, gcum = path_delta_rule(q, k, v, g, beta, state.ssm, vis_BTT)
        o = self.norm(o, z).reshape(B, T, s.value_dim)
        return self.out_proj(o), RecurrentRows(mixed_BTC.astype(jnp.float32), k, u, gcum)


class _Conv(nnx.Module):
    def __init__(self, channels: int, kernel: int, *, dtype, rngs: nnx.Rngs):
        self.weight = nnx.Param(
            0.3 * jax.random.normal(rngs.params(), (channels, 1, kernel), dtype),
            **declare("linear_channels", "conv_kernel", "conv_kernel"))
