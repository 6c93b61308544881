"""The Domino head (docs/algorithm.md §3): a bias-free GRU over the drafted path and the causal
correction of the DFlash logits. Every user of the head imports it from here: the Domino chain
(``domino_chain``), the tree builder (split form, ``expand_split``), the training loss
(``gru_path_states``, ``corrected_logits``) and the jnp twin of the Pallas top-M kernel.

Weights travel as one ``DominoHeadWeights`` in the checkpoint's (PyTorch) layouts:
``embed [V, H]`` (the target's token embedding: the GRU reads embedded tokens),
``gru_w_ih [3G, H]``, ``gru_w_hh [3G, G]`` (gate order r, z, n), ``proj_w1 [E, H+G]``,
``proj_w2 [V, E]``. All functions broadcast over leading dimensions (suffix ``s``).

Two equal forms of the correction:
- concatenated: ``c = base + W2 · SiLU(W1 · [z ; s])`` (chain, training: one product);
- split: ``W1 · [z ; s] = a + W1s · s`` with ``a = W1[:, :H] · z`` once per depth and
  ``W1s = W1[:, H:]``, so each tree pop pays only the ``E x G`` and ``M x E`` products. The
  split form is evaluated with ``Precision.HIGHEST`` (no TF32 on GPU), the same as the kernel.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dominotree_jax.fence import fenced_top_k
from dominotree_jax.linalg import matmul_t
from pallas_kernels.topm_expand import expand_pallas, resolve_use_pallas

_HIGHEST = jax.lax.Precision.HIGHEST


class DominoHeadWeights(NamedTuple):
    """The head's weights (a pytree); see the module docstring for layouts."""
    embed: jax.Array     # [V, H]
    gru_w_ih: jax.Array  # [3G, H]
    gru_w_hh: jax.Array  # [3G, G]
    proj_w1: jax.Array   # [E, H+G]
    proj_w2: jax.Array   # [D, E] over the draft vocabulary (or [C, E]: gathered rows)
    # [D] int32: the target id of each draft-vocabulary token (None: D is the vocabulary)
    draft_ids: jax.Array | None = None


# ----------------------------------------------------------------------------- GRU

def gru_step(x_sH: jax.Array, s_sG: jax.Array, w_ih_3GH: jax.Array, w_hh_3GG: jax.Array):
    """One PyTorch-semantics GRU step without biases; returns the new state ``[..., G]``."""
    gi_r, gi_z, gi_n = jnp.split(matmul_t(x_sH, w_ih_3GH), 3, axis=-1)
    gh_r, gh_z, gh_n = jnp.split(matmul_t(s_sG, w_hh_3GG), 3, axis=-1)
    r = jax.nn.sigmoid(gi_r + gh_r)
    u = jax.nn.sigmoid(gi_z + gh_z)
    n = jnp.tanh(gi_n + r * gh_n)
    return (1.0 - u) * n + u * s_sG


def gather_rows(table_VH: jax.Array, token_s: jax.Array) -> jax.Array:
    """``table[token]`` → ``[..., H]`` in the table's dtype (``jnp.take`` along axis 0).

    A 16-bit table is gathered through its bit pattern (``uint16``): XLA:CPU has no 16-bit
    float gather, and to run one it converts the whole table to float32 first -- every call,
    inside the tree builder's pop loop (17 converts of SmolLM2's 28M-entry embedding per round:
    27 of a bf16 build's 31 ms on an AMX Xeon, docs/precision.md). Integers gather natively, and
    the rows are the same bits."""
    if jnp.dtype(table_VH.dtype).itemsize != 2:
        return jnp.take(table_VH, token_s, axis=0)
    bits_VH = jax.lax.bitcast_convert_type(table_VH, jnp.uint16)
    return jax.lax.bitcast_convert_type(jnp.take(bits_VH, token_s, axis=0), table_VH.dtype)


def gru_advance(head: DominoHeadWeights, token_s: jax.Array, s_sG: jax.Array, dtype=None):
    """The state after appending draft-vocabulary ``token`` to the path (its target id's
    embedding: ``GRU(embed[draft_ids[token]], s)``)."""
    ids_s = token_s if head.draft_ids is None else jnp.take(head.draft_ids, token_s, axis=0)
    return gru_advance_ids(head, ids_s, s_sG, dtype)


def gru_advance_ids(head: DominoHeadWeights, ids_s: jax.Array, s_sG: jax.Array, dtype=None):
    """The state after appending the token of target id ``ids``: ``GRU(embed[ids], s)``."""
    dtype = s_sG.dtype if dtype is None else dtype
    x_sH = gather_rows(head.embed, ids_s).astype(dtype)
    # products in the weights' dtype with float32 accumulation (precision.py); state in ``dtype``
    return gru_step(x_sH, s_sG.astype(dtype), head.gru_w_ih, head.gru_w_hh).astype(dtype)


def gru_root_state(head: DominoHeadWeights, t0_s: jax.Array, dtype=None):
    """The root's state ``GRU(embed[t0], 0)`` → ``[..., G]`` (``t0``: a target id)."""
    dtype = head.gru_w_hh.dtype if dtype is None else dtype
    G = head.gru_w_hh.shape[-1]
    return gru_advance_ids(head, t0_s, jnp.zeros(jnp.shape(t0_s) + (G,), dtype))


def gru_path_states(head: DominoHeadWeights, tokens_sJ: jax.Array, dtype=None):
    """States after each prefix of a known path of target ids (teacher forcing) →
    ``[..., J, G]``.

    ``states[..., d]`` = GRU over ``tokens[..., 0..d]`` from a zero state, i.e. the state that
    conditions depth ``d``'s correction when ``tokens[..., 0]`` is ``t0``.
    """
    dtype = head.gru_w_hh.dtype if dtype is None else dtype
    G = head.gru_w_hh.shape[-1]
    s0 = jnp.zeros(tokens_sJ.shape[:-1] + (G,), dtype)

    def step(s_sG, tok_s):
        s_sG = gru_advance_ids(head, tok_s, s_sG, dtype)
        return s_sG, s_sG

    _, states_JsG = jax.lax.scan(step, s0, jnp.moveaxis(tokens_sJ, -1, 0))
    return jnp.moveaxis(states_JsG, 0, -2)


# ----------------------------------------------------------------------------- correction

def corrected_logits(base_sV: jax.Array, z_sH: jax.Array, s_sG: jax.Array,
                     w1_EHG: jax.Array, w2_VE: jax.Array) -> jax.Array:
    """``base + W2 · SiLU(W1 · [z ; s])`` over the rows of ``w2`` (concatenated form)."""
    zs = jnp.concatenate([z_sH, s_sG.astype(z_sH.dtype)], axis=-1)
    return base_sV + matmul_t(jax.nn.silu(matmul_t(zs, w1_EHG)), w2_VE)


def split_projection(z_sH: jax.Array, w1_EHG: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(a = W1[:, :H] · z  [..., E], W1s = W1[:, H:]  [E, G])`` in float32."""
    H = z_sH.shape[-1]
    w1 = w1_EHG.astype(jnp.float32)
    a_sE = matmul_t(z_sH.astype(jnp.float32), w1[:, :H], _HIGHEST)
    return a_sE, w1[:, H:]


def expand_split_jnp(a_E, s_G, w1s_EG, base_M, w2_ME, k: int):
    """Top-k children of one node from split operands → ``(idx [k] int32, lp [k] float32)``.

    ``lp = log_softmax(base + W2 · SiLU(a + W1s · s))`` over the ``M`` rows; ``idx`` indexes
    those rows (equal values: lower index first). The jnp twin of the Pallas kernel.
    """
    h_E = jax.nn.silu(a_E + matmul_t(s_G, w1s_EG, _HIGHEST))
    c_M = base_M + matmul_t(h_E, w2_ME, _HIGHEST)
    lp_k, idx_k = fenced_top_k(jax.nn.log_softmax(c_M), k)
    return idx_k.astype(jnp.int32), lp_k


def expand_split(a_E, s_G, w1s_EG, base_M, w2_ME, k: int, *, use_pallas="auto",
                 prepadded: bool = False):
    """Split-form expansion on the jnp twin or the Pallas kernel (``use_pallas``: ``"auto"``
    = kernel on GPU, ``True``, ``False``, ``"interpret"``). ``prepadded``: the operands came
    from ``pallas_kernels.topm_expand.pad_operands`` (kernel path only)."""
    use_kernel, interpret = resolve_use_pallas(use_pallas)
    if not use_kernel:
        if prepadded:
            raise ValueError("prepadded operands are only for the Pallas path")
        return expand_split_jnp(a_E, s_G, w1s_EG, base_M, w2_ME, k)
    return expand_pallas(a_E, s_G, w1s_EG, base_M, w2_ME, k, interpret=interpret,
                         prepadded=prepadded)


def topm_expand(z_H, s_G, w1_EHG, base_M, w2_ME, k: int, *, use_pallas="auto"):
    """Top-M expansion of one node at depth ``d`` given ``z_d``, its GRU state, the depth's
    candidate logits ``base_M = base_d[C_d]`` and rows ``w2_ME = W2[C_d]`` →
    ``(idx [k] into C_d, lp [k])``. ``use_pallas=False`` is the jnp twin."""
    a_E, w1s_EG = split_projection(z_H, w1_EHG)
    return expand_split(a_E, s_G.astype(jnp.float32), w1s_EG, base_M.astype(jnp.float32),
                        w2_ME.astype(jnp.float32), k, use_pallas=use_pallas)


# ----------------------------------------------------------------------------- chains

def greedy(logits_sV: jax.Array):
    """argmax token and its log-softmax value (float32)."""
    logits = logits_sV.astype(jnp.float32)
    tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    lp = jnp.max(logits, axis=-1) - jax.nn.logsumexp(logits, axis=-1)
    return tok, lp


def dflash_chain(base_BJV):
    """Greedy DFlash chain: argmax of ``base`` per depth → ``(tokens, logprobs)`` ``[B, J]``."""
    return greedy(base_BJV)


def domino_chain(head: DominoHeadWeights, z_BJH, base_BJV, t0_B, prefix_len: int):
    """Greedy Domino chain → ``(tokens [B, J] int32, logprobs [B, J] float32)``.

    Depths ``< prefix_len`` use ``base``; later depths the corrected logits with the GRU state
    after ``t0`` and the chain's earlier tokens. Log-probs are under the distribution used at
    that depth. The GRU state runs in the dtype of ``z`` (float32 under the precision policy),
    the products in the weights' dtype with float32 accumulation.
    """
    depths = z_BJH.shape[1]
    dtype = z_BJH.dtype

    def step(s_BG, xs):
        d, z_BH, base_BV = xs
        corrected = corrected_logits(base_BV, z_BH, s_BG, head.proj_w1,
                                     head.proj_w2).astype(jnp.float32)
        tok_B, lp_B = greedy(jnp.where(d < prefix_len, base_BV, corrected))
        return gru_advance(head, tok_B, s_BG, dtype), (tok_B, lp_B)

    xs = (jnp.arange(depths), jnp.swapaxes(z_BJH, 0, 1), jnp.swapaxes(base_BJV, 0, 1))
    _, (tok_JB, lp_JB) = jax.lax.scan(step, gru_root_state(head, t0_B, dtype), xs)
    return tok_JB.T, lp_JB.T
