"""Parameter pytrees by checkpoint name: ``{"layers.0.self_attn.q_proj.weight": array}`` ↔ the
``nnx.State`` of a module (converters fill states from files; training keeps a flat dict)."""

from __future__ import annotations

import jax
from flax import nnx


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
