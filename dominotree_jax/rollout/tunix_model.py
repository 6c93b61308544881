"""Our target under tunix's model calling convention, so tunix's own sampler and learners can
run it: ``model(tokens, positions, cache, attention_mask) -> (logits, cache)``.

``cache`` is ``None`` (a teacher-forced forward, ``attention_mask [B, T, T]``) or the dict made
by ``init_cache`` (``attention_mask [B, T, S]`` over its slots; new keys/values are written at
``end_index``). Masks are True where a query may attend, as in tunix.

Explicit mesh axes: tunix's trainer shards the batch over its mesh (``P("fsdp")``) and puts the
parameters on that mesh; with ``jax.make_mesh``'s default ``AxisType.Explicit`` axes those types
travel into the forward, whose cache writes then fail the explicit-sharding checks (the cache
buffers are made inside, with no mesh). Such a call runs in ``jax.sharding.auto_axes`` (XLA's
partitioner places the intermediates, as on our own ``Auto`` meshes) and returns logits and
cache sharded over the batch like the input tokens.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AxisType, PartitionSpec as P

from dominotree_jax.config import TargetConfig
from dominotree_jax.model.cache import KVCache
from dominotree_jax.model.target import TargetModel, bind_target


def explicit_mesh_of(*trees):
    """The (abstract) mesh with ``Explicit`` axes that some array or tracer in ``trees`` is
    typed with, else ``None``."""
    for x in jax.tree.leaves(trees):
        try:
            mesh = jax.typeof(x).sharding.mesh
        except (AttributeError, TypeError):
            continue
        if not mesh.empty and any(t == AxisType.Explicit for t in mesh.axis_types):
            return mesh
    return None


@dataclasses.dataclass(frozen=True)
class TunixModelConfig:
    """The sizes tunix reads from ``model.config`` (its vanilla rollout's cache config)."""
    num_layers: int
    num_kv_heads: int
    head_dim: int


def _forward(target: TargetModel, tokens, positions, mask, kv, end_index):
    """``(logits [B, T, V], (k, v))``; ``kv`` ``None``: a fresh ``T``-slot cache at slot 0."""
    B, T = tokens.shape
    cfg = target.cfg
    if kv is None:
        cache = KVCache.zeros(cfg.num_hidden_layers, B, T, cfg.num_key_value_heads,
                              cfg.head_dim, target.embed_tokens.weight[...].dtype)
        start_B = jnp.zeros((B,), jnp.int32)
    else:
        cache = KVCache(*kv)
        start_B = jnp.full((B,), end_index, jnp.int32)
    out = target(tokens.astype(jnp.int32), positions.astype(jnp.int32), mask.astype(bool),
                 cache, start_B)
    return target.logits(out.hidden), (out.cache.k, out.cache.v)


class TunixCausalLM(nnx.Module):
    def __init__(self, target: TargetModel):
        cfg = target.cfg
        self.target = target
        self.config = TunixModelConfig(cfg.num_hidden_layers, cfg.num_key_value_heads,
                                       cfg.head_dim)
        self.num_embed = cfg.vocab_size

    @classmethod
    def from_params(cls, tcfg: TargetConfig, params) -> "TunixCausalLM":
        return cls(bind_target(tcfg, params))

    def init_cache(self, batch_size: int, cache_size: int, dtype) -> dict:
        cfg = self.target.cfg
        kv = KVCache.zeros(cfg.num_hidden_layers, batch_size, cache_size,
                           cfg.num_key_value_heads, cfg.head_dim, dtype)
        return {"k": kv.k, "v": kv.v, "end_index": jnp.zeros((), jnp.int32)}

    def __call__(self, input_tokens, positions, cache, attention_mask, **unused):
        kv = None if cache is None else (cache["k"], cache["v"])
        end = None if cache is None else cache["end_index"]
        args = (input_tokens, positions, attention_mask, kv, end)
        mesh = explicit_mesh_of(args, nnx.state(self.target))
        if mesh is None:
            logits, (k, v) = _forward(self.target, *args)
        else:
            graphdef, state = nnx.split(self.target)
            leaves, treedef = jax.tree.flatten(state)   # plain arrays through auto_axes
            spec = jax.typeof(input_tokens).sharding.spec
            batch_spec = P(spec[0] if len(spec) else None)

            def fwd(leaves, *args):
                return _forward(nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves)), *args)

            with jax.sharding.use_abstract_mesh(mesh):
                logits, (k, v) = jax.sharding.auto_axes(fwd, out_sharding=batch_spec)(
                    leaves, *args)
        if cache is None:
            return logits, None
        return logits, {"k": k, "v": v, "end_index": end + input_tokens.shape[1]}
