"""Pallas kernels for the tree builder (GPU via Triton; interpret mode on CPU for tests).

A leaf package: it imports nothing from ``dominotree_jax`` or ``convert``.
``pallas_kernels.topm_expand``: the DominoTree top-M expansion of one popped node (its jnp twin
and the split projection it consumes live in ``dominotree_jax/domino_head.py``). The GPU check
and timings are in ``benchmarks/gpu/kernel.py`` (run by ``python -m benchmarks gpu suite``).
"""
