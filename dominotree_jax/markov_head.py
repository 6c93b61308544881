"""DSpark's heads (docs/algorithm.md §3b): the low-rank Markov correction of the DFlash logits by
the token drafted before, and the confidence head's per-depth survival logit. Every user imports
them from here: the ``dspark`` chain (``markov_chain``), the ``dsparktree`` builder
(``markov_tree_parts``) and the drafter (``Drafter.markov_weights``, ``Drafter.confidence``).

Weights travel as one ``MarkovHeadWeights`` in DeepSpec's layouts: ``w1 [V, r]`` (a table of
its own, indexed by the previous token's target id) and ``w2 [|D|, r]`` (the ``r -> |D|`` output
projection, stored ``[out, in]``, over the drafter's draft vocabulary ``D``: the whole
vocabulary, or the columns ``draft_ids`` of a drafter with one; drafted tokens are draft ids,
mapped to target ids before their ``w1`` row is read).

At depth ``d`` (slot ``d`` of the block predicts the token ``d + 1`` after the anchor) with
previous token ``p`` (the anchor ``t0`` at depth 0, else the token drafted at depth ``d - 1``)
the logits are ``base_d + W2 · W1[p]``: a bias on the logits, no activation, no normalisation.
The confidence head reads ``[z_d ; W1[p]]`` (or ``z_d`` alone) and gives one logit per depth,
``sigmoid`` = the estimated acceptance of depth ``d`` given the depths before it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dominotree_jax.domino_head import gather_rows, greedy
from dominotree_jax.fence import fenced
from dominotree_jax.linalg import matmul_t

_HIGHEST = jax.lax.Precision.HIGHEST


class MarkovHeadWeights(NamedTuple):
    """The Markov head's weights (a pytree): ``w1 [V, r]``, ``w2 [|D|, r]`` (``r``: the rank)."""
    w1: jax.Array
    w2: jax.Array
    # [|D|] int32: the target id of each draft-vocabulary column (None: the vocabulary)
    draft_ids: jax.Array | None = None

    def target_ids(self, draft_s: jax.Array) -> jax.Array:
        """The target ids of draft-vocabulary tokens ``draft_s``."""
        return draft_s if self.draft_ids is None else jnp.take(self.draft_ids, draft_s, axis=0)


class ConfidenceWeights(NamedTuple):
    """The confidence head's weights: ``proj [1, H (+ r)]``, ``bias [1]``."""
    proj: jax.Array
    bias: jax.Array


def markov_rows(w: MarkovHeadWeights, prev_s: jax.Array) -> jax.Array:
    """``W1[prev]`` in float32, ``[..., r]``: the Markov state after token ``prev``."""
    return gather_rows(w.w1, prev_s.astype(jnp.int32)).astype(jnp.float32)


def markov_bias(w: MarkovHeadWeights, e_sr: jax.Array) -> jax.Array:
    """``W2 · e`` in float32, ``[..., V]``: the correction a Markov state adds to the logits
    (operands in ``W2``'s dtype, float32 accumulation: ``linalg.matmul_t``)."""
    return matmul_t(e_sr, w.w2, _HIGHEST)


def corrected_logits(w: MarkovHeadWeights, base_sV: jax.Array, prev_s: jax.Array) -> jax.Array:
    """``base + W2 · W1[prev]`` in float32 (training and the reference's form)."""
    return base_sV.astype(jnp.float32) + markov_bias(w, markov_rows(w, prev_s))


def markov_chain(w: MarkovHeadWeights, base_BJV, t0_B):
    """The greedy DSpark chain → ``(tokens [B, J] int32, logprobs [B, J] float32)``: depth ``d``
    takes the argmax of ``base_d + W2 · W1[previous token]``, the previous token being ``t0``
    (a target id) at depth 0; log-probs under that corrected distribution. Tokens are columns
    of the draft vocabulary (``Drafter.to_target`` maps them)."""

    def step(prev_B, base_BV):   # prev: a target id; the draft: a draft-vocabulary column
        tok_B, lp_B = greedy(corrected_logits(w, base_BV, prev_B))
        return w.target_ids(tok_B), (tok_B, lp_B)

    _, (tok_JB, lp_JB) = jax.lax.scan(step, t0_B.astype(jnp.int32), jnp.swapaxes(base_BJV, 0, 1))
    return tok_JB.T, lp_JB.T


def markov_tree_parts(w: MarkovHeadWeights, base_JV, root_token, *, k: int, top_m: int,
                      vocab_top_k=None):
    """What the tree builder needs to condition a node's children on its own token:
    ``(expand(depth, e_r) -> (ids [k], log-probs [k]), advance(token, e_r) -> e_r, root e_r)``.
    ``top_m > 0``: the children of depth ``d`` are ranked among the top-M tokens of ``base_d``
    (their ``W2`` rows gathered once per round), log-probs normalised over them; ``0``: over
    the whole vocabulary. ``vocab_top_k(x, n) -> (values, indices)``: the builder's top-k over a
    vocabulary (fenced; default ``lax.top_k``)."""
    f32 = jnp.float32
    top_k = vocab_top_k or (lambda x, n: fenced(*jax.lax.top_k(x, n)))
    base_JV = base_JV.astype(f32)

    if top_m == 0:
        w2_Vr = w.w2.astype(f32)

        def expand(depth, e_r):
            c_V = base_JV[depth] + matmul_t(e_r, w2_Vr, _HIGHEST)
            lp_k, idx_k = top_k(jax.nn.log_softmax(c_V), k)
            return idx_k.astype(jnp.int32), lp_k
    else:
        baseC_JM, C_JM = top_k(base_JV, top_m)                # candidates, once per round
        w2C_JMr = gather_rows(w.w2, C_JM).astype(f32)

        def expand(depth, e_r):
            c_M = baseC_JM[depth] + matmul_t(e_r, w2C_JMr[depth], _HIGHEST)
            lp_k, idx_k = fenced(*jax.lax.top_k(jax.nn.log_softmax(c_M), k))
            return C_JM[depth][idx_k].astype(jnp.int32), lp_k

    def advance(token, e_r):   # a first-order head: the state is the token's row alone
        del e_r
        return markov_rows(w, w.target_ids(token))

    return expand, advance, markov_rows(w, jnp.asarray(root_token, jnp.int32))


def confidence_logits(cw: ConfidenceWeights, z_sH: jax.Array, e_sr: jax.Array | None):
    """``[...]`` float32: the confidence head's logit per depth from the final-normed state
    ``z`` and, when the head reads it (``e`` not None), the previous token's Markov row."""
    x = z_sH.astype(jnp.float32) if e_sr is None else jnp.concatenate(
        [z_sH.astype(jnp.float32), e_sr.astype(jnp.float32)], axis=-1)
    return (matmul_t(x, cw.proj.astype(jnp.float32), _HIGHEST)[..., 0]
            + cw.bias.astype(jnp.float32)[0])
