"""DFlash2's additions to the DFlash block (docs/algorithm.md §3c): the in-block dynamic
convolution around each drafter sublayer, and the pairwise path selector over each depth's top
candidates. Every user imports them from here: the drafter's layers (``block_conv``), the
``dflash2`` chain (``selector_chain``) and the ``dflash2tree`` builder (``selector_first_order``).

**Convolution** (a layer's ``attention_conv`` / ``mlp_conv``: ``base_kernel [2, K, H]``,
``kernel_projection [2·K·G, H]``, ``G = H / g`` groups of ``g`` channels). From a sublayer's
normed input ``x`` the projection gives ``δ [T, 2, K, G]``; the sublayer reads
``conv_0(x)`` and its output ``y`` becomes ``conv_1(y)``, where
``conv_s(u)_t = Σ_{o<K} (base[s, o] + expand(δ[t, s, o])) ⊙ u_{t−o}`` over the block's own
positions (``u_{t−o} = 0`` before slot 0) and ``expand`` repeats a group's value over its ``g``
channels. Only the block's rows are convolved; the context rows are not.

**Selector** (``candidate_selector``: ``predecessor_codebook [V, r]``, ``successor_codebook
[V, r]``, ``hidden_projection [r, H]``). Depth ``d``'s candidates ``C_d`` are the top
``selector_top_k`` tokens of its base logits ``U_d``; after token ``a`` candidate ``b`` scores
``U_d(b) + ⟨P[a] ⊙ (W_h z_d), Q[b]⟩``. The chain walks greedily from the anchor ``t0``; a tree
node's state is ``P[token]``, its children the top-``k`` of ``log_softmax`` over ``C_d``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dominotree_jax.domino_head import gather_rows
from dominotree_jax.fence import fenced_top_k
from dominotree_jax.first_order import FirstOrder
from dominotree_jax.linalg import matmul_t

_HIGHEST = jax.lax.Precision.HIGHEST


# ----------------------------------------------------------------------------- convolution

def conv_coefficients(kernel_projection, x_BTH, kernel: int):
    """``δ [B, T, 2, K, G]`` float32: both convolutions' corrections from the sublayer input."""
    d = matmul_t(x_BTH, kernel_projection)
    B, T = x_BTH.shape[:2]
    return d.astype(jnp.float32).reshape(B, T, 2, kernel, -1)


def block_conv(u_BTH, base_KH, delta_BTKG):
    """``Σ_o (base[o] + expand(δ[:, :, o])) ⊙ u_{t−o}`` within the block (zeros before slot 0),
    in float32 (the residual stream's precision)."""
    B, T, H = u_BTH.shape
    K, G = delta_BTKG.shape[2], delta_BTKG.shape[3]
    u = u_BTH.astype(jnp.float32)
    out = jnp.zeros_like(u)
    for o in range(K):
        shifted = u if o == 0 else jnp.pad(u[:, :T - o], ((0, 0), (o, 0), (0, 0)))
        tap_BTH = (base_KH[o].astype(jnp.float32)[None, None]
                   + jnp.repeat(delta_BTKG[:, :, o], H // G, axis=-1))
        out = out + tap_BTH * shifted
    return out


# ----------------------------------------------------------------------------- selector

class SelectorWeights(NamedTuple):
    """The selector's weights: ``pred [V, r]``, ``succ [V, r]``, ``proj [r, H]``; ``top_k``
    is static (a Python int)."""
    pred: jax.Array
    succ: jax.Array
    proj: jax.Array


def selector_candidates(w: SelectorWeights, z_sJH, base_sJV, top_k: int, vocab_top_k=None):
    """``(U [.., J, k], C [.., J, k], S [.., J, k, r])``: each depth's candidates, their base
    logits and the rows ``Q[C] ⊙ (W_h z)`` a predecessor's ``P`` row is dotted with."""
    top = vocab_top_k or fenced_top_k
    U, C = top(base_sJV.astype(jnp.float32), top_k)
    gate_sJr = matmul_t(z_sJH.astype(jnp.float32), w.proj.astype(jnp.float32), _HIGHEST)
    S = gather_rows(w.succ, C).astype(jnp.float32) * gate_sJr[..., None, :]
    return U, C.astype(jnp.int32), S


def selector_scores(U_sk, S_skr, p_sr):
    """``U + S · P[a]``: the candidates' scores after a predecessor whose row is ``p``."""
    return U_sk + jnp.einsum("...kr,...r->...k", S_skr, p_sr.astype(jnp.float32),
                             precision=_HIGHEST)


def selector_chain(w: SelectorWeights, z_BJH, base_BJV, t0_B, top_k: int):
    """The greedy walk → ``(tokens [B, J] int32, logprobs [B, J] float32)``: depth ``d`` takes
    the best-scoring candidate after the token before it (``t0`` at depth 0); log-probs under
    ``log_softmax`` of the scores over the candidates."""
    U, C, S = selector_candidates(w, z_BJH, base_BJV, top_k)

    def step(prev_B, xs):
        U_Bk, C_Bk, S_Bkr = xs
        lp_Bk = jax.nn.log_softmax(
            selector_scores(U_Bk, S_Bkr, gather_rows(w.pred, prev_B)), axis=-1)
        i_B = jnp.argmax(lp_Bk, axis=-1)
        tok_B = jnp.take_along_axis(C_Bk, i_B[:, None], 1)[:, 0]
        return tok_B, (tok_B, jnp.max(lp_Bk, axis=-1))

    xs = (jnp.swapaxes(U, 0, 1), jnp.swapaxes(C, 0, 1), jnp.swapaxes(S, 0, 1))
    _, (tok_JB, lp_JB) = jax.lax.scan(step, t0_B.astype(jnp.int32), xs)
    return tok_JB.T, lp_JB.T


def selector_first_order(w: SelectorWeights, z_JH, base_JV, root_token, *, top_k: int,
                         vocab_top_k=None):
    """The path selector as the tree builder's first-order head (``first_order.FirstOrder``):
    a node's state is its token's ``P`` row; depth ``d``'s children are scored over its
    candidates (``selector_candidates``)."""
    U, C, S = selector_candidates(w, z_JH, base_JV, top_k, vocab_top_k)

    def row_of(token):
        return gather_rows(w.pred, jnp.asarray(token, jnp.int32)).astype(jnp.float32)

    return FirstOrder(lambda d, p_r: selector_scores(U[d], S[d], p_r), row_of, C,
                      row_of(root_token))
