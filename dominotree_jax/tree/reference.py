"""Plain NumPy + ``heapq`` reference of the best-first tree builder (docs/algorithm.md §4).

``build_tree_numpy`` takes the same arguments as ``dominotree_jax.tree.build_tree`` (without
``use_pallas``) and returns the same ``Tree`` (NumPy arrays). It is a direct transcription of
the algorithm (docs/algorithm.md §4): a heap keyed on ``(-score, push_counter)``, so the
earliest push wins ties;
children within one expansion are sorted by a stable sort on ``-log_prob``, so the lower token
id (or lower candidate rank in ``C_d``) comes first among equal values.

Precision: float32 throughout, with the same operation structure as the JAX builder:
``log_softmax(x) = (x - max) - log(sum(exp(x - max)))``, ``SiLU(W1 [z; s])`` evaluated as
``SiLU(W1[:, :H] z + W1[:, H:] s)``, ``c = base_C + W2_C h``, and cumulative scores as
``parent_score + child_log_prob`` (root children: ``child_log_prob``).

What is bit-identical to the JAX builder and what is not:
- Exact: the tie rules, hence the whole (token, depth, parent) sequence, whenever the
  comparisons the heap makes are not decided by float rounding. This covers exact ties that
  arise structurally (equal logits within a row, identical rows, tokens with identical
  embedding/logit/W2 rows, equal parent scores with identical child distributions): each
  implementation computes the tied values by the same operations on the same operands, so they
  tie in both and both resolve them by the same rules.
- Equal to rounding: the values themselves. NumPy and XLA sum ``exp`` in different orders and use
  different ``exp``/``log``/``tanh``/sigmoid and matvec kernels. Marginal log-probs differ by
  about one ulp of the log-sum-exp (scores agree within ~1e-6 relative). Corrected logits
  ``c = base + W2·h`` are themselves rounded to ~1 ulp of their magnitude, so each DominoTree
  depth can add ~2 eps32 * max|logit| (about 2e-6 for logits of magnitude 20) to a score
  difference. Two *different* paths whose scores are within that rounding of each other can
  therefore be popped in a different order; with continuous random inputs this has probability
  ~1e-6 per pop, and it cannot happen when all scores are computed exactly (e.g. integer logits
  with a single dominant entry per row, where every log-sum-exp is exactly 0: then the scores
  are bit-identical too). tests/test_tree_builder.py checks exactly these claims.
"""

from __future__ import annotations

import heapq

import numpy as np

from dominotree_jax.tree.builder import (CORRECTED_TREE_METHODS, MARKOV_TREE_METHODS,
                                         SELECTOR_TREE_METHODS, Tree, check_settings)

_F32 = np.float32


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return _F32(1.0) / (_F32(1.0) + np.exp(-x))


def _topk(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values; equal values: lower index first (stable sort)."""
    return np.argsort(-x, kind="stable")[:k]


def gru_step_numpy(x_H, s_G, w_ih_3GH, w_hh_3GG):
    """NumPy twin of ``domino_head.gru_step`` (bias-free PyTorch GRU, gates r, z, n)."""
    gi_r, gi_z, gi_n = np.split(w_ih_3GH @ x_H, 3)
    gh_r, gh_z, gh_n = np.split(w_hh_3GG @ s_G, 3)
    r = _sigmoid(gi_r + gh_r)
    u = _sigmoid(gi_z + gh_z)
    n = np.tanh(gi_n + r * gh_n)
    return (_F32(1.0) - u) * n + u * s_G


def build_tree_numpy(base_logits, hidden, root_token, embed, gru_w_ih, gru_w_hh, proj_w1,
                     proj_w2, *, method: str, budget: int, node_topk: int, top_m: int,
                     prefix_len: int, markov=None, selector=None) -> Tree:
    """Heap reference of ``build_tree``; same arguments (minus ``use_pallas``) and result.
    ``"dsparktree"``: ``markov = (w1 [V, r], w2 [V, r])``, DSpark's Markov head (the Domino
    weights unused): a node's state is ``w1[token]``, its children ``base_d + w2 · state``.
    ``"dflash2tree"``: ``selector = (pred [V, r], succ [V, r], proj [r, H])``, DFlash2's path
    selector over ``top_m`` candidates: a node's state is ``pred[token]``, its children's
    scores ``base_d[C] + (succ[C] ⊙ (proj · z_d)) · state``."""
    base = np.asarray(base_logits, _F32)
    K, V = base.shape
    check_settings(K, V, method=method, budget=budget, node_topk=node_topk, top_m=top_m,
                   prefix_len=prefix_len)
    N, k = budget, node_topk
    marg_lp = _log_softmax(base)
    corrected = method in CORRECTED_TREE_METHODS and prefix_len < K   # reads the head
    conditional = corrected and method == "dominotree"                # per-node states
    if method in MARKOV_TREE_METHODS:
        m_w1, m_w2 = (np.asarray(w, _F32) for w in markov)
        corrected = conditional = True
        prefix_len = 0
    if method in SELECTOR_TREE_METHODS:
        pred, succ, proj = (np.asarray(w, _F32) for w in selector)
        gate_J = np.asarray(hidden, _F32) @ proj.T            # [J, r]
        m_w1 = pred                                          # the state a token gives
        corrected = conditional = True
        prefix_len = 0

    if method in MARKOV_TREE_METHODS + SELECTOR_TREE_METHODS:
        root_state = m_w1[int(root_token)]
    elif corrected:
        hidden = np.asarray(hidden, _F32)
        embed = np.asarray(embed, _F32)
        w_ih, w_hh = np.asarray(gru_w_ih, _F32), np.asarray(gru_w_hh, _F32)
        w1, w2 = np.asarray(proj_w1, _F32), np.asarray(proj_w2, _F32)
        H = hidden.shape[-1]
        a_JE = hidden @ w1[:, :H].T
        w1s = w1[:, H:]
        zeros_G = np.zeros(w_hh.shape[-1], _F32)
        root_state = gru_step_numpy(embed[int(root_token)], zeros_G, w_ih, w_hh)
    else:
        root_state = None

    def corrected_children(depth: int, state):
        """(token ids [k], log-probs [k]) of a node whose children sit at ``depth``."""
        if not corrected or depth < prefix_len:
            ids = _topk(marg_lp[depth], k)
            return ids, marg_lp[depth][ids]
        cand = _topk(base[depth], top_m) if top_m > 0 else np.arange(V)
        if method in SELECTOR_TREE_METHODS:
            lp = _log_softmax(base[depth][cand] + (succ[cand] * gate_J[depth]) @ state)
            idx = _topk(lp, k)
            return cand[idx], lp[idx]
        if method in MARKOV_TREE_METHODS:
            lp = _log_softmax(base[depth][cand] + m_w2[cand] @ state)
            idx = _topk(lp, k)
            return cand[idx], lp[idx]
        pre = a_JE[depth] + w1s @ state
        h = pre * _sigmoid(pre)
        lp = _log_softmax(base[depth][cand] + w2[cand] @ h)
        idx = _topk(lp, k)
        return cand[idx], lp[idx]

    static = []   # condstatic / ddtree: one (ids, log-probs) per depth, shared by its nodes
    if not conditional:
        # condstatic: the correction under the state of the greedy path (t0, then the top
        # child of every shallower depth); ddtree: the marginal children.
        s = root_state
        for d in range(K):
            ids, lps = corrected_children(d, s)
            static.append((ids, lps))
            if corrected:
                s = gru_step_numpy(embed[int(ids[0])], s, w_ih, w_hh)

    def children(depth: int, state):
        return corrected_children(depth, state) if conditional else static[depth]

    heap: list = []
    counter = 0

    def push_children(depth, parent, parent_score, state):
        nonlocal counter
        ids, lps = children(depth, state)
        for tok, lp in zip(ids, lps):
            score = _F32(lp) if parent < 0 else _F32(parent_score + lp)
            heapq.heappush(heap, (-float(score), counter, int(tok), depth, parent, state))
            counter += 1

    push_children(0, -1, _F32(0.0), root_state)
    tokens, parents, depths, scores = [], [], [], []
    while len(tokens) < N and heap:
        neg_score, _, tok, depth, parent, parent_state = heapq.heappop(heap)
        node = len(tokens)
        score = _F32(-neg_score)
        tokens.append(tok), parents.append(parent), depths.append(depth), scores.append(score)
        if depth + 1 < K:
            state = (None if not conditional else m_w1[tok]
                     if method in MARKOV_TREE_METHODS + SELECTOR_TREE_METHODS
                     else gru_step_numpy(embed[tok], parent_state, w_ih, w_hh))
            push_children(depth + 1, node, score, state)

    n = len(tokens)
    pad = N - n
    return Tree(
        tokens=np.array(tokens + [0] * pad, np.int32),
        parents=np.array(parents + [-1] * pad, np.int32),
        depths=np.array(depths + [-1] * pad, np.int32),
        scores=np.array(scores + [-np.inf] * pad, _F32),
        num_nodes=np.int32(n),
    )
