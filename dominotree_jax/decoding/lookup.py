"""Lookup drafting (docs/algorithm.md §4b), one draft source: continuations copied from the
prompt and the text so far, as draft branches beside (or instead of) the drafter's.

What the round calls (nothing else reads the lookup settings):

- ``propose``: this round's lookup paths for every row (``Candidates``: tokens, validity, the
  matched n-gram length, and each node's score), from the row's prompt and generated tokens;
- ``merge_into_tree`` / ``merge_into_chain``: the drafter's tree (or chain) and the paths under
  one budget; ``tree_of_paths``: the paths alone (method ``"lookup"``, and the rounds of
  ``budget="auto"`` that the drafter sits out);
- ``checked_settings``: ``DecodeConfig``'s lookup fields checked by name.

``lookup_candidates`` finds, for every batch row, the places where the sequence's last ``n``
tokens occurred before (``n`` from ``ngram_max`` down to ``ngram_min``: longest match first,
then the latest), and returns the ``K`` tokens' continuations of length ``L`` that follow them:
fixed shapes, no host round trip. With ``lookup_group = G`` a row also searches what the rows
of its block of ``G`` that continue the same prompt have generated so far (GRPO's group: its
samples repeat each other's phrases, numbers and steps; ``B × (G + 1) × W`` compares a round).
A draft read from another row's committed text is fixed before the round's sampling, so
verification keeps every row exactly the target's. ``reference_candidates`` is the same in
plain Python (tests).

A lookup node's score is the log of the probability that it is accepted, from a per-(n-gram,
depth) acceptance table measured on the target's own answers (``DEFAULT_ACCEPT``), so lookup
nodes and the drafter's nodes (scored by the drafter's path log-probability) compete for the
budget (``merge_row``); nodes that repeat a path already in the tree are merged into it. For a
chain method the row keeps whichever of the chain and the best lookup path has the longer
expected accepted length (``best_chain``). Verification decides what is kept, so the output
stays exactly the target's.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.tree import Tree, chain_tree

# P(lookup depth d accepted | depths < d accepted) for a match of n = 1..4 tokens, depths 0..7:
# measured on SmolLM2's greedy answers to 300 held-out prompts of data/smollm2, 36,599 answer
# positions (benchmarks/results/lookup/acceptance_table.json; `methods lookup_table` @
# 77bcb80)
DEFAULT_ACCEPT = (
    (0.23, 0.54, 0.67, 0.75, 0.76, 0.76, 0.80, 0.77),
    (0.54, 0.64, 0.72, 0.75, 0.77, 0.81, 0.80, 0.83),
    (0.63, 0.71, 0.75, 0.77, 0.81, 0.82, 0.84, 0.81),
    (0.85, 0.87, 0.89, 0.90, 0.91, 0.92, 0.92, 0.93),
)


# default lookup path lengths: beside a drafter, and for method "lookup" (no drafter), whose
# paths of 16 tokens ran 1.0-1.1x as fast as paths of 8 on every set (bf16 weights, budget
# "auto", Zen 5; benchmarks/results/lookup/bf16_host.md); a drafter's tree gained nothing
# clear from them
LOOKUP_LENGTH = {False: 8, True: 16}
LOOKUP_PATHS = 4   # method "lookup"'s lookup paths per round when ``lookup`` is 0


class Candidates(NamedTuple):
    """``K`` lookup paths of ``L`` tokens per row."""
    tokens_BKL: jax.Array   # int32 continuation tokens
    valid_BKL: jax.Array    # bool: the token exists (inside the sequence so far)
    ngram_BK: jax.Array     # int32 matched length n (0: no candidate)
    # float32 each node's cumulative log acceptance (``log_accept_table`` at its path's n and
    # its depth), -inf where invalid: the score it competes with (``propose`` fills it)
    scores_BKL: jax.Array | None = None


def checked_settings(config) -> tuple[tuple[int, int], tuple | None]:
    """``DecodeConfig``'s lookup fields checked by name (``ValueError``), and its
    ``(lookup_ngram, lookup_accept)`` as tuples."""
    for name, v, least in (("lookup", config.lookup, 0),
                           ("lookup_length", config.lookup_path_length, 1),
                           ("lookup_window", config.lookup_window, 1)):
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            raise ValueError(f"{name} must be an int >= {least}, got {v!r}")
    ng = tuple(config.lookup_ngram)
    if len(ng) != 2 or not 1 <= ng[0] <= ng[1]:
        raise ValueError(f"lookup_ngram must be (min, max) with 1 <= min <= max, got {ng!r}")
    if config.lookup and config.method == "ar":
        raise ValueError("lookup drafting needs a drafting method: method='lookup' (no "
                         "drafter) or a drafter's method with lookup=K")
    for name, what in (("lookup_group", "rows per group block"),
                       ("lookup_history", "earlier texts per row")):
        v = getattr(config, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name} must be an int >= 0 ({what}; 0 = off), got {v!r}")
        if v and not config.lookup_paths:
            raise ValueError(f"{name}={v} searches more text for lookup paths: it needs "
                             f"lookup=K (or method='lookup')")
    acc = config.lookup_accept
    if acc is not None:
        acc = tuple(tuple(float(x) for x in row) for row in acc)
        log_accept_table(acc, config.lookup_path_length, ng[1])   # refused by name if bad
    return ng, acc


# ---------------------------------------------------------------------------- the draft source

def path_length(config) -> int:
    """``L``: tokens per lookup path in a round, ``lookup_path_length`` cut to the round's
    ``draft_depth`` (a chain's paths to its ``J`` rows)."""
    return min(config.lookup_path_length, config.draft_depth)


def score_table(config):
    """``[n_max + 1, L]`` cumulative log acceptance of lookup nodes (``log_accept_table`` of
    ``lookup_accept``, else ``DEFAULT_ACCEPT``)."""
    return jnp.asarray(log_accept_table(config.lookup_accept or DEFAULT_ACCEPT,
                                        path_length(config), config.lookup_ngram[1]))


def propose(config, prompt_BT, lengths_B, out_BO, n_B, *, group: "Group | None" = None,
            history_BhW=None) -> Candidates:
    """This round's ``config.lookup_paths`` lookup paths per row, scored: each row's text so far
    (its prompt, right-padded in ``prompt_BT``, then its ``n_B`` tokens of ``out_BO``)
    searched by ``lookup_candidates``, with the other sources ``sources`` built before the
    loop: ``group`` (the rows of its block that continue the same prompt) and
    ``history_BhW`` (earlier texts, as wide as the rows' texts)."""
    seq_BW, total_B = history(prompt_BT, lengths_B, out_BO, n_B)
    found = lookup_candidates(seq_BW, total_B, num=config.lookup_paths,
                              length=path_length(config), ngram_min=config.lookup_ngram[0],
                              ngram_max=config.lookup_ngram[1], window=config.lookup_window,
                              group=group, history_BhW=history_BhW)
    return found._replace(scores_BKL=jnp.where(found.valid_BKL,
                                               score_table(config)[found.ngram_BK], -jnp.inf))


def sources(config, prompt_BT, lengths_B, history_BhC, *, width: int):
    """``(group, history_BhW)``: what ``propose`` searches besides a row's own text, built once
    before the loop. ``group``: with ``config.lookup_group = G``, each row's siblings
    (``group_of``), else None. ``history_BhW``: ``decode``'s ``lookup_history`` (-1 past each
    text's end; ``C <= width``, checked by ``decode``) padded with -1 to the ``width`` of the
    rows' texts, else None."""
    group = group_of(prompt_BT, lengths_B, config.lookup_group) if config.lookup_group else None
    if history_BhC is None:
        return group, None
    if history_BhC.shape[2] > width:
        raise ValueError(f"lookup_history is {history_BhC.shape[2]} tokens wide, the rows' "
                         f"texts {width}")
    return group, jnp.pad(history_BhC, ((0, 0), (0, 0), (0, width - history_BhC.shape[2])),
                          constant_values=-1)


class Group(NamedTuple):
    """The rows a row's lookup also copies from (``lookup_candidates``), ``G`` slots per row."""
    rows_Bg: jax.Array     # int32 [B, G]: the rows of each row's block (clipped to the batch)
    ok_Bg: jax.Array       # bool [B, G]: that row is a sibling (same prompt, not the row itself)
    from_B: jax.Array      # int32 [B]: a row's text starts at this index of its sequence (its
    #                        prompt length: siblings lend only what they generated)


def group_of(prompt_BT, lengths_B, size: int) -> Group:
    """Each row's siblings: the rows of its block of ``size`` consecutive rows (GRPO lays out a
    prompt's samples so) that continue the same prompt (equal length and tokens)."""
    B, T = prompt_BT.shape
    rows_Bg = (jnp.arange(B) // size * size)[:, None] + jnp.arange(size)[None]
    inside_BT = jnp.arange(T)[None] < lengths_B[:, None]
    tok_BT = jnp.where(inside_BT, prompt_BT, -1)
    rows_Bg_c = jnp.minimum(rows_Bg, B - 1)
    same_Bg = ((lengths_B[rows_Bg_c] == lengths_B[:, None])
               & jnp.all(tok_BT[rows_Bg_c] == tok_BT[:, None], axis=-1))
    ok_Bg = same_Bg & (rows_Bg < B) & (rows_Bg != jnp.arange(B)[:, None])
    return Group(rows_Bg_c.astype(jnp.int32), ok_Bg, lengths_B.astype(jnp.int32))


def _proposed(paths: Candidates | None) -> Candidates:
    if paths is None or paths.scores_BKL is None:
        raise ValueError("lookup drafting needs the round's lookup paths (RoundInput.lookup, "
                         "from lookup.propose)")
    return paths


def merge_into_tree(config, tree: Tree, paths: Candidates) -> Tree:
    """``tree`` (a batch, in pop order) and the lookup ``paths`` merged under the tree's budget
    (``merge_row``), nodes up to ``config.draft_depth`` deep."""
    paths = _proposed(paths)
    merge = functools.partial(merge_row, budget=tree.tokens.shape[-1], depth=config.draft_depth)
    tok, par, dep, _, sc = jax.vmap(merge)(
        tree.tokens, tree.parents, tree.depths, tree.valid, tree.scores, paths.tokens_BKL,
        paths.valid_BKL, paths.scores_BKL)
    return Tree(tok, par, dep, sc, jnp.sum(dep >= 0, axis=-1).astype(jnp.int32))


def tree_of_paths(config, paths: Candidates) -> Tree:
    """The best ``config.num_draft_nodes`` lookup nodes alone, no drafter (method
    ``"lookup"``; the rounds of ``budget="auto"`` the drafter sits out)."""
    B, N = _proposed(paths).tokens_BKL.shape[0], config.num_draft_nodes
    empty = Tree(jnp.zeros((B, N), jnp.int32), jnp.full((B, N), -1, jnp.int32),
                 jnp.full((B, N), -1, jnp.int32), jnp.full((B, N), -jnp.inf),
                 jnp.zeros((B,), jnp.int32))
    return merge_into_tree(config, empty, paths)


def merge_into_chain(tokens_BJ, logprobs_BJ, paths: Candidates) -> Tree:
    """A chain method's round: per row, the drafter's chain (``tokens_BJ``, per-node
    ``logprobs_BJ``) or its best lookup path (``best_chain``), as a chain tree whose nodes
    past the lookup path's end are invalid."""
    tokens_BJ, logprobs_BJ, valid_BJ = best_chain(tokens_BJ, logprobs_BJ, _proposed(paths))
    tree = chain_tree(tokens_BJ, jnp.where(valid_BJ, logprobs_BJ, 0.0))
    return tree._replace(depths=jnp.where(valid_BJ, tree.depths, -1),
                         parents=jnp.where(valid_BJ, tree.parents, -1),
                         tokens=jnp.where(valid_BJ, tree.tokens, 0))


def history(prompt_BT, lengths_B, out_BO, n_B):
    """``(seq [B, T + O], total [B])``: each row's prompt then its generated tokens, packed
    left (the prompt is right-padded to ``T``)."""
    T = prompt_BT.shape[1]
    W = T + out_BO.shape[1]
    i_W = jnp.arange(W)[None]
    both = jnp.concatenate([prompt_BT, out_BO], axis=1)
    src = jnp.where(i_W < lengths_B[:, None], i_W, T + i_W - lengths_B[:, None])
    return jnp.take_along_axis(both, jnp.clip(src, 0, W - 1), axis=1), lengths_B + n_B


def lookup_candidates(seq_BW, total_B, *, num: int, length: int, ngram_min: int = 1,
                      ngram_max: int = 4, window: int | None = None,
                      group: Group | None = None, history_BhW=None) -> Candidates:
    """Up to ``num`` continuations of ``length`` tokens per row (see the module docstring).

    A continuation starts at ``c`` when the ``n`` tokens before ``c`` equal the row's last
    ``n`` tokens, ``c < total`` (at least one token follows) and the match starts inside the
    last ``window`` positions. Starts are ranked by their longest ``n`` (capped at
    ``ngram_max``), then by recency; tokens past ``total`` are invalid.

    ``group``: row ``b`` also searches its siblings' sequences (``group.rows_Bg`` where
    ``group.ok_Bg``), from ``c >= from`` (their own text, not the prompt they share) up to
    their ``total``. ``history_BhW``: and ``H`` earlier texts per row (int, left-packed, -1
    past each one's end). For the same ``n`` the row's own starts rank first, then the
    siblings', then the history's; then the later slot, then the later position."""
    B, W = seq_BW.shape
    rows_B = jnp.arange(B)
    src_Bu, ok_Bu = rows_B[:, None], jnp.ones((B, 1), bool)   # slot 0: the row itself
    from_Bu = jnp.zeros((B, 1), jnp.int32)
    tier = [2]
    if group is not None:
        G = group.rows_Bg.shape[1]
        src_Bu = jnp.concatenate([src_Bu, group.rows_Bg], axis=1)
        ok_Bu = jnp.concatenate([ok_Bu, group.ok_Bg], axis=1)
        from_Bu = jnp.concatenate([from_Bu, group.from_B[group.rows_Bg]], axis=1)
        tier += [1] * G
    if group is None:   # the row alone: no gather
        src_BuW, total_Bu = seq_BW[:, None], total_B[:, None]
    else:
        src_BuW, total_Bu = seq_BW[src_Bu], total_B[src_Bu]
    if history_BhW is not None:
        H = history_BhW.shape[1]
        hist_total_Bh = jnp.sum(history_BhW >= 0, axis=-1).astype(total_B.dtype)
        src_BuW = jnp.concatenate([src_BuW, history_BhW.astype(seq_BW.dtype)], axis=1)
        total_Bu = jnp.concatenate([total_Bu, hist_total_Bh], axis=1)
        ok_Bu = jnp.concatenate([ok_Bu, hist_total_Bh > 0], axis=1)
        from_Bu = jnp.concatenate([from_Bu, jnp.zeros((B, H), jnp.int32)], axis=1)
        tier += [0] * H
    u = src_BuW.shape[1]
    tier_u = jnp.asarray(tier, jnp.int32)
    own_u = jnp.arange(u) == 0
    c_W = jnp.arange(W)
    last_B = total_B - 1
    run_BuW = jnp.ones((B, u, W), bool)
    len_BuW = jnp.zeros((B, u, W), jnp.int32)
    for i in range(ngram_max):   # token c-1-i of the source against the row's token total-1-i
        at = c_W - 1 - i
        mine_BuW = src_BuW[:, :, jnp.clip(at, 0, W - 1)]
        want_B = jnp.take_along_axis(seq_BW, jnp.clip(last_B - i, 0, W - 1)[:, None], axis=1)
        run_BuW = (run_BuW & (at >= 0)[None, None] & (last_B - i >= 0)[:, None, None]
                   & (mine_BuW == want_B[:, :, None]))
        len_BuW = len_BuW + run_BuW.astype(jnp.int32)
    lo_B = jnp.zeros_like(total_B) if window is None else total_B - window
    ok_BuW = ((len_BuW >= ngram_min) & ok_Bu[:, :, None]
              & (c_W[None, None] < total_Bu[:, :, None])
              & (c_W[None, None] >= from_Bu[:, :, None])
              & (~own_u[None, :, None] | (c_W[None, None] - len_BuW >= lo_B[:, None, None])))
    # rank: n, then the source's tier (own, sibling, history), then the later slot and position
    per_n = 3 * u * W
    rank_BuW = (len_BuW * per_n + tier_u[None, :, None] * (u * W)
                + jnp.arange(u)[None, :, None] * W + c_W[None, None])
    rank_BK, where_BK = jax.lax.top_k(jnp.where(ok_BuW, rank_BuW, -1).reshape(B, u * W), num)
    has_BK = rank_BK >= 0
    slot_BK = where_BK // W
    pos_BKL = (where_BK % W)[:, :, None] + jnp.arange(length)[None, None]
    tokens = src_BuW[rows_B[:, None, None], slot_BK[:, :, None], jnp.clip(pos_BKL, 0, W - 1)]
    end_BK = jnp.take_along_axis(total_Bu, slot_BK, axis=1)
    valid = has_BK[:, :, None] & (pos_BKL < end_BK[:, :, None])
    return Candidates(jnp.where(valid, tokens, 0), valid,
                      jnp.where(has_BK, rank_BK // per_n, 0).astype(jnp.int32))


def reference_candidates(seq, total: int, *, num: int, length: int, ngram_min: int = 1,
                         ngram_max: int = 4, window: int | None = None, siblings=(),
                         history=()):
    """``lookup_candidates`` for one row in plain Python: ``[(n, slot, start, tokens), ...]``
    (slot 0: the row itself). ``siblings``: ``[(slot, seq, total, from), ...]``, the rows of
    its group (``Group``) and their slots; ``history``: ``[(slot, tokens), ...]``."""
    seq = [int(x) for x in seq[:total]]

    def matches(src, src_total, lo_c, own):
        out = []
        for c in range(max(1, lo_c), src_total):
            n = 0
            while (n < ngram_max and c - 1 - n >= 0 and total - 1 - n >= 0
                   and src[c - 1 - n] == seq[total - 1 - n]):
                n += 1
            if n >= ngram_min and (not own or window is None or c - n >= total - window):
                out.append((n, c))
        return out

    found = [(n, 2, 0, seq, c) for n, c in matches(seq, total, 1, True)]
    for slot, sib, sib_total, lo in siblings:
        sib = [int(x) for x in sib[:sib_total]]
        found += [(n, 1, slot, sib, c) for n, c in matches(sib, sib_total, lo, False)]
    for slot, text in history:
        text = [int(x) for x in text]
        found += [(n, 0, slot, text, c) for n, c in matches(text, len(text), 1, False)]
    found.sort(key=lambda x: (-x[0], -x[1], -x[2], -x[4]))
    return [(n, slot, c, src[c:c + length]) for n, _, slot, src, c in found[:num]]


def log_accept_table(accept, length: int, ngram_max: int) -> np.ndarray:
    """``[ngram_max + 1, length]`` float32 cumulative log acceptance by matched ``n`` and depth
    (row 0, no match: -inf); depths past the table repeat its last value, an ``n`` past it uses
    its last row."""
    table = np.asarray(accept, np.float64)
    if table.ndim != 2 or (table <= 0).any() or (table > 1).any():
        raise ValueError("lookup_accept must be rows of probabilities in (0, 1] (one row per "
                         "matched n-gram length, one column per depth)")
    rows = [table[min(n, len(table)) - 1] for n in range(1, ngram_max + 1)]
    full = np.stack([np.concatenate([r, np.full(max(0, length - len(r)), r[-1])])[:length]
                     for r in rows])
    cum = np.cumsum(np.log(full), axis=1)
    return np.concatenate([np.full((1, length), -np.inf), cum]).astype(np.float32)


# ---------------------------------------------------------------------------- merging

def _path_tokens(tokens_N, parents_N, depths_N, J: int):
    """``[N, J]``: the token at each depth of the path to every node (-1 below its depth)."""
    N = tokens_N.shape[0]

    def step(P_NJ, i):
        par = parents_N[i]
        row = jnp.where(par >= 0, P_NJ[jnp.maximum(par, 0)], jnp.full((J,), -1, jnp.int32))
        row = jnp.where(depths_N[i] >= 0, row.at[jnp.clip(depths_N[i], 0, J - 1)].set(
            tokens_N[i]), jnp.full((J,), -1, jnp.int32))
        return P_NJ.at[i].set(row), None

    P, _ = jax.lax.scan(step, jnp.full((N, J), -1, jnp.int32), jnp.arange(N))
    return P


def merge_row(tokens_N, parents_N, depths_N, valid_N, scores_N, cand_KL, cvalid_KL, cscore_KL,
              *, budget: int, depth: int):
    """One row: the ``budget`` best nodes of the drafter's tree and the lookup paths (pop order:
    score, then depth), duplicates merged → ``(tokens, parents, depths, valid, scores)``.
    ``cscore_KL``: the lookup nodes' scores (``Candidates.scores_BKL``)."""
    N, (K, L) = tokens_N.shape[0], cand_KL.shape
    J = depth
    L = min(L, J)
    cand_KL, cvalid_KL = cand_KL[:, :L], cvalid_KL[:, :L]
    # lookup node (k, d): cumulative log acceptance; valid while the candidate's tokens exist
    lscore_KL = jnp.where(cvalid_KL, cscore_KL[:, :L], -jnp.inf)
    prefix_eq = jnp.cumprod(  # [K, K', L]: candidates k and k' agree on depths 0..d
        (cand_KL[:, None] == cand_KL[None]) & cvalid_KL[:, None] & cvalid_KL[None], axis=2
    ).astype(bool)
    P_NJ = _path_tokens(tokens_N, parents_N, depths_N, J)[:, :L] if N else jnp.zeros(
        (0, L), jnp.int32)
    # [N, K, L]: drafter node i is the path of candidate k at depth d
    lcum = jnp.cumprod((P_NJ[:, None, :] == cand_KL[None]) & cvalid_KL[None], axis=2).astype(bool)
    same_NKL = lcum & (depths_N[:, None, None] == jnp.arange(L)[None, None]) & valid_N[:, None,
                                                                                       None]
    in_tree_KL = jnp.any(same_NKL, axis=0)
    tree_node_KL = jnp.argmax(same_NKL, axis=0)
    earlier_KL = jnp.argmax(prefix_eq, axis=1)          # first k' with the same prefix
    # combined nodes: N drafter nodes, then K*L lookup nodes (index N + k*L + d)
    lk_KL = N + jnp.arange(K)[:, None] * L + jnp.arange(L)[None]
    canon_KL = jnp.where(in_tree_KL, tree_node_KL,
                         N + earlier_KL * L + jnp.arange(L)[None])
    own_KL = canon_KL == lk_KL
    s_U = jnp.concatenate([jnp.where(valid_N, scores_N, -jnp.inf),
                           jnp.full((K * L,), -jnp.inf)])
    s_U = s_U.at[canon_KL.reshape(-1)].max(lscore_KL.reshape(-1))   # merged: the better score
    keep_U = jnp.concatenate([valid_N, (own_KL & cvalid_KL).reshape(-1)]) & (s_U > -jnp.inf)
    s_U = jnp.where(keep_U, s_U, -jnp.inf)
    par_KL = jnp.concatenate([jnp.full((K, 1), -1, jnp.int32), canon_KL[:, :-1]], axis=1)
    tok_U = jnp.concatenate([tokens_N, cand_KL.reshape(-1)])
    dep_U = jnp.concatenate([depths_N, jnp.broadcast_to(jnp.arange(L), (K, L)).reshape(-1)])
    par_U = jnp.concatenate([parents_N, par_KL.reshape(-1)])
    U = N + K * L
    # pop order: score descending, then depth ascending (a parent never after its child)
    order = jnp.lexsort((jnp.arange(U), jnp.where(keep_U, dep_U, J + 1), -s_U))[:budget]
    if budget > U:
        order = jnp.concatenate([order, jnp.full((budget - U,), U - 1)])
    new_index_U = jnp.full((U,), -1, jnp.int32).at[order].set(jnp.arange(budget, dtype=jnp.int32))
    sel_keep = keep_U[order] & (jnp.arange(budget) < U)
    par = par_U[order]
    new_par = jnp.where(par >= 0, new_index_U[jnp.maximum(par, 0)], -1)
    sel_keep = sel_keep & ((par < 0) | (new_par >= 0))   # (never false for a closed set)
    return (jnp.where(sel_keep, tok_U[order], 0), jnp.where(sel_keep, new_par, -1),
            jnp.where(sel_keep, dep_U[order], -1), sel_keep,
            jnp.where(sel_keep, s_U[order], -jnp.inf))


def best_chain(tokens_BJ, logprobs_BJ, cands: Candidates):
    """Chain methods: per row, the drafter's chain or the best lookup path (scored
    ``cands.scores_BKL``), whichever has the longer expected accepted length
    ``Σ_d exp(cumulative log-prob)`` → ``(tokens, logprobs, valid)`` ``[B, J]``."""
    B, J = tokens_BJ.shape
    L = min(J, cands.tokens_BKL.shape[2])
    cum_BJ = jnp.cumsum(logprobs_BJ, axis=1)
    chain_E = jnp.sum(jnp.exp(cum_BJ), axis=1)
    lsc_BKL = jnp.where(cands.valid_BKL[:, :, :L], cands.scores_BKL[:, :, :L], -jnp.inf)
    look_E_BK = jnp.sum(jnp.exp(lsc_BKL), axis=2)
    k_B = jnp.argmax(look_E_BK, axis=1)
    use_B = jnp.max(look_E_BK, axis=1) > chain_E
    pick = jnp.take_along_axis(cands.tokens_BKL[:, :, :L], k_B[:, None, None], 1)[:, 0]
    pvalid = jnp.take_along_axis(cands.valid_BKL[:, :, :L], k_B[:, None, None], 1)[:, 0]
    plog = jnp.take_along_axis(lsc_BKL, k_B[:, None, None], 1)[:, 0]
    pad = J - L
    pick = jnp.pad(pick, ((0, 0), (0, pad)))
    pvalid = jnp.pad(pvalid, ((0, 0), (0, pad)))
    plog = jnp.pad(jnp.diff(plog, axis=1, prepend=0.0), ((0, 0), (0, pad)),
                   constant_values=-jnp.inf)
    tokens = jnp.where(use_B[:, None], pick, tokens_BJ)
    logprobs = jnp.where(use_B[:, None], jnp.where(pvalid, plog, -jnp.inf), logprobs_BJ)
    valid = jnp.where(use_B[:, None], pvalid, True)
    return tokens, logprobs, valid
