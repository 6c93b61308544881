"""``python -m benchmarks methods NAME``: the decoding methods end to end on real prompts.

``bench`` (``make bench``) is the main benchmark: ``bench_run`` decodes and times, ``bench_report``
writes ``bench.json``, ``bench.md`` and the plots. The others each answer one question about a
method's speed or acceptance (``benchmarks.common.GROUPS`` lists them).
"""
