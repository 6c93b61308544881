"""Benchmarks of the decoding methods on HumanEval, MT-Bench and MATH500 prompts.

``python -m dominotree_jax.bench --help``: ``prompts`` loads the prompt sets from installed data
packages, ``run`` decodes and times them, ``report`` writes ``bench.json``, ``bench.md`` and the
plots.
"""
