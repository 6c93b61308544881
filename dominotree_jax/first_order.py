"""First-order conditional heads: a depth's distribution depends on the token drafted before it
and on nothing earlier. DSpark's Markov head (``markov_head.markov_first_order``) and DFlash2's
path selector (``selector_head.selector_first_order``) are both of this form, and the tree
builder grows ``dsparktree`` and ``dflash2tree`` from it through ``first_order_parts``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from dominotree_jax.fence import fenced_top_k


class FirstOrder(NamedTuple):
    """``scores(depth, row_r) -> [M]`` float32: a depth's logits over its candidates after a
    token whose state row is ``row_r``; ``row_of(token) -> [r]`` float32: that row;
    ``candidates_JM``: the token of each score column per depth (``None``: the column is the
    token, the whole vocabulary); ``root_r``: the row of the block's anchor ``t0`` (a target id,
    where tree tokens may be draft-vocabulary columns)."""
    scores: Callable
    row_of: Callable
    candidates_JM: jax.Array | None
    root_r: jax.Array


def first_order_parts(head: FirstOrder, *, k: int, vocab_top_k=None):
    """The tree builder's ``(expand(depth, row) -> (ids [k], log-probs [k]), advance(token,
    row) -> row, root row)``: a node's children are the top ``k`` of ``log_softmax`` of its
    depth's scores after its own token (the root's: ``t0``, row ``root_r``). ``vocab_top_k``:
    the builder's top-k over a whole vocabulary (used when ``candidates_JM`` is None)."""
    full_top_k = vocab_top_k or fenced_top_k

    def expand(depth, row_r):
        lp = jax.nn.log_softmax(head.scores(depth, row_r))
        if head.candidates_JM is None:
            lp_k, idx_k = full_top_k(lp, k)
            return idx_k.astype(jnp.int32), lp_k
        lp_k, idx_k = fenced_top_k(lp, k)
        return head.candidates_JM[depth][idx_k].astype(jnp.int32), lp_k

    def advance(token, row_r):   # first order: the state is the token's row alone
        del row_r
        return head.row_of(token)

    return expand, advance, head.root_r
