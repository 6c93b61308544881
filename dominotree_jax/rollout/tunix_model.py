"""Our target under tunix's model calling convention, so tunix's own sampler and learners can
run it: ``model(tokens, positions, cache, attention_mask) -> (logits, cache)``.

``cache`` is ``None`` (a teacher-forced forward, ``attention_mask [B, T, T]``) or the dict made
by ``init_cache`` (``attention_mask [B, T, S]`` over its slots; new keys/values are written at
``end_index``). Masks are True where a query may attend, as in tunix.

Pad ids inside prompts: tunix's trainer masks every token equal to ``pad_id`` (positions skip
it, no query attends to it). ``TunixCausalLM(target, pad_id=p)`` instead treats only the
leading run of ``p`` (left padding) and the trailing run (completion padding) as padding in a
teacher-forced call (``cache is None``), recomputing positions and the causal mask itself, so
the trainer scores the context the rollout engine conditioned on (``prompt_pads="keep"``,
docs/rl.md). ``pad_id=None``: tunix's positions and mask are used as given.

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
from dominotree_jax.model.target import TargetModel, bind_target, teacher_forced_forward
from dominotree_jax.rollout.masked_forward import real_tokens


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
    tokens, positions, mask = tokens.astype(jnp.int32), positions.astype(jnp.int32), mask.astype(
        bool)
    if kv is None:   # teacher-forced: the one forward every architecture runs
        out = teacher_forced_forward(target, tokens, positions, mask)
        return target.logits(out.hidden), (out.cache.k, out.cache.v)
    if target.cfg.is_hybrid:
        raise NotImplementedError(
            f"{target.cfg.architecture}: tunix's own sampler steps a dense-mask KV cache, which "
            "a recurrent state cannot follow; sample with the DominoTree rollout engine "
            "(dominotree_jax.rollout.DominoTreeRollout)")
    out = target(tokens, positions, mask, KVCache(*kv), jnp.full((B,), end_index, jnp.int32))
    return target.logits(out.hidden), (out.cache.k, out.cache.v)


def edge_padded_inputs(tokens_BW, pad_id: int):
    """Positions ``[B, W]`` and causal mask ``[B, W, W]`` where only the leading and trailing
    runs of ``pad_id`` are padding."""
    valid_BW = real_tokens(tokens_BW, pad_id, "keep")
    pos_BW = jnp.maximum(jnp.cumsum(valid_BW.astype(jnp.int32), axis=1) - 1, 0)
    col_W = jnp.arange(tokens_BW.shape[1])
    mask_BWW = (col_W[None, None, :] <= col_W[None, :, None]) & valid_BW[:, None, :]
    return pos_BW, mask_BWW


class TunixCausalLM(nnx.Module):
    def __init__(self, target: TargetModel, pad_id: int | None = None):
        """``pad_id``: the pad id whose occurrences inside a sequence are real tokens in
        teacher-forced calls (module docstring); ``None``: tunix's masks as given."""
        cfg = target.cfg
        self.target = target
        self.pad_id = None if pad_id is None else int(pad_id)
        self.config = TunixModelConfig(cfg.num_hidden_layers, cfg.num_key_value_heads,
                                       cfg.head_dim)
        self.num_embed = cfg.vocab_size

    @classmethod
    def from_params(cls, tcfg: TargetConfig, params, pad_id: int | None = None
                    ) -> "TunixCausalLM":
        return cls(bind_target(tcfg, params), pad_id)

    def init_cache(self, batch_size: int, cache_size: int, dtype) -> dict:
        cfg = self.target.cfg
        kv = KVCache.zeros(cfg.num_hidden_layers, batch_size, cache_size,
                           cfg.num_key_value_heads, cfg.head_dim, dtype)
        return {"k": kv.k, "v": kv.v, "end_index": jnp.zeros((), jnp.int32)}

    def __call__(self, input_tokens, positions, cache, attention_mask, **unused):
        kv = None if cache is None else (cache["k"], cache["v"])
        end = None if cache is None else cache["end_index"]
        if cache is None and self.pad_id is not None:
            positions, attention_mask = edge_padded_inputs(input_tokens, self.pad_id)
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
