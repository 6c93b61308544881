"""Filling an abstract NNX state from a flat ``{dotted.name: array}`` dict, with full checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from convert.errors import CheckpointError
from dominotree_jax.model.state import state_from_flat


def flat_names(state) -> dict[str, tuple]:
    """``{"layers.0.self_attn.q_proj.weight": shape}`` for every parameter of a state."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))[0]:
        out[".".join(str(getattr(p, "key", p)) for p in path)] = tuple(leaf.shape)
    return out


def check_shapes(expected: dict[str, tuple], found: dict[str, tuple], source: str) -> None:
    """Raise ``CheckpointError`` naming every missing, unexpected and wrongly shaped tensor."""
    missing = [n for n in expected if n not in found]
    unexpected = [n for n in found if n not in expected]
    mismatched = [(n, expected[n], tuple(found[n])) for n in expected
                  if n in found and tuple(found[n]) != expected[n]]
    err = CheckpointError(source, missing, unexpected, mismatched)
    if err.problems:
        raise err


def fill_state(abstract_state, tensors: dict[str, np.ndarray], source: str, dtype,
               transforms=None):
    """A concrete copy of ``abstract_state`` with every leaf taken from ``tensors``.

    Raises ``CheckpointError`` naming all missing, unexpected and wrongly shaped tensors.
    ``transforms`` maps a name to a function applied to the array before the shape check.
    """
    expected = flat_names(abstract_state)
    check_shapes(expected, {n: tuple(a.shape) for n, a in tensors.items()}, source)
    flat = {}
    for name in expected:
        a = np.asarray(tensors[name])
        if transforms and name in transforms:
            a = transforms[name](a)
        flat[name] = jnp.asarray(a.astype(np.float32) if a.dtype != np.float32 else a,
                                 dtype=dtype)
    return state_from_flat(abstract_state, flat)


def state_to_flat(state) -> dict[str, np.ndarray]:
    """``{dotted.name: np.ndarray}`` of a concrete state (for saving in checkpoint layout)."""
    return {".".join(str(getattr(p, "key", p)) for p in path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))[0]}
