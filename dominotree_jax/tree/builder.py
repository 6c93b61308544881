"""Best-first draft-tree builder with fixed shapes (docs/algorithm.md §4), jittable and
vmap-able.

``build_tree_from_head`` takes one round's drafter outputs (``base_logits [J, V]``, ``hidden
[J, H]`` for the ``J`` draft depths), the root token ``t0`` and the Domino head's weights
(``DominoHeadWeights``, or None for ``ddtree``), and returns a ``Tree`` of ``budget`` (N) nodes in
pop order. ``build_tree`` is the same with the weights as separate arguments (the signature
other implementations are compared through).

Frontier: ``Z = k + N*k`` slots in push order. Slots ``0..k-1`` hold the root's children; pop
``i`` writes its ``k`` children into slots ``k + i*k .. k + i*k + k-1`` (marked invalid when the
popped node is at the last depth ``J-1``). Each pop takes ``argmax`` over the valid slots'
cumulative scores; ``argmax`` returns the first maximal index, i.e. the earliest push, which is
the heap tie rule. Children within one expansion come from ``lax.top_k`` (equal values: lower
index first, hence lower token id first for marginal children and lower candidate rank for
conditional ones). When the frontier runs empty before N pops the remaining nodes are invalid:
token 0, parent -1, depth -1, score -inf.

Children distributions:
- ``"ddtree"`` (marginal): ``top_k(log_softmax(base_d))``, computed once per round for all depths.
- ``"condstatic"`` (static-corrected): one corrected distribution per depth, shared by every
  node of that depth: the Domino correction applied once along the greedy path (depth ``d``
  uses the GRU state after ``t0`` and the top child of each depth ``< d``, i.e. the Domino
  chain's path), computed once per round by a scan over depths with the same candidate /
  ``expand_split`` machinery as ``dominotree``; the pop loop is then the marginal one.
- ``"dominotree"`` (conditional): depths ``< prefix_len`` as marginal; deeper ones from the node's
  GRU state. GRU states are computed lazily: the frontier stores only the parent's node index,
  and a popped node's state ``GRU(embed[token], parent_state)`` is computed at pop time (one
  GRU step per pop) and kept in ``states [N, G]``. With ``top_m > 0`` the candidates ``C_d``
  (top-M of ``base_d``), ``base_d[C_d]`` and ``W2[C_d]`` are gathered once per round and each pop
  runs ``domino_head.expand_split`` (the Pallas kernel on GPU). ``top_m = 0`` uses the full
  vocabulary.
- ``"dsparktree"`` (conditional on the parent's token): every depth's children from
  ``base_d + W2 · W1[token]`` of the node they hang from (the root: ``t0``), DSpark's Markov head
  (``markov_head.markov_first_order``; ``head`` is its ``MarkovHeadWeights``); the state a pop
  keeps is ``W1[token]``; the same top-M candidates, in jnp (no kernel); ``prefix_len`` unused.
- ``"dflash2tree"`` (conditional on the parent's token): DFlash2's path selector
  (``selector_head.selector_first_order``; ``head`` its ``SelectorWeights``, ``top_m`` its
  candidates per depth): a node's state is ``P[token]``, its children the top ``k`` of the
  pair scores over the depth's candidates.

Everything is computed in float32 with ``Precision.HIGHEST`` matmuls (no TF32 on GPU), whatever
the input dtype; only the embedding / W2 rows that are needed are gathered and cast.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from dominotree_jax.domino_head import (DominoHeadWeights, expand_split, gather_rows,
                                        gru_advance, gru_root_state, split_projection)
from dominotree_jax.fence import fenced
from dominotree_jax.first_order import first_order_parts
from dominotree_jax.markov_head import MarkovHeadWeights, markov_first_order
from dominotree_jax.selector_head import SelectorWeights, selector_first_order
from dominotree_jax.tree.topk import vocab_top_k
from pallas_kernels.topm_expand import pad_operands, resolve_use_pallas

TREE_METHODS = ("ddtree", "condstatic", "dominotree", "dsparktree", "dflash2tree")
# Tree methods that read the Domino head.
CORRECTED_TREE_METHODS = ("condstatic", "dominotree")
# Tree methods that read DSpark's Markov head; DFlash2's path selector.
MARKOV_TREE_METHODS = ("dsparktree",)
SELECTOR_TREE_METHODS = ("dflash2tree",)


class Tree(NamedTuple):
    """A draft tree in pop order (a pytree: passes through jit / vmap).

    tokens [N] int32, parents [N] int32 (-1 = child of the root), depths [N] int32 (0 = first
    token after t0), scores [N] float32 (cumulative log-prob), num_nodes int32 scalar. Invalid
    tail slots: token 0, parent -1, depth -1, score -inf. Leading batch dims are allowed.
    """

    tokens: Any
    parents: Any
    depths: Any
    scores: Any
    num_nodes: Any

    @property
    def valid(self):
        """bool [N]: the slot holds a real node."""
        return self.depths >= 0


def _top_k(x_sV: jax.Array, k: int):
    """``lax.top_k`` (two stages on a GPU: ``tree/topk.py``, no full-vocabulary sort) behind an
    optimization barrier per output (``dominotree_jax.fence``: without them XLA:CPU may fuse
    consumers of the sliced result into the sort that ``top_k`` is decomposed into, which then
    runs as a full sort of the vocabulary, ~100x slower)."""
    return fenced(*vocab_top_k(x_sV, k))


def check_settings(J: int, V: int, *, method: str, budget: int, node_topk: int, top_m: int,
                   prefix_len: int) -> None:
    """Validate the static settings against the shapes (shared with the NumPy reference)."""
    if method not in TREE_METHODS:
        raise ValueError(f"method must be one of {TREE_METHODS}, got {method!r}")
    if J < 1 or budget < 1 or node_topk < 1:
        raise ValueError("the draft depth, budget and node_topk must be >= 1")
    if node_topk > V:
        raise ValueError(f"node_topk={node_topk} exceeds the vocabulary ({V})")
    if top_m < 0 or top_m > V:
        raise ValueError(f"top_m must be in [0, V={V}], got {top_m}")
    if method in SELECTOR_TREE_METHODS and not 0 < node_topk <= top_m:
        raise ValueError(f"{method}: node_topk={node_topk} must lie in [1, the selector's "
                         f"{top_m} candidates]")
    if method in CORRECTED_TREE_METHODS + MARKOV_TREE_METHODS and 0 < top_m < node_topk:
        raise ValueError(f"top_m={top_m} must be >= node_topk={node_topk} (or 0 = full vocab)")
    if prefix_len < 0:
        raise ValueError("prefix_len must be >= 0")


def _conditional_expander(base_JV, hidden_JH, w1_EHG, w2_VE, *, k, top_m, use_pallas):
    """Return ``expand(depth, state_G) -> (token ids [k], log-probs [k])`` for one round."""
    use_kernel, interpret = resolve_use_pallas(use_pallas)   # "auto": the jnp twin
    kernel_mode = ("interpret" if interpret else True) if use_kernel else False
    a_JE, w1s_EG = split_projection(hidden_JH, w1_EHG)

    if top_m == 0:  # full vocabulary: one [V, E] product per pop, the pop's whole cost
        w2 = w2_VE.astype(jnp.float32)

        def expand_full(depth, s_G):
            return expand_split(a_JE[depth], s_G, w1s_EG, base_JV[depth], w2, k, use_pallas=False)

        return expand_full

    baseC_JM, C_JM = _top_k(base_JV, top_m)                   # candidates, once per round
    w2C_JME = gather_rows(w2_VE, C_JM).astype(jnp.float32)
    if use_kernel:                                            # pad once per round, not per pop
        a_JE, w1s_EG, baseC_JM, w2C_JME = pad_operands(a_JE, w1s_EG, baseC_JM, w2C_JME)

    def expand_topm(depth, s_G):
        idx_k, lp_k = expand_split(a_JE[depth], s_G, w1s_EG, baseC_JM[depth], w2C_JME[depth], k,
                                   use_pallas=kernel_mode, prepadded=use_kernel)
        return C_JM[depth][idx_k], lp_k

    return expand_topm


def _static_corrected_children(marg_ids_Jk, marg_lp_Jk, expand, advance, root_state,
                               prefix_len: int):
    """``(ids [J, k], log-probs [J, k])``: depth ``d``'s children are the corrected top-k
    under the state after ``t0`` and the first child of every depth ``< d`` (depths ``<
    prefix_len``: the marginal children); a scan over depths, once per round."""
    J = marg_ids_Jk.shape[0]

    def step(s_G, d):
        c_ids, c_lp = expand(d, s_G)
        use = d >= prefix_len
        ids_k = jnp.where(use, c_ids.astype(jnp.int32), marg_ids_Jk[d])
        lp_k = jnp.where(use, c_lp, marg_lp_Jk[d])
        return advance(ids_k[0], s_G), (ids_k, lp_k)

    _, (ids_Jk, lp_Jk) = jax.lax.scan(step, root_state, jnp.arange(J))
    return ids_Jk, lp_Jk


def _build_tree(base_logits, hidden, root_token, head: DominoHeadWeights | None, *,
                method, budget, node_topk, top_m, prefix_len, use_pallas):
    J, V = base_logits.shape
    check_settings(J, V, method=method, budget=budget, node_topk=node_topk, top_m=top_m,
                   prefix_len=prefix_len)
    N, k = budget, node_topk
    Z = k + N * k   # frontier slots, in push order
    f32, i32 = jnp.float32, jnp.int32
    base_JV = base_logits.astype(f32)

    marg_lp_Jk, marg_ids_Jk = _top_k(jax.nn.log_softmax(base_JV, axis=-1), k)
    corrected = method in CORRECTED_TREE_METHODS and prefix_len < J
    conditional = corrected and method == "dominotree"
    markov = method in MARKOV_TREE_METHODS
    selector = method in SELECTOR_TREE_METHODS

    if corrected:
        if head is None or any(w is None for w in head[:5]):   # (draft_ids may be None)
            raise ValueError(f"{method} needs embed, gru_w_ih, gru_w_hh, proj_w1 and proj_w2")
        head = head._replace(gru_w_ih=head.gru_w_ih.astype(f32),
                             gru_w_hh=head.gru_w_hh.astype(f32))
        G = head.gru_w_hh.shape[-1]
        expand = _conditional_expander(base_JV, hidden.astype(f32), head.proj_w1, head.proj_w2,
                                       k=k, top_m=top_m, use_pallas=use_pallas)

        def advance(token, s_G):
            return gru_advance(head, token, s_G, f32)

        root_state = gru_root_state(head, jnp.asarray(root_token, i32), f32)
    if corrected and not conditional:   # condstatic: per-depth children along the greedy path
        marg_ids_Jk, marg_lp_Jk = _static_corrected_children(
            marg_ids_Jk, marg_lp_Jk, expand, advance, root_state, prefix_len)
    if selector or markov:   # first-order heads: a node's children after its own token
        if selector and not isinstance(head, SelectorWeights):
            raise ValueError(f"{method} needs the path selector's weights (SelectorWeights)")
        if markov and not isinstance(head, MarkovHeadWeights):
            raise ValueError(f"{method} needs the Markov head's weights (MarkovHeadWeights)")
        first_order = (selector_first_order(head, hidden, base_JV, root_token, top_k=top_m,
                                            vocab_top_k=_top_k) if selector else
                       markov_first_order(head, base_JV, root_token, top_m=top_m,
                                          vocab_top_k=_top_k))
        expand, advance, root_state = first_order_parts(first_order, k=k, vocab_top_k=_top_k)
        conditional, prefix_len, G = True, 0, root_state.shape[-1]
    elif not conditional:
        G = 1
        root_state = jnp.zeros((G,), f32)

    def children(depth, s_G):
        ids_k, lp_k = marg_ids_Jk[depth], marg_lp_Jk[depth]
        if conditional:
            c_ids, c_lp = expand(depth, s_G)
            use = depth >= prefix_len
            ids_k, lp_k = jnp.where(use, c_ids, ids_k), jnp.where(use, c_lp, lp_k)
        return ids_k.astype(i32), lp_k

    ids0, lp0 = children(0, root_state)
    slot_Z = jnp.arange(Z)
    frontier = dict(
        tok=jnp.zeros((Z,), i32).at[:k].set(ids0),
        par=jnp.full((Z,), -1, i32),
        dep=jnp.where(slot_Z < k, 0, -1).astype(i32),
        score=jnp.full((Z,), -jnp.inf, f32).at[:k].set(lp0),
        valid=slot_Z < k,
    )
    nodes = dict(
        tok=jnp.zeros((N,), i32), par=jnp.full((N,), -1, i32), dep=jnp.full((N,), -1, i32),
        score=jnp.full((N,), -jnp.inf, f32),
    )
    states_NG = jnp.zeros((N, G), f32)

    def pop(i, carry, expand_children=True):
        fr, nd, states_NG = carry
        f = jnp.argmax(jnp.where(fr["valid"], fr["score"], -jnp.inf))
        f = jnp.where(fr["valid"][f], f, jnp.argmax(fr["valid"]))  # only -inf scores left
        ok = fr["valid"][f]
        tok, par, dep, score = fr["tok"][f], fr["par"][f], fr["dep"][f], fr["score"][f]
        nd = dict(
            tok=nd["tok"].at[i].set(jnp.where(ok, tok, 0)),
            par=nd["par"].at[i].set(jnp.where(ok, par, -1)),
            dep=nd["dep"].at[i].set(jnp.where(ok, dep, -1)),
            score=nd["score"].at[i].set(jnp.where(ok, score, -jnp.inf)),
        )
        if not expand_children:   # the last pop: its children could never be popped
            return fr, nd, states_NG
        if conditional:
            parent_state = jnp.where(par >= 0, states_NG[jnp.maximum(par, 0)], root_state)
            s_G = advance(tok, parent_state)
            states_NG = states_NG.at[i].set(s_G)
        else:
            s_G = root_state
        child_dep = dep + 1
        ids_k, lp_k = children(jnp.clip(child_dep, 0, J - 1), s_G)
        start = k + i * k

        def put(x_Z, v_k):
            return jax.lax.dynamic_update_slice(x_Z, v_k, (start,))

        fr = dict(
            tok=put(fr["tok"], ids_k),
            par=put(fr["par"], jnp.full((k,), i, i32)),
            dep=put(fr["dep"], jnp.full((k,), child_dep, i32)),
            score=put(fr["score"], score + lp_k),
            valid=put(fr["valid"].at[f].set(False), jnp.full((k,), ok & (child_dep < J))),
        )
        return fr, nd, states_NG

    carry = jax.lax.fori_loop(0, N - 1, pop, (frontier, nodes, states_NG))
    _, nd, _ = pop(N - 1, carry, expand_children=False)
    num_nodes = jnp.sum(nd["dep"] >= 0).astype(i32)
    return Tree(nd["tok"], nd["par"], nd["dep"], nd["score"], num_nodes)


_STATIC = ("method", "budget", "node_topk", "top_m", "prefix_len", "use_pallas")


@functools.partial(jax.jit, static_argnames=_STATIC)
def build_tree_from_head(base_logits, hidden, root_token, head: DominoHeadWeights | None, *,
                         method: str, budget: int, node_topk: int, top_m: int, prefix_len: int,
                         use_pallas="auto") -> Tree:
    """Build one round's draft tree (docs/algorithm.md §4).

    Args: base_logits [J, V] (row d predicts depth d), hidden [J, H] (z_d), root_token int
    scalar (t0), head: the Domino head's weights (unused, may be None, for ``"ddtree"`` or
    ``prefix_len >= J``). Static: method ``"ddtree" | "condstatic" | "dominotree"``, budget
    N, node_topk k, top_m M (0 = full vocab), prefix_len, use_pallas ``"auto" | True | False |
    "interpret"`` (``"interpret"``: Pallas in interpret mode, for CPU tests).

    Returns a ``Tree`` of N slots; vmap over leading batch dims of the array arguments for a
    batch of rounds.
    """
    with jax.default_matmul_precision("highest"):
        return _build_tree(base_logits, hidden, root_token, head, method=method, budget=budget,
                           node_topk=node_topk, top_m=top_m, prefix_len=prefix_len,
                           use_pallas=use_pallas)


def build_tree(base_logits, hidden, root_token, embed, gru_w_ih, gru_w_hh, proj_w1, proj_w2, *,
               method: str, budget: int, node_topk: int, top_m: int, prefix_len: int,
               use_pallas="auto") -> Tree:
    """``build_tree_from_head`` with the head's weights as separate arguments (checkpoint
    layouts: embed [V, H], gru_w_ih [3G, H], gru_w_hh [3G, G], proj_w1 [E, H+G], proj_w2
    [V, E]; all may be None for ``"ddtree"``)."""
    weights = (embed, gru_w_ih, gru_w_hh, proj_w1, proj_w2)
    head = None if all(w is None for w in weights) else DominoHeadWeights(*weights)
    return build_tree_from_head(base_logits, hidden, root_token, head, method=method,
                                budget=budget, node_topk=node_topk, top_m=top_m,
                                prefix_len=prefix_len, use_pallas=use_pallas)
