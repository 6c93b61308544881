"""``fenced``: each output of a top-k behind its own optimization barrier.

The barriers keep XLA:CPU from fusing the consumers of a ``top_k``'s results into the sort that
``top_k`` is decomposed into: the fused sort no longer matches XLA:CPU's fast TopK rewrite and
runs as a full sort of the vocabulary (~100x slower).

One barrier per array, not one over the ``(values, indices)`` pair: on a multi-device mesh
(jax 0.10.2) the Shardy round trip before SPMD partitioning folds ``opt-barrier(tuple(
get-tuple-element(topk, 0), get-tuple-element(topk, 1)))`` into ``opt-barrier(topk)``, and
XLA:CPU's ``TopkDecomposer`` (``CreateVariadicComparator``), which expects every user of a
``topk`` to be a ``get-tuple-element``, aborts the process (``Check failed: ... 'opt-barrier'
... cannot be downcasted to HloGetTupleElementInstruction``). A one-array barrier cannot be
folded into the pair.
"""

from __future__ import annotations

import jax


def fenced(*arrays: jax.Array) -> tuple[jax.Array, ...]:
    """``arrays``, each behind its own ``lax.optimization_barrier`` (module docstring)."""
    return tuple(jax.lax.optimization_barrier(x) for x in arrays)


def fenced_top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """``lax.top_k(x, k)``'s ``(values, indices)``, fenced."""
    return fenced(*jax.lax.top_k(x, k))
