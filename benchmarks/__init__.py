"""The benchmarks: scripts run from the repository root as ``python -m benchmarks.<name>``.

``bench_methods`` (``make bench``) decodes the evaluation prompt sets with every method and
writes ``results/bench.json``, ``bench.md`` and the plots (``methods_run`` runs and times,
``methods_report`` writes); each ``bench_*`` script measures one thing (its docstring says what
and how to run it); ``gpu_suite`` is the prepared one-shot GPU run (``gpu_device_run.sh``).
The library's own helpers that they use live in the package: ``dominotree_jax.timing``,
``dominotree_jax.eval_prompts``, ``dominotree_jax.default_pair``, ``dominotree_jax.product_timing``.
"""
