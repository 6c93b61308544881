"""Parameter pytrees by checkpoint name: ``{"layers.0.self_attn.q_proj.weight": array}`` ↔ the
``nnx.State`` of a module (converters fill states from files; training keeps a flat dict)."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx


def _dotted(path) -> str:
    return ".".join(str(getattr(p, "key", p)) for p in path)


def flat_names(state) -> dict[str, tuple]:
    """``{"layers.0.self_attn.q_proj.weight": shape}`` for every parameter of a state."""
    return {_dotted(path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))[0]}


def flat_dtypes(state) -> dict[str, np.dtype]:
    """``{dotted.name: dtype}`` for every leaf of a (possibly abstract) state."""
    return {_dotted(path): np.dtype(leaf.dtype)
            for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))[0]}


def state_to_flat(state) -> dict[str, np.ndarray]:
    """``{dotted.name: np.ndarray}`` of a concrete state (checkpoint names; the inverse of
    ``state_from_flat``)."""
    return {_dotted(path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))[0]}


def state_from_flat(abstract_state, flat: dict):
    """A copy of ``abstract_state`` whose leaves are ``flat[dotted.name]`` (jit-safe; the
    caller checks names and shapes)."""
    pure: dict = {}
    for name, a in flat.items():
        node = pure
        parts = [int(p) if p.isdigit() else p for p in name.split(".")]
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = a
    state = jax.tree.map(lambda x: x, abstract_state)
    nnx.replace_by_pure_dict(state, pure)
    return state


def flat_to_state(cfg, flat: dict):
    """A drafter's ``nnx.State`` for ``DrafterConfig`` ``cfg`` from ``{dotted.name: array}``
    (float32 structure, leaves as given; jit-safe): the inverse of ``state_to_flat``."""
    from dominotree_jax.model.drafter import drafter_graphdef
    _, abstract = drafter_graphdef(cfg, "float32")
    return state_from_flat(abstract, flat)


def trainable(flat: dict) -> dict:
    """The trained parameters of a flat drafter dict as float32 copies: all but integer leaves
    (the draft-to-target map ``d2t``, fixed for a run and passed on beside them)."""
    import jax.numpy as jnp
    return {k: jnp.array(v, jnp.float32, copy=True) for k, v in flat.items()
            if not np.issubdtype(np.asarray(v).dtype, np.integer)}
