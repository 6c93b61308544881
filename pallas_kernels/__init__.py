"""Pallas kernels for the tree builder (GPU via Triton; interpret mode on CPU for tests).

Modules: ``pallas_kernels.topm_expand`` (the DominoTree top-M expansion of one popped node) and
``pallas_kernels.gpu_check`` (a script checking and timing it on a GPU). Import from the modules
(``from pallas_kernels.topm_expand import topm_expand``); the package does not re-export the
function, which would shadow the submodule of the same name.
"""
