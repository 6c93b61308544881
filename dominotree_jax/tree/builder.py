"""Best-first draft-tree builder with fixed shapes (SPEC §4), jittable and vmap-able.

``build_tree`` takes one round's drafter outputs (``base_logits [K, V]``, ``hidden [K, H]``),
the root token ``t0`` and the checkpoint weights, and returns a ``Tree`` of ``budget`` (N) nodes
in pop order.

Frontier: ``F = k + N*k`` slots in push order. Slots ``0..k-1`` hold the root's children; pop
``i`` writes its ``k`` children into slots ``k + i*k .. k + i*k + k-1`` (marked invalid when the
popped node is at the last depth ``K-1``). Each pop takes ``argmax`` over the valid slots'
cumulative scores; ``argmax`` returns the first maximal index, i.e. the earliest push, which is
the heap tie rule. Children within one expansion come from ``lax.top_k`` (equal values: lower
index first, hence lower token id first for marginal children and lower candidate rank for
conditional ones). When the frontier runs empty before N pops the remaining nodes are invalid:
token 0, parent -1, depth -1, score -inf.

Children distributions:
- ``"ddtree"`` (marginal): ``top_k(log_softmax(base_d))``, computed once per round for all depths.
- ``"dominotree"`` (conditional): depths ``< prefix_len`` as marginal; deeper ones from the node's
  GRU state. GRU states are computed lazily: the frontier stores only the parent's node index,
  and a popped node's state ``GRU(embed[token], parent_state)`` is computed at pop time (one
  GRU step per pop) and kept in ``states [N, G]``. With ``top_m > 0`` the candidates ``C_d``
  (top-M of ``base_d``), ``base_d[C_d]`` and ``W2[C_d]`` are gathered once per round and each pop
  runs ``pallas_kernels.topm_expand`` (Pallas on GPU). ``top_m = 0`` uses the full vocabulary.

Everything is computed in float32 with ``Precision.HIGHEST`` matmuls (no TF32 on GPU), whatever
the input dtype; only the embedding / W2 rows that are needed are gathered and cast.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from dominotree_jax.model.domino_head import gru_step
from pallas_kernels.topm_expand import (
    MAX_KERNEL_M, MAX_KERNEL_TOPK, expand_split, pad_operands, resolve_use_pallas, split_projection,
)

METHODS = ("ddtree", "dominotree")


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
    """``lax.top_k`` behind an optimization barrier. Without it XLA:CPU may fuse consumers of
    the sliced result into the sort that ``top_k`` is decomposed into, which then no longer
    matches its fast TopK rewrite and runs as a full sort of the vocabulary (~100x slower)."""
    return jax.lax.optimization_barrier(jax.lax.top_k(x_sV, k))


def check_settings(K: int, V: int, *, method: str, budget: int, node_topk: int, top_m: int,
                   prefix_len: int) -> None:
    """Validate the static settings against the shapes (shared with the NumPy reference)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if K < 1 or budget < 1 or node_topk < 1:
        raise ValueError("K, budget and node_topk must be >= 1")
    if node_topk > V:
        raise ValueError(f"node_topk={node_topk} exceeds the vocabulary ({V})")
    if top_m < 0 or top_m > V:
        raise ValueError(f"top_m must be in [0, V={V}], got {top_m}")
    if method == "dominotree" and 0 < top_m < node_topk:
        raise ValueError(f"top_m={top_m} must be >= node_topk={node_topk} (or 0 = full vocab)")
    if prefix_len < 0:
        raise ValueError("prefix_len must be >= 0")


def _conditional_expander(base_KV, hidden_KH, w1_EHG, w2_VE, *, k, top_m, use_pallas):
    """Return ``expand(depth, state_G) -> (token ids [k], log-probs [k])`` for one round."""
    use_kernel, interpret = resolve_use_pallas(use_pallas)
    if use_pallas == "auto" and (k > MAX_KERNEL_TOPK or top_m > MAX_KERNEL_M):
        use_kernel = False  # the single-program kernel is for small k and M; True forces it
    a_KE, w1s_EG = split_projection(hidden_KH, w1_EHG)

    if top_m == 0:  # full vocabulary: one [V, E] matvec per pop
        w2 = w2_VE.astype(jnp.float32)

        def expand_full(depth, s_G):
            return expand_split(a_KE[depth], s_G, w1s_EG, base_KV[depth], w2, k, use_pallas=False)

        return expand_full

    baseC_KM, C_KM = _top_k(base_KV, top_m)                   # candidates, once per round
    w2C_KME = jnp.take(w2_VE, C_KM, axis=0).astype(jnp.float32)
    if use_kernel:                                            # pad once per round, not per pop
        a_KE, w1s_EG, baseC_KM, w2C_KME = pad_operands(a_KE, w1s_EG, baseC_KM, w2C_KME)

    def expand_topm(depth, s_G):
        idx_k, lp_k = expand_split(a_KE[depth], s_G, w1s_EG, baseC_KM[depth], w2C_KME[depth], k,
                                   use_pallas=use_kernel, interpret=interpret, prepadded=use_kernel)
        return C_KM[depth][idx_k], lp_k

    return expand_topm


def _build_tree(base_logits, hidden, root_token, embed, gru_w_ih, gru_w_hh, proj_w1, proj_w2, *,
                method, budget, node_topk, top_m, prefix_len, use_pallas):
    K, V = base_logits.shape
    check_settings(K, V, method=method, budget=budget, node_topk=node_topk, top_m=top_m,
                   prefix_len=prefix_len)
    N, k = budget, node_topk
    F = k + N * k
    f32, i32 = jnp.float32, jnp.int32
    base_KV = base_logits.astype(f32)

    marg_lp_Kk, marg_ids_Kk = _top_k(jax.nn.log_softmax(base_KV, axis=-1), k)
    conditional = method == "dominotree" and prefix_len < K

    if conditional:
        if any(w is None for w in (embed, gru_w_ih, gru_w_hh, proj_w1, proj_w2)):
            raise ValueError("dominotree needs embed, gru_w_ih, gru_w_hh, proj_w1 and proj_w2")
        w_ih, w_hh = gru_w_ih.astype(f32), gru_w_hh.astype(f32)
        G = w_hh.shape[-1]
        expand = _conditional_expander(base_KV, hidden.astype(f32), proj_w1, proj_w2, k=k,
                                       top_m=top_m, use_pallas=use_pallas)

        def advance(token, s_G):
            return gru_step(embed[token].astype(f32), s_G, w_ih, w_hh)

        root_state = advance(jnp.asarray(root_token, i32), jnp.zeros((G,), f32))
    else:
        G = 1
        root_state = jnp.zeros((G,), f32)

    def children(depth, s_G):
        ids_k, lp_k = marg_ids_Kk[depth], marg_lp_Kk[depth]
        if conditional:
            c_ids, c_lp = expand(depth, s_G)
            use = depth >= prefix_len
            ids_k, lp_k = jnp.where(use, c_ids, ids_k), jnp.where(use, c_lp, lp_k)
        return ids_k.astype(i32), lp_k

    ids0, lp0 = children(0, root_state)
    slot_F = jnp.arange(F)
    frontier = dict(
        tok=jnp.zeros((F,), i32).at[:k].set(ids0),
        par=jnp.full((F,), -1, i32),
        dep=jnp.where(slot_F < k, 0, -1).astype(i32),
        score=jnp.full((F,), -jnp.inf, f32).at[:k].set(lp0),
        valid=slot_F < k,
    )
    nodes = dict(
        tok=jnp.zeros((N,), i32), par=jnp.full((N,), -1, i32), dep=jnp.full((N,), -1, i32),
        score=jnp.full((N,), -jnp.inf, f32),
    )
    states_NG = jnp.zeros((N, G), f32)

    def pop(i, carry):
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
        if conditional:
            parent_state = jnp.where(par >= 0, states_NG[jnp.maximum(par, 0)], root_state)
            s_G = advance(tok, parent_state)
            states_NG = states_NG.at[i].set(s_G)
        else:
            s_G = root_state
        child_dep = dep + 1
        ids_k, lp_k = children(jnp.clip(child_dep, 0, K - 1), s_G)
        start = k + i * k

        def put(x_F, v_k):
            return jax.lax.dynamic_update_slice(x_F, v_k, (start,))

        fr = dict(
            tok=put(fr["tok"], ids_k),
            par=put(fr["par"], jnp.full((k,), i, i32)),
            dep=put(fr["dep"], jnp.full((k,), child_dep, i32)),
            score=put(fr["score"], score + lp_k),
            valid=put(fr["valid"].at[f].set(False), jnp.full((k,), ok & (child_dep < K))),
        )
        return fr, nd, states_NG

    _, nd, _ = jax.lax.fori_loop(0, N, pop, (frontier, nodes, states_NG))
    num_nodes = jnp.sum(nd["dep"] >= 0).astype(i32)
    return Tree(nd["tok"], nd["par"], nd["dep"], nd["score"], num_nodes)


@functools.partial(jax.jit, static_argnames=("method", "budget", "node_topk", "top_m",
                                              "prefix_len", "use_pallas"))
def build_tree(base_logits, hidden, root_token, embed, gru_w_ih, gru_w_hh, proj_w1, proj_w2, *,
               method: str, budget: int, node_topk: int, top_m: int, prefix_len: int,
               use_pallas="auto") -> Tree:
    """Build one round's draft tree (SPEC §4).

    Args (checkpoint layouts): base_logits [K, V] (row d predicts depth d), hidden [K, H] (z_d),
    root_token int scalar (t0), embed [V, H], gru_w_ih [3G, H], gru_w_hh [3G, G],
    proj_w1 [E, H+G], proj_w2 [V, E]. For ``method="ddtree"`` (or ``prefix_len >= K``) the
    GRU/projection arguments (and ``embed``/``hidden``) are unused and may be None.
    Static: method ``"ddtree" | "dominotree"``, budget N, node_topk k, top_m M (0 = full vocab),
    prefix_len P, use_pallas ``"auto" | True | False | "interpret"`` (``"interpret"``: Pallas in
    interpret mode, for CPU tests).

    Returns a ``Tree`` of N slots; vmap over leading batch dims of the array arguments for a
    batch of rounds.
    """
    with jax.default_matmul_precision("highest"):
        return _build_tree(base_logits, hidden, root_token, embed, gru_w_ih, gru_w_hh, proj_w1,
                           proj_w2, method=method, budget=budget, node_topk=node_topk,
                           top_m=top_m, prefix_len=prefix_len, use_pallas=use_pallas)
