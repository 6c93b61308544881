"""The target decoder (SPEC §1): Qwen3, Llama/SmolLM2 and Qwen2 by configuration.

One forward takes tokens, absolute positions, an explicit boolean attention mask over the
cache slots, and the first cache slot to write; it writes the new K/V into the fixed-shape
cache and returns the final-normed hidden states, the tapped residual-stream outputs of the
requested layers (``hidden_states[i + 1]`` in HF terms: before the final norm, except the
last layer, which HF reports after it) and the new cache.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from dominotree_jax.config import TargetConfig
from dominotree_jax.model.cache import KVCache, gather_rows, write_layer_rows
from dominotree_jax.model.layers import (Attention, Embedding, Linear, RMSNorm, SwiGLU, attend, matmul_t,
                                         rope_cos_sin, rope_inv_freq)


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: TargetConfig, *, dtype, rngs: nnx.Rngs):
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype)
        self.self_attn = Attention(cfg.hidden_size, cfg.num_attention_heads,
                                   cfg.num_key_value_heads, cfg.head_dim, qk_norm=cfg.qk_norm,
                                   bias=cfg.attention_bias, eps=cfg.rms_norm_eps, dtype=dtype,
                                   rngs=rngs)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, dtype=dtype, rngs=rngs)


class ForwardOut(NamedTuple):
    hidden: jax.Array   # [B, T, H] after the final norm (feed to ``TargetModel.logits``)
    taps: jax.Array     # [B, T, len(tap_layers) * H] concatenated tapped layer outputs
    cache: KVCache


class TargetModel(nnx.Module):
    def __init__(self, cfg: TargetConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(cfg, dtype=dtype, rngs=rngs)
                                for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype)
        self.lm_head = (None if cfg.tie_word_embeddings else
                        Linear(cfg.hidden_size, cfg.vocab_size, dtype=dtype, rngs=rngs))

    # -- pieces shared with the drafter (which has no embedding or head of its own)
    def embed(self, tokens):
        return jnp.take(self.embed_tokens.weight[...], tokens, axis=0)

    @property
    def head_weight_VH(self) -> jax.Array:
        return self.embed_tokens.weight[...] if self.lm_head is None else self.lm_head.weight[...]

    def logits(self, hidden_sH):
        """float32 logits ``[..., V]`` from final-normed hidden states."""
        return matmul_t(hidden_sH, self.head_weight_VH).astype(jnp.float32)

    def __call__(self, tokens_BT, positions_BT, mask_BTS, cache: KVCache, write_start_B,
                 tap_layers: tuple[int, ...] = ()) -> ForwardOut:
        cfg = self.cfg
        inv_freq, scale = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling,
                                        cfg.max_position_embeddings)
        cos, sin = rope_cos_sin(positions_BT, inv_freq, scale)
        h = self.embed(tokens_BT)
        cache_k, cache_v, taps = cache.k, cache.v, {}
        for i, layer in enumerate(self.layers):
            x = layer.input_layernorm(h)
            q = layer.self_attn.queries(x, cos, sin)
            k, v = layer.self_attn.keys_values(x, cos, sin)
            cache_k = write_layer_rows(cache_k, i, k, write_start_B)
            cache_v = write_layer_rows(cache_v, i, v, write_start_B)
            h = h + layer.self_attn.output(attend(q, cache_k[i], cache_v[i], mask_BTS))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            if i in tap_layers:
                taps[i] = h
        normed = self.norm(h)
        if len(self.layers) - 1 in tap_layers:
            # HF's hidden_states[L] is the final-normed output: keep its convention, which the
            # released drafters were trained on.
            taps[len(self.layers) - 1] = normed
        tapped = (jnp.concatenate([taps[i] for i in tap_layers], axis=-1) if tap_layers
                  else jnp.zeros(h.shape[:2] + (0,), h.dtype))
        return ForwardOut(normed, tapped, KVCache(cache_k, cache_v))


@functools.lru_cache(maxsize=None)
def target_graphdef(cfg: TargetConfig, dtype_name: str = "float32"):
    """(graphdef, abstract state) of a ``TargetModel`` for ``cfg``: no arrays are allocated."""
    abstract = nnx.eval_shape(lambda: TargetModel(cfg, dtype=jnp.dtype(dtype_name), rngs=nnx.Rngs(0)))
    return nnx.split(abstract)


def bind_target(cfg: TargetConfig, params) -> TargetModel:
    """A ``TargetModel`` module over the parameter pytree ``params`` (an ``nnx.State``); jit-safe."""
    graphdef, _ = target_graphdef(cfg, _params_dtype(params))
    return nnx.merge(graphdef, params)


def _params_dtype(params) -> str:
    leaves = jax.tree.leaves(params)
    return jnp.dtype(leaves[0].dtype).name if leaves else "float32"


def init_target_params(cfg: TargetConfig, seed: int = 0, dtype=jnp.float32):
    """Random parameters (tests, examples)."""
    return nnx.state(TargetModel(cfg, dtype=dtype, rngs=nnx.Rngs(seed)))


def causal_mask(batch: int, T: int, S: int, start_B=None):
    """``[B, T, S]``: query ``t`` (absolute slot ``start+t``) sees slots ``<= start+t``."""
    start_B = jnp.zeros((batch,), jnp.int32) if start_B is None else start_B
    q = start_B[:, None, None] + jnp.arange(T)[None, :, None]
    return jnp.arange(S)[None, None, :] <= q


def prefill(target: TargetModel, prompt_BT, lengths_B, max_len: int, tap_layers: tuple[int, ...] = ()):
    """Forward a right-padded prompt batch into a fresh cache of ``max_len`` slots.

    Row ``b`` holds its prompt in columns ``0 .. lengths[b]-1``; padding is never attended to.
    Returns ``(ForwardOut, last_logits [B, V])`` with the logits after each row's last token.
    """
    cfg = target.cfg
    B, T = prompt_BT.shape
    cache = KVCache.zeros(cfg.num_hidden_layers, B, max_len, cfg.num_key_value_heads,
                          cfg.head_dim, target.embed_tokens.weight[...].dtype)
    pos_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    slot_S = jnp.arange(max_len)
    mask_BTS = (slot_S[None, None, :] <= pos_BT[:, :, None]) & (
        slot_S[None, None, :] < lengths_B[:, None, None])
    out = target(prompt_BT, pos_BT, mask_BTS, cache, jnp.zeros((B,), jnp.int32),
                 tap_layers=tap_layers)
    last_logits_BV = target.logits(gather_rows(out.hidden, lengths_B[:, None] - 1)[:, 0])
    return out, last_logits_BV
