"""Filling an abstract NNX state from a flat ``{dotted.name: array}`` dict, with full checks."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from convert.errors import CheckpointError
from dominotree_jax.model.state import flat_dtypes, flat_names, state_from_flat

__all__ = ["check_layer_count", "check_shapes", "fill_state"]


def check_shapes(expected: dict[str, tuple], found: dict[str, tuple], source: str) -> None:
    """Raise ``CheckpointError`` naming every missing, unexpected and wrongly shaped tensor."""
    missing = [n for n in expected if n not in found]
    unexpected = [n for n in found if n not in expected]
    mismatched = [(n, expected[n], tuple(found[n])) for n in expected
                  if n in found and tuple(found[n]) != expected[n]]
    err = CheckpointError(source, missing, unexpected, mismatched)
    if err.problems:
        raise err


def check_layer_count(num_layers: int, tensors: dict, source: str) -> None:
    """Refuse a config whose layer count disagrees with the ``layers.<i>.`` tensors of the
    file before the model is built (a huge count would take forever to build)."""
    held = {int(n.split(".")[1]) for n in tensors
            if n.startswith("layers.") and n.split(".")[1].isdigit()}
    if held and (len(held) != num_layers or min(held) != 0 or max(held) != num_layers - 1):
        raise CheckpointError(source, other=[
            f"the config says num_hidden_layers={num_layers}, but the tensors hold layers "
            f"{min(held)}..{max(held)} ({len(held)} distinct)"])


def fill_state(abstract_state, tensors: dict[str, np.ndarray], source: str, dtype,
               transforms=None):
    """A concrete copy of ``abstract_state`` with every leaf taken from ``tensors``.

    Raises ``CheckpointError`` naming all missing, unexpected and wrongly shaped tensors.
    ``transforms`` maps a name to a function applied to the array before the shape check.
    """
    expected = flat_names(abstract_state)
    check_shapes(expected, {n: tuple(a.shape) for n, a in tensors.items()}, source)
    kinds = flat_dtypes(abstract_state)
    flat = {}
    for name in expected:
        a = np.asarray(tensors[name])
        if transforms and name in transforms:
            a = transforms[name](a)
        if np.issubdtype(kinds[name], np.integer):   # an id map (a drafter's ``d2t``)
            if not np.issubdtype(a.dtype, np.integer):
                raise CheckpointError(source, [], [], [], [f"{name}: integer ids expected, "
                                                           f"the file holds {a.dtype}"])
            flat[name] = jnp.asarray(a, kinds[name])
            continue
        if not np.issubdtype(a.dtype, np.floating) and a.dtype.name != "bfloat16":
            raise CheckpointError(source, [], [], [], [f"{name}: floating-point weights "
                                                       f"expected, the file holds {a.dtype}"])
        flat[name] = jnp.asarray(a.astype(np.float32) if a.dtype != np.float32 else a,
                                 dtype=dtype)
    return state_from_flat(abstract_state, flat)

