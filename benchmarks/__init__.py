"""The benchmarks: one entry point, run from the repository root as
``python -m benchmarks GROUP NAME [ARGS]`` (``python -m benchmarks`` lists them; README.md here
has the table). Each group is a subpackage (``methods``, ``step``, ``round``, ``train``,
``gpu``) whose modules each measure one thing and have a ``main(argv)``; ``common`` holds the
table of entry points and the shared paths. What the library itself also needs (the timer, the
prompt sets, the default pair, the product timings) lives in ``dominotree_jax.measure``.
"""
