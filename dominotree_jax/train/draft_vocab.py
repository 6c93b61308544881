"""Choosing a drafter's draft vocabulary ``D``: the target ids it may propose (docs/algorithm.md
§3). The target writes few distinct tokens, so the most frequent tokens of its own answers
cover almost all of what it writes; a drafter over ``D`` pays for ``|D|`` columns, not ``V``,
in its LM head and Domino correction, in training and in every tree pop."""

from __future__ import annotations

import numpy as np


def answer_token_counts(ds, ids, vocab_size: int) -> np.ndarray:
    """``[V]`` int64: how often each token appears in the answers of sequences ``ids``."""
    counts = np.zeros((vocab_size,), np.int64)
    for j in ids:
        tokens, L = ds.row(int(j))
        counts += np.bincount(tokens[L:], minlength=vocab_size)
    return counts


def most_frequent(counts, size: int) -> np.ndarray:
    """The ``size`` ids of largest ``counts`` (ties: lower id), sorted: a ``d2t`` map."""
    counts = np.asarray(counts)
    if not 1 <= size <= len(counts):
        raise ValueError(f"draft vocabulary size {size} outside [1, {len(counts)}]")
    order = np.lexsort((np.arange(len(counts)), -counts))   # by count, then id
    return np.sort(order[:size]).astype(np.int32)


def share_inside(counts, d2t) -> float:
    """The share of the tokens counted in ``counts`` that lie in ``d2t``."""
    counts = np.asarray(counts)
    return float(counts[np.asarray(d2t)].sum() / max(counts.sum(), 1))


def frequent_answer_tokens(ds, ids, size: int, vocab_size: int) -> np.ndarray:
    """The ``size`` most frequent answer tokens of ``ids`` (ties: lower id), sorted: a
    ``d2t`` map. Fewer distinct tokens than ``size``: the lowest unseen ids fill it."""
    if not 1 <= size <= vocab_size:
        raise ValueError(f"draft vocabulary size {size} outside [1, {vocab_size}]")
    return most_frequent(answer_token_counts(ds, ids, vocab_size), size)


def coverage(ds, ids, d2t, vocab_size: int) -> float:
    """The share of the answer tokens of ``ids`` that lie in ``d2t``."""
    return share_inside(answer_token_counts(ds, ids, vocab_size), d2t)
