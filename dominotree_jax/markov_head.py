"""DSpark's heads (docs/algorithm.md §3b): the low-rank Markov correction of the DFlash logits by
the token drafted before, and the confidence head's per-depth survival logit. Every user imports
them from here: the ``dspark`` chain (``markov_chain``, its scores ``blended_logprobs``), the
``dsparktree`` builder (``markov_first_order``) and the drafter (``Drafter.markov_weights``,
``Drafter.confidence``).

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
from dominotree_jax.fence import fenced_top_k
from dominotree_jax.first_order import FirstOrder
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


def markov_first_order(w: MarkovHeadWeights, base_JV, root_token, *, top_m: int,
                       vocab_top_k=None):
    """The Markov head as the tree builder's first-order head (``first_order.FirstOrder``):
    a node's state is ``W1[token]``; depth ``d``'s children are scored by ``base_d + W2 · e``
    over the top-M tokens of ``base_d`` (``top_m > 0``; their ``W2`` rows gathered once per
    round) or over the whole vocabulary (``0``). ``vocab_top_k(x, n) -> (values, indices)``:
    the builder's top-k over a vocabulary (default ``lax.top_k``)."""
    f32 = jnp.float32
    base_JV = base_JV.astype(f32)

    def row_of(token):   # a tree token: a draft-vocabulary column
        return markov_rows(w, w.target_ids(token))

    root_r = markov_rows(w, jnp.asarray(root_token, jnp.int32))   # t0: a target id

    if top_m == 0:
        w2_Vr = w.w2.astype(f32)
        return FirstOrder(lambda d, e_r: base_JV[d] + matmul_t(e_r, w2_Vr, _HIGHEST), row_of,
                          None, root_r)
    top_k = vocab_top_k or fenced_top_k
    baseC_JM, C_JM = top_k(base_JV, top_m)                 # candidates, once per round
    w2C_JMr = gather_rows(w.w2, C_JM).astype(f32)
    return FirstOrder(lambda d, e_r: baseC_JM[d] + matmul_t(e_r, w2C_JMr[d], _HIGHEST), row_of,
                      C_JM.astype(jnp.int32), root_r)


def blended_logprobs(logprobs_BJ, confidence_BJ, share: float):
    """Per-node log-scores of a chain whose cumulative score is ``log(share · S_d + (1 − share)
    · Q_d)``: ``S_d`` the confidence head's survival to depth ``d`` (the product of its sigmoids),
    ``Q_d`` the chain's path probability (``exp`` of the cumulative ``logprobs``); both fall
    with depth, so the scores do."""
    log_s_BJ = jnp.cumsum(jax.nn.log_sigmoid(confidence_BJ.astype(jnp.float32)), axis=1)
    log_q_BJ = jnp.cumsum(logprobs_BJ.astype(jnp.float32), axis=1)
    if share >= 1.0:
        cum_BJ = log_s_BJ
    else:
        cum_BJ = jnp.logaddexp(jnp.log(share) + log_s_BJ, jnp.log1p(-share) + log_q_BJ)
    return jnp.diff(cum_BJ, axis=1, prepend=0.0)


def confidence_logits(cw: ConfidenceWeights, z_sH: jax.Array, e_sr: jax.Array | None):
    """``[...]`` float32: the confidence head's logit per depth from the final-normed state
    ``z`` and, when the head reads it (``e`` not None), the previous token's Markov row."""
    x = z_sH.astype(jnp.float32) if e_sr is None else jnp.concatenate(
        [z_sH.astype(jnp.float32), e_sr.astype(jnp.float32)], axis=-1)
    return (matmul_t(x, cw.proj.astype(jnp.float32), _HIGHEST)[..., 0]
            + cw.bias.astype(jnp.float32)[0])
