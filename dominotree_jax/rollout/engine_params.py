"""The rollout engine's parameters: read from its actor, placed for ``decode``, updated in place.

- ``target_of``: the ``(TargetConfig, params)`` of whatever tunix hands over as the actor.
- ``without_explicit_axes``: arrays on a mesh with ``AxisType.Explicit`` axes (``jax.make_mesh``'s
  default, which RLCluster reshards the actor onto) copied to the same devices and
  ``PartitionSpec`` on that mesh with ``Auto`` axes: ``decode`` and our forwards are written for
  ``Auto`` meshes (XLA's partitioner places the intermediates). Anything else stays as it is.
- ``merged_target_params``: tunix's ``update_params`` values merged into the current target
  parameters (a subset merges by path), checked for shape and cast to the current dtypes.
- ``placed_like``: new drafter values placed as the current ones (dtype, shape, sharding).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding

from dominotree_jax.model.target import TargetModel
from dominotree_jax.rollout.tunix_model import TunixCausalLM


def target_of(actor) -> tuple[Any, Any]:
    """``(TargetConfig, params)`` of a ``TunixCausalLM``, ``TargetModel`` or ``dj.Target``."""
    if isinstance(actor, TunixCausalLM):
        actor = actor.target
    if isinstance(actor, TargetModel):
        return actor.cfg, nnx.state(actor)
    if hasattr(actor, "config") and hasattr(actor, "params"):
        return actor.config, actor.params
    raise TypeError(f"rollout_actor must be a TunixCausalLM, TargetModel or dominotree_jax Target,"
                    f" got {type(actor).__name__}")


def auto_axes_sharding(x) -> NamedSharding | None:
    """The ``Auto``-axes twin of ``x``'s sharding when it is on a mesh with ``Explicit`` axes,
    else None."""
    s = getattr(x, "sharding", None)
    if not (isinstance(s, NamedSharding) and isinstance(s.mesh, Mesh)
            and any(t == AxisType.Explicit for t in s.mesh.axis_types)):
        return None
    mesh = s.mesh.update(axis_types=(AxisType.Auto,) * len(s.mesh.axis_names))
    return NamedSharding(mesh, s.spec, memory_kind=s.memory_kind)


def without_explicit_axes(tree):
    """``tree`` unchanged (the same object) unless some array is placed on a mesh with
    ``Explicit`` axes; then a copy of the tree with those arrays on the same devices and
    ``PartitionSpec`` over the mesh with ``Auto`` axes (``decode`` and our forwards are written
    for ``Auto`` meshes)."""
    if tree is None or not any(auto_axes_sharding(x) is not None
                               for x in jax.tree.leaves(tree)):
        return tree

    def place(x):
        s = auto_axes_sharding(x)
        return x if s is None else jax.device_put(x, s)

    return jax.tree.map(place, tree)


def merged_target_params(current_state, new):
    """``current_state`` (an ``nnx.State`` of the target) with the values of ``new`` (a
    ``TargetModel``/``TunixCausalLM`` module or state, or a nested dict; a subset is merged in
    by path, as tunix's vanilla rollout does) put in, each cast to the current dtype. Raises
    ``ValueError`` when a merged value's shape is not the current one."""
    if isinstance(new, nnx.Module):
        new = nnx.state(new)
    pure = nnx.to_pure_dict(new) if isinstance(new, nnx.State) else dict(new)
    if "target" in pure and "embed_tokens" not in pure:   # a TunixCausalLM's state
        pure = pure["target"]
    merged = jax.tree.map(lambda x: x, current_state)
    nnx.replace_by_pure_dict(merged, pure)
    for (path, n), o in zip(jax.tree_util.tree_leaves_with_path(merged),
                            jax.tree.leaves(current_state)):
        if n.shape != o.shape:
            raise ValueError(f"update_params: {jax.tree_util.keystr(path)} has shape "
                             f"{n.shape}, the rollout model has {o.shape}")
    return jax.tree.map(lambda n, o: jnp.asarray(n, o.dtype), merged, current_state)


def placed_like(new_tree, current_tree):
    """``new_tree``'s values with ``current_tree``'s dtypes and shapes, each on its current
    array's sharding (a drafter refresh step's output carries the training mesh's). Raises
    ``ValueError`` when the two trees differ in structure."""
    if jax.tree.structure(current_tree) != jax.tree.structure(new_tree):
        raise ValueError("drafter_params must have the structure of the current drafter")

    def placed(new, cur):
        new = jnp.asarray(new, cur.dtype).reshape(cur.shape)
        return jax.device_put(new, cur.sharding) if isinstance(cur, jax.Array) else new

    return jax.tree.map(placed, new_tree, current_tree)
