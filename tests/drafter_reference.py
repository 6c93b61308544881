"""An independent float64 NumPy reference of the drafter block forward and the Domino head.

Written from docs/algorithm.md §2–3 only (it imports nothing from ``dominotree_jax``): weights
come as flat
``{checkpoint name: array}`` dicts, one batch row at a time, the whole context recomputed from
its features (no caching), positions ``0 .. n-1`` for the context.
"""

from __future__ import annotations

import numpy as np


def _f64(a):
    return np.asarray(a, dtype=np.float64)


def rms_norm(x, w, eps):
    x = _f64(x)
    return _f64(w) * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def linear(x, w_out_in):
    return _f64(x) @ _f64(w_out_in).T


def rope(x, positions_T, theta):
    """Rotate-half RoPE at integer positions of ``x [T, heads, D]`` (query or kv heads)."""
    D = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    ang = np.asarray(positions_T, np.float64)[:, None] * inv_freq[None, :]
    cos = np.cos(np.concatenate([ang, ang], -1))[:, None, :]
    sin = np.sin(np.concatenate([ang, ang], -1))[:, None, :]
    half = D // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def log_softmax(x):
    m = np.max(x, -1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), -1, keepdims=True))


def _kv(w, p, x_TH, positions, heads_kv, head_dim, eps, theta):
    T = x_TH.shape[0]
    k = linear(x_TH, w[p + "k_proj.weight"]).reshape(T, heads_kv, head_dim)
    k = rms_norm(k, w[p + "k_norm.weight"], eps)
    v = linear(x_TH, w[p + "v_proj.weight"]).reshape(T, heads_kv, head_dim)
    return rope(k, positions, theta), v


def draft_block(w, embed_VH, head_VH, ctx_feats_TF, t0, start, *, num_layers, num_heads,
                num_kv_heads, head_dim, eps, theta, block_size, mask_token_id, shift_label):
    """One batch row: ``(z [K, H], base [K, V])`` indexed by tree depth (float64)."""
    n_ctx = ctx_feats_TF.shape[0]
    ctx_TH = rms_norm(linear(ctx_feats_TF, w["fc.weight"]), w["hidden_norm.weight"], eps)
    ctx_pos = np.arange(n_ctx)
    tokens = np.array([t0] + [mask_token_id] * (block_size - 1))
    pos = start + np.arange(block_size)
    h = _f64(embed_VH)[tokens]
    group = num_heads // num_kv_heads
    for i in range(num_layers):
        p = f"layers.{i}."
        a = p + "self_attn."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = linear(x, w[a + "q_proj.weight"]).reshape(block_size, num_heads, head_dim)
        q = rope(rms_norm(q, w[a + "q_norm.weight"], eps), pos, theta)
        kc, vc = _kv(w, a, ctx_TH, ctx_pos, num_kv_heads, head_dim, eps, theta)
        kb, vb = _kv(w, a, x, pos, num_kv_heads, head_dim, eps, theta)
        k = np.concatenate([kc, kb], 0)
        v = np.concatenate([vc, vb], 0)
        out = np.zeros((block_size, num_heads, head_dim))
        for n in range(num_heads):  # no mask: every slot sees all context and the whole block
            s = q[:, n] @ k[:, n // group].T / np.sqrt(head_dim)
            pr = np.exp(s - s.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            out[:, n] = pr @ v[:, n // group]
        h = h + linear(out.reshape(block_size, -1), w[a + "o_proj.weight"])
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        m = p + "mlp."
        gated = silu(linear(x, w[m + "gate_proj.weight"])) * linear(x, w[m + "up_proj.weight"])
        h = h + linear(gated, w[m + "down_proj.weight"])
    z = rms_norm(h, w["norm.weight"], eps)
    if not shift_label:
        z = z[1:]
    return z, z @ _f64(head_VH).T


def gru(w, x, s):
    """Bias-free PyTorch GRU step, gate order (r, z, n)."""
    gi = linear(x, w["prefix_gru.weight_ih_l0"])
    gh = linear(s, w["prefix_gru.weight_hh_l0"])
    G = s.shape[-1]
    r = sigmoid(gi[:G] + gh[:G])
    u = sigmoid(gi[G:2 * G] + gh[G:2 * G])
    n = np.tanh(gi[2 * G:] + r * gh[2 * G:])
    return (1 - u) * n + u * s


def corrected(w, base_V, z_H, s_G):
    hidden = silu(linear(np.concatenate([z_H, s_G]), w["embed_proj.0.weight"]))
    return base_V + linear(hidden, w["embed_proj.2.weight"])


def domino_chain(w, embed_VH, z_JH, base_JV, t0, prefix_len):
    """Greedy Domino chain for one row → (tokens [K], log-probs [K])."""
    G = w["prefix_gru.weight_hh_l0"].shape[1]
    embed = _f64(embed_VH)
    s = gru(w, embed[t0], np.zeros(G))
    tokens, logprobs = [], []
    for d in range(z_JH.shape[0]):
        logits = base_JV[d] if d < prefix_len else corrected(w, base_JV[d], z_JH[d], s)
        tok = int(np.argmax(logits))
        tokens.append(tok)
        logprobs.append(log_softmax(logits)[tok])
        s = gru(w, embed[tok], s)
    return np.array(tokens), np.array(logprobs)
