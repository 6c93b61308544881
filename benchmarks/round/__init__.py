"""``python -m benchmarks round NAME``: the speculative round's parts. ``stages`` times each stage
of every method's round (draft, build, verify, accept, commit) against one AR step; its
``Stages`` are reused by ``drafter_layers``."""
