"""Random weights for a pair at real size, drawn on the device by one jitted program (random
weights do not change any stage's cost: every shape is static)."""

from __future__ import annotations

import collections
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.config import check_pair
from dominotree_jax.model.drafter import drafter_graphdef
from dominotree_jax.model.target import target_graphdef

from benchmarks.gpu.configs import PairSpec

_DRAW_ELEMS = 1 << 28  # elements per random draw: well inside 32-bit indexing on any backend


@functools.partial(jax.jit, static_argnames=("shapes", "dtype"))
def _random_leaves(key, shapes: tuple[tuple[int, ...], ...], dtype):
    """One program for all leaves: leaves of one shape are drawn together (stacked, at most
    ``_DRAW_ELEMS`` elements per draw unless one leaf is larger) and sliced out, so the compile
    count and time do not grow with the number of layers."""
    draws = []  # (shape, leaves in this draw)
    for shape in sorted(set(shapes)):
        per_draw = max(1, _DRAW_ELEMS // math.prod(shape))
        count = shapes.count(shape)
        draws += [(shape, min(per_draw, count - i)) for i in range(0, count, per_draw)]
    pools = collections.defaultdict(list)  # shape -> leaves, in draw order
    for sub, (shape, count) in zip(jax.random.split(key, len(draws)), draws):
        if len(shape) < 2:  # norm scales (and any bias): ones
            pool = jnp.ones((count,) + shape, dtype)
        else:               # matrices: variance 1/fan_in, drawn directly in ``dtype``
            bound = math.sqrt(3.0 / shape[-1])
            pool = jax.random.uniform(sub, (count,) + shape, dtype, -bound, bound)
        pools[shape] += [pool[i] for i in range(count)]
    used = collections.Counter()
    out = []
    for shape in shapes:
        out.append(pools[shape][used[shape]])
        used[shape] += 1
    return out


def random_params(abstract_state, seed: int, dtype=jnp.bfloat16):
    """Random parameters for an abstract (``nnx.eval_shape``) state, made on the default device
    by one jitted program: matrices ~ U(+-sqrt(3/fan_in)) (variance 1/fan_in), vectors (norm
    scales) = 1."""
    leaves, treedef = jax.tree.flatten(abstract_state)
    shapes = tuple(tuple(int(n) for n in leaf.shape) for leaf in leaves)
    key = jax.random.key(seed, impl="rbg")  # XLA's RngBitGenerator: quick to compile and run
    return jax.tree.unflatten(treedef, _random_leaves(key, shapes, jnp.dtype(dtype)))


def pair_params(spec: PairSpec, seed: int = 0, dtype=jnp.bfloat16) -> dict:
    """``{"target": ..., "drafter": ...}`` random parameter pytrees for ``spec`` in ``dtype``."""
    check_pair(spec.target, spec.drafter)
    name = jnp.dtype(dtype).name
    _, target_abs = target_graphdef(spec.target, name)
    _, drafter_abs = drafter_graphdef(spec.drafter, name)
    params = {"target": random_params(target_abs, seed, dtype),
              "drafter": random_params(drafter_abs, seed + 1, dtype)}
    jax.block_until_ready(params)
    return params


def num_params(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))
