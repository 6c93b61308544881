"""The benchmarks: one entry point, run from the repository root as
``python -m benchmarks GROUP NAME [ARGS]`` (``python -m benchmarks`` lists them; README.md here
has the table). Each group is a subpackage (``methods``, ``gpu``) whose modules each measure one
thing and have a ``main(argv)``; ``common`` holds the table of entry points and the shared
paths; ``tables`` renders the docs' measured tables from ``results/``. What the library itself
also needs (the timer, the prompt sets, the default pair) lives in ``dominotree_jax.measure``.
"""
