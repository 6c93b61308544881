"""Our target under tunix's model calling convention, so tunix's own sampler and learners can
run it: ``model(tokens, positions, cache, attention_mask) -> (logits, cache)``.

``cache`` is ``None`` (a teacher-forced forward, ``attention_mask [B, T, T]``) or the dict made
by ``init_cache`` (``attention_mask [B, T, S]`` over its slots; new keys/values are written at
``end_index``). Masks are True where a query may attend, as in tunix.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import nnx

from dominotree_jax.config import TargetConfig
from dominotree_jax.model.cache import KVCache
from dominotree_jax.model.target import TargetModel, bind_target


@dataclasses.dataclass(frozen=True)
class TunixModelConfig:
    """The sizes tunix reads from ``model.config`` (its vanilla rollout's cache config)."""
    num_layers: int
    num_kv_heads: int
    head_dim: int


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
        B, T = input_tokens.shape
        cfg = self.target.cfg
        if cache is None:
            kv = KVCache.zeros(cfg.num_hidden_layers, B, T, cfg.num_key_value_heads,
                               cfg.head_dim, self.target.embed_tokens.weight[...].dtype)
            start_B = jnp.zeros((B,), jnp.int32)
        else:
            kv = KVCache(cache["k"], cache["v"])
            start_B = jnp.full((B,), cache["end_index"], jnp.int32)
        out = self.target(input_tokens.astype(jnp.int32), positions.astype(jnp.int32),
                          attention_mask.astype(bool), kv, start_B)
        logits = self.target.logits(out.hidden)
        if cache is None:
            return logits, None
        return logits, {"k": out.cache.k, "v": out.cache.v, "end_index": cache["end_index"] + T}
