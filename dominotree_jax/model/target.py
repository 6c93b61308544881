"""The target decoder (docs/algorithm.md §1): Qwen3, Llama/SmolLM2 and Qwen2 by configuration.

A forward takes tokens, absolute positions and the first cache slot to write; it writes the
new K/V into the fixed-shape cache and returns the final-normed hidden states, the tapped
residual-stream outputs of the requested layers (``hidden_states[i + 1]`` in HF terms: before
the final norm, except the last layer, which HF reports after it) and the new cache.

Two ways to say what each row sees:

- ``forward_cached`` (prefill chunks, AR steps, tree verification): a structured mask, the
  committed prefix length per batch row plus a small ``[B, T, T]`` mask among the new rows;
  attention runs blockwise over the live cache prefix (``layers.attend_cached``).
- ``__call__``: an explicit dense ``[B, T, S]`` mask over the cache slots (plain attention;
  the reference, and what tunix-style callers pass).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from dominotree_jax.config import TargetConfig
from dominotree_jax.model.cache import (KVCache, KVRows, gather_rows, value_dtype, view_layer,
                                        write_layer)
from dominotree_jax.model.gated_deltanet import GatedDeltaNet, absorb
from dominotree_jax.model.moe import GptOssMoE, SparseMoE
from dominotree_jax.model.layers import (Attention, Embedding, Linear, RMSNorm, SwiGLU, attend,
                                         attend_cached, attend_window_sinks, matmul_t,
                                         rope_cos_sin, rope_inv_freq)
from dominotree_jax.precision import (ACTIVATION_DTYPE, float32_view, params_precision,
                                      to_activation)

# prompt tokens per prefill forward (one compiled chunk program); 512 measured fastest for a 4k
# prompt on an Intel Xeon (11.5 s against 14.9 s at 256; docs/precision.md)
PREFILL_CHUNK = 512
# a hybrid's chunks: a linear-attention layer solves a T x T system per chunk (the chunked
# gated-delta form), whose work and float32 error grow with T; 64 as the reference kernels use
HYBRID_PREFILL_CHUNK = 64


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: TargetConfig, layer: int, *, dtype, operand_dtype=None,
                 rngs: nnx.Rngs):
        """An attention layer (``self_attn``) or, on a hybrid's linear-attention layers, a
        Gated DeltaNet (``linear_attn``)."""
        norm = functools.partial(RMSNorm, cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype,
                                 offset=cfg.norm_offset)
        self.input_layernorm = norm()
        if cfg.is_linear(layer):
            self.linear_attn = GatedDeltaNet(cfg.hidden_size, cfg.linear_attention,
                                             cfg.rms_norm_eps, dtype=dtype,
                                             operand_dtype=operand_dtype, rngs=rngs)
        else:
            self.self_attn = Attention(cfg.hidden_size, cfg.num_attention_heads,
                                       cfg.num_key_value_heads, cfg.head_dim,
                                       qk_norm=cfg.qk_norm, bias=cfg.attention_bias,
                                       eps=cfg.rms_norm_eps, dtype=dtype,
                                       operand_dtype=operand_dtype,
                                       output_gate=cfg.attn_output_gate,
                                       norm_offset=cfg.norm_offset,
                                       sinks=cfg.attention_sinks,
                                       output_bias=cfg.output_bias, rngs=rngs)
        self.post_attention_layernorm = norm()
        moe = cfg.moe
        if not cfg.is_moe(layer):
            self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, dtype=dtype,
                              operand_dtype=operand_dtype, rngs=rngs)
        elif moe.kind == "gpt_oss":
            self.mlp = GptOssMoE(cfg.hidden_size, moe.intermediate, moe.num_experts, moe.top_k,
                                 swiglu_alpha=moe.swiglu_alpha, swiglu_limit=moe.swiglu_limit,
                                 dtype=dtype, rngs=rngs)
        else:
            self.mlp = SparseMoE(cfg.hidden_size, moe.intermediate, moe.num_experts, moe.top_k,
                                 norm_topk_prob=moe.norm_topk_prob,
                                 shared_intermediate=moe.shared_intermediate or None,
                                 dtype=dtype, rngs=rngs)


class ForwardOut(NamedTuple):
    hidden: jax.Array   # [B, T, H] after the final norm (feed to ``TargetModel.logits``)
    taps: jax.Array     # [B, T, len(tap_layers) * H] concatenated tapped layer outputs
    cache: KVCache
    rows: KVRows | None = None    # the new rows' own K/V, per attention layer [B, T, K, D]
    #                               (and their recurrent rows, per linear-attention layer)


class TargetModel(nnx.Module):
    def __init__(self, cfg: TargetConfig, *, dtype=jnp.float32, operand_dtype=None,
                 rngs: nnx.Rngs):
        """``operand_dtype`` (static): the float32 view of 16-bit weights (``bind_float32_view``)
        rounds every product's input to that precision; None: the weights' own dtype."""
        self.cfg = cfg
        self.operand_dtype = operand_dtype
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(cfg, i, dtype=dtype, operand_dtype=operand_dtype,
                                             rngs=rngs)
                                for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype,
                            offset=cfg.norm_offset)
        self.lm_head = (None if cfg.tie_word_embeddings else
                        Linear(cfg.hidden_size, cfg.vocab_size, axes=("vocab", "embed"),
                               dtype=dtype, operand_dtype=operand_dtype, rngs=rngs))

    # -- pieces shared with the drafter (which has no embedding or head of its own)
    def embed(self, tokens):
        """Token embeddings in the activation dtype (float32: the residual stream's)."""
        return to_activation(jnp.take(self.embed_tokens.weight[...], tokens, axis=0))

    @property
    def head_weight_VH(self) -> jax.Array:
        return self.embed_tokens.weight[...] if self.lm_head is None else self.lm_head.weight[...]

    def logits(self, hidden_sH):
        """float32 logits ``[..., V]`` from final-normed hidden states (a float32-accumulated
        product whatever the weights' dtype: never quantised to bf16)."""
        return matmul_t(hidden_sH, self.head_weight_VH,
                        operand_dtype=self.operand_dtype).astype(jnp.float32)

    def logits_vocab_major(self, hidden_BRH):
        """``logits`` of ``[B, R, H]`` hidden states, the product laid out ``[B, V, R]`` (then
        swapped back): the same values. A reduction over the vocabulary right after the product
        (a sampler's max) makes XLA:CPU fuse both into one YNNPACK fusion that at 4 x 17 rows
        ran ~6x slower than the product alone; over the major axis it stays separate
        (``benchmarks/results/precision/sampling_zen5.md``). float32 weights only; others go
        through ``logits``."""
        w_VH = self.head_weight_VH
        if w_VH.dtype != jnp.float32 or self.operand_dtype is not None or hidden_BRH.ndim != 3:
            return self.logits(hidden_BRH)
        return jnp.swapaxes(jnp.einsum("brh,vh->bvr", hidden_BRH.astype(jnp.float32), w_VH), 1, 2)

    def __call__(self, tokens_BT, positions_BT, mask_BTS, cache: KVCache, write_start_B,
                 tap_layers: tuple[int, ...] = ()) -> ForwardOut:
        """Forward with a dense boolean mask ``[B, T, S]`` over the cache slots (after the
        new rows are written at ``write_start``). Dense targets only: a hybrid's recurrent
        state needs each row's path, which ``forward_cached`` takes."""
        if self.cfg.is_hybrid:
            raise NotImplementedError(
                f"{self.cfg.architecture}: the dense-mask forward does not serve targets with "
                "linear-attention layers; use forward_cached (a structured mask)")

        def attn(i, q, k, v, cache_k, cache_v, layer):
            cache_k = write_layer(cache_k, k, write_start_B)
            cache_v = write_layer(cache_v, v, write_start_B)
            mask = mask_BTS
            window = self.cfg.layer_window(layer)
            if window is not None:   # slot s holds position s
                mask = mask & (positions_BT[:, :, None]
                               - jnp.arange(mask.shape[-1])[None, None] < window)
            sinks = self.layers[layer].self_attn.sinks
            out = attend(q, view_layer(cache_k).transpose(0, 2, 1, 3),
                         view_layer(cache_v).transpose(0, 2, 1, 3), mask,
                         None if sinks is None else sinks[...])
            return out, cache_k, cache_v
        return self._layers(tokens_BT, positions_BT, cache, attn, tap_layers)

    def forward_cached(self, tokens_BT, positions_BT, cache: KVCache, write_start_B, prefix_B,
                       block_mask_BTT, tap_layers: tuple[int, ...] = (),
                       absorb_B=None) -> ForwardOut:
        """Forward ``T`` new rows written at slots ``write_start_b + t``; row ``t`` sees the
        cache slots ``< prefix_b`` and the new rows ``j`` with ``block_mask[b, t, j]``.
        A hybrid's recurrent states move on by the first ``absorb_b`` rows (a chain: prefill
        chunks); None leaves them (a verification: ``decoding/commit.py`` absorbs the kept
        path)."""
        def attn(i, q, k, v, cache_k, cache_v, layer):
            # Write first, then read the written cache (only slots < prefix, unchanged): reading
            # the pre-write cache made XLA copy every layer's cache to keep the old value.
            cache_k = write_layer(cache_k, k, write_start_B)
            cache_v = write_layer(cache_v, v, write_start_B)
            q, k, v = _kv_operands(q, k, v, value_dtype(cache_k.dtype))
            return (self._attend_rows(layer, q, k, v, block_mask_BTT, cache_k, cache_v,
                                      prefix_B, positions_BT), cache_k, cache_v)
        out = self._layers(tokens_BT, positions_BT, cache, attn, tap_layers,
                           (block_mask_BTT, positions_BT - prefix_B[:, None]))
        if absorb_B is None or not out.cache.recurrent:
            return out
        return out._replace(cache=out.cache._replace(recurrent=tuple(
            absorb(st, r, absorb_B) for st, r in zip(out.cache.recurrent,
                                                     out.rows.recurrent))))

    def forward_cached_groups(self, tokens_BT, positions_BT, cache: KVCache, write_start_B,
                              prefix_B, block_mask_BTT, widths: tuple[int, ...],
                              fused: bool = True) -> ForwardOut:
        """``forward_cached`` with the batch in ``len(widths)`` equal groups of consecutive rows,
        group ``g`` reading only the first ``widths[g]`` cache slots: static slices of the
        written cache, one dense pass each, no conditional (the slot-refill AR steps,
        ``train/data/slots.py``, whose host knows every row's position). The caller keeps each
        row's ``prefix`` within its group's width; slots past it are not seen. ``fused``: the
        cache pass as elementwise products and sums (``attend_cached(fused=True)``, faster for
        these one-row steps on XLA:CPU); False: the dots of every other path."""
        B, G = tokens_BT.shape[0], len(widths)
        if B % G:
            raise ValueError(f"{B} rows do not split into {G} equal groups")
        R = B // G

        def attn(i, q, k, v, cache_k, cache_v, layer):
            cache_k = write_layer(cache_k, k, write_start_B)
            cache_v = write_layer(cache_v, v, write_start_B)
            q, k, v = _kv_operands(q, k, v, value_dtype(cache_k.dtype))
            outs = [attend_cached(q[g * R:(g + 1) * R], k[g * R:(g + 1) * R],
                                  v[g * R:(g + 1) * R], block_mask_BTT[g * R:(g + 1) * R],
                                  cache_k[g * R:(g + 1) * R, :, :w],
                                  cache_v[g * R:(g + 1) * R, :, :w],
                                  prefix_B[g * R:(g + 1) * R], mode="dense", fused=fused)
                    for g, w in enumerate(widths)]
            return jnp.concatenate(outs, axis=0), cache_k, cache_v
        if self.cfg.is_hybrid or self.cfg.attention_sinks or self.cfg.sliding_window:
            raise NotImplementedError(f"{self.cfg.architecture}: slot groups serve plain "
                                      "full-attention targets only")
        return self._layers(tokens_BT, positions_BT, cache, attn, ())

    def forward_rows(self, tokens_BT, positions_BT, cache: KVCache, prefix_B, block_mask_BTT,
                     tap_layers: tuple[int, ...] = ()) -> ForwardOut:
        """``forward_cached`` **without writing the cache**: ``ForwardOut.cache`` is the cache
        unchanged, ``ForwardOut.rows`` the new rows' K/V for the caller to write where it wants
        (a cache only read inside a ``lax.switch`` branch is not copied; one updated there is
        copied whole by XLA)."""
        def attn(i, q, k, v, cache_k, cache_v, layer):
            q, k, v = _kv_operands(q, k, v, value_dtype(cache_k.dtype))
            out = self._attend_rows(layer, q, k, v, block_mask_BTT, cache_k, cache_v, prefix_B,
                                    positions_BT)
            return out, cache_k, cache_v
        return self._layers(tokens_BT, positions_BT, cache, attn, tap_layers,
                            (block_mask_BTT, positions_BT - prefix_B[:, None]))

    def _attend_rows(self, layer: int, q, k, v, block_mask_BTT, cache_k, cache_v, prefix_B,
                     positions_BT):
        """``attend_cached`` for layer ``layer``; a sliding-window layer or one with attention
        sinks takes ``attend_window_sinks``."""
        window = self.cfg.layer_window(layer)
        sinks = self.layers[layer].self_attn.sinks
        if window is None and sinks is None:
            return attend_cached(q, k, v, block_mask_BTT, cache_k, cache_v, prefix_B,
                                 mode=self.cfg.attention_impl)
        return attend_window_sinks(q, k, v, block_mask_BTT, cache_k, cache_v, prefix_B,
                                   positions_BT, window, None if sinks is None else sinks[...])

    def _layers(self, tokens_BT, positions_BT, cache: KVCache, attn, tap_layers,
                paths=None) -> ForwardOut:
        """``paths``: (in-block mask ``[B, T, T]``, each row's depth in the block ``[B, T]``),
        what a linear-attention layer reads (``gated_deltanet.py``)."""
        cfg = self.cfg
        if (len(cache.k), len(cache.recurrent)) != (len(cfg.attention_layers),
                                                    len(cfg.linear_layers)):
            raise ValueError(f"cache has {len(cache.k)} attention and {len(cache.recurrent)} "
                             f"recurrent layers, the model {len(cfg.attention_layers)} and "
                             f"{len(cfg.linear_layers)}")
        inv_freq, scale = rope_inv_freq(cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling,
                                        cfg.max_position_embeddings)
        cos, sin = rope_cos_sin(positions_BT, inv_freq, scale)
        h = self.embed(tokens_BT)
        new_k, new_v, taps = list(cache.k), list(cache.v), {}
        rows_k, rows_v, rows_rec = [], [], []
        a = r = 0   # the next attention / recurrent cache entry
        for i, layer in enumerate(self.layers):
            x = layer.input_layernorm(h)
            if cfg.is_linear(i):
                out, rows = layer.linear_attn(x, cache.recurrent[r], *paths)
                rows_rec.append(rows)
                r += 1
                h = h + out
            else:
                q, gate = layer.self_attn.queries_and_gate(x, cos, sin)
                k, v = layer.self_attn.keys_values(x, cos, sin)
                out, new_k[a], new_v[a] = attn(a, q, k, v, new_k[a], new_v[a], i)
                rows_k.append(k)
                rows_v.append(v)
                a += 1
                h = h + layer.self_attn.output(out, gate)
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
        return ForwardOut(normed, tapped, KVCache(tuple(new_k), tuple(new_v), cache.recurrent),
                          KVRows(tuple(rows_k), tuple(rows_v), tuple(rows_rec)))


def _kv_operands(q, k, v, kv_dtype):
    """Queries and the new rows' K/V in the cache's dtype: the attention products read them as
    they will later be read back from the cache (float32: unchanged)."""
    return q.astype(kv_dtype), k.astype(kv_dtype), v.astype(kv_dtype)


@functools.lru_cache(maxsize=None)
def target_graphdef(cfg: TargetConfig, dtype_name: str = "float32",
                    operand_name: str | None = None):
    """(graphdef, abstract state) of a ``TargetModel`` for ``cfg``: no arrays are allocated."""
    abstract = nnx.eval_shape(
        lambda: TargetModel(cfg, dtype=jnp.dtype(dtype_name), operand_dtype=operand_name,
                            rngs=nnx.Rngs(0)))
    return nnx.split(abstract)


def bind_target(cfg: TargetConfig, params) -> TargetModel:
    """A ``TargetModel`` module over the parameter pytree ``params`` (an ``nnx.State``);
    jit-safe."""
    graphdef, _ = target_graphdef(cfg, _params_dtype(params))
    return nnx.merge(graphdef, params)


def bind_float32_view(cfg: TargetConfig, params) -> TargetModel:
    """The target over the float32 view of 16-bit ``params`` (``precision.float32_view``),
    each product rounding its input to their precision first: the same products XLA:CPU runs
    for a one-row 16-bit forward, with the weights' upcast made here, once, instead of in every
    call. Float32 ``params``: ``bind_target``. jit-safe (the upcast is traced where called)."""
    name = _params_dtype(params)
    if name == "float32":
        return bind_target(cfg, params)
    graphdef, _ = target_graphdef(cfg, "float32", name)
    return nnx.merge(graphdef, float32_view(params))


def _params_dtype(params) -> str:
    return params_precision(params, "target parameters")


def init_target_params(cfg: TargetConfig, seed: int = 0, dtype=jnp.float32):
    """Random parameters (tests, examples)."""
    return nnx.state(TargetModel(cfg, dtype=dtype, rngs=nnx.Rngs(seed)))


def teacher_forced_forward(target: TargetModel, tokens_BW, positions_BW, mask_BWW,
                           tap_layers: tuple[int, ...] = ()) -> ForwardOut:
    """The one teacher-forced forward (api, trainer, rollout engine): ``W`` tokens from an
    empty cache, row ``t`` seeing the rows ``j`` with ``mask[b, t, j]`` (causal, with any
    holes: padding anywhere) at RoPE ``positions``. Every architecture (a hybrid's recurrent
    layers read each row's path from the mask and its depth from the positions)."""
    B, W = tokens_BW.shape
    cache = KVCache.for_target(target.cfg, B, W, target.embed_tokens.weight[...].dtype)
    zeros_B = jnp.zeros((B,), jnp.int32)
    return target.forward_cached(tokens_BW, positions_BW, cache, zeros_B, zeros_B, mask_BWW,
                                 tuple(tap_layers))


def causal_mask(batch: int, T: int, S: int, start_B=None):
    """``[B, T, S]``: query ``t`` (absolute slot ``start+t``) sees slots ``<= start+t``."""
    start_B = jnp.zeros((batch,), jnp.int32) if start_B is None else start_B
    q = start_B[:, None, None] + jnp.arange(T)[None, :, None]
    return jnp.arange(S)[None, None, :] <= q


def prefill(target: TargetModel, prompt_BT, lengths_B, max_len: int,
            tap_layers: tuple[int, ...] = (), chunk: int | None = None):
    """Forward a right-padded prompt batch into a fresh cache of ``max_len`` slots.

    Row ``b`` holds its prompt in columns ``0 .. lengths[b]-1``; padding is never attended to.
    The prompt goes through in chunks of ``chunk`` tokens (a ``fori_loop`` over one compiled
    chunk forward, stopping after the last chunk holding a real token): memory is bounded by the
    chunk, and each chunk attends blockwise to the cache written by the ones before it. The
    last chunk is shifted left to end at column ``T`` (recomputing a few rows, identically);
    a hybrid target's prompt is padded to whole chunks instead (its recurrent states take each
    row once), in chunks of ``HYBRID_PREFILL_CHUNK``. Returns ``(ForwardOut, last_logits
    [B, V])`` with the logits after each row's last token.
    ``chunk`` defaults to ``PREFILL_CHUNK``.
    """
    cfg = target.cfg
    B, T = prompt_BT.shape
    if chunk is None:
        chunk = HYBRID_PREFILL_CHUNK if cfg.is_hybrid else PREFILL_CHUNK
    if T > max_len:
        raise ValueError(f"prompt width {T} exceeds the cache length {max_len}")
    width = min(chunk, T)   # columns of one chunk (the chunk forward's ``T``)
    if cfg.is_hybrid and T % width:
        # a recurrent state cannot take a row twice: no shifted last chunk, the prompt padded
        # to whole chunks instead (padding columns are past every row's length)
        prompt_BT = jnp.pad(prompt_BT, ((0, 0), (0, width - T % width)))
    Tw = prompt_BT.shape[1]
    cache = KVCache.for_target(cfg, B, max_len, target.embed_tokens.weight[...].dtype)
    F = len(tap_layers) * cfg.hidden_size
    hidden_BTH = jnp.zeros((B, Tw, cfg.hidden_size), ACTIVATION_DTYPE)
    taps_BTF = jnp.zeros((B, Tw, F), ACTIVATION_DTYPE)
    causal_TT = jnp.arange(width)[None, :] <= jnp.arange(width)[:, None]   # within a chunk

    def one_chunk(c, carry):
        cache, hidden_BTH, taps_BTF = carry
        first = jnp.minimum(c * width, Tw - width)
        # the chunk's own arrays: T = ``width`` columns here, as in ``forward_cached``
        chunk_BT = jax.lax.dynamic_slice_in_dim(prompt_BT, first, width, axis=1)
        chunk_pos_BT = jnp.broadcast_to(first + jnp.arange(width, dtype=jnp.int32), (B, width))
        chunk_mask_BTT = causal_TT[None] & (chunk_pos_BT[:, None, :] < lengths_B[:, None, None])
        start_B = jnp.full((B,), first, jnp.int32)
        out = target.forward_cached(chunk_BT, chunk_pos_BT, cache, start_B, start_B,
                                    chunk_mask_BTT, tap_layers,
                                    absorb_B=jnp.clip(lengths_B - first, 0, width))
        hidden_BTH = jax.lax.dynamic_update_slice_in_dim(hidden_BTH, out.hidden, first, axis=1)
        taps_BTF = jax.lax.dynamic_update_slice_in_dim(taps_BTF, out.taps, first, axis=1)
        return out.cache, hidden_BTH, taps_BTF

    n_chunks = (jnp.max(lengths_B) + width - 1) // width
    cache, hidden_BTH, taps_BTF = jax.lax.fori_loop(0, n_chunks, one_chunk,
                                                    (cache, hidden_BTH, taps_BTF))
    hidden_BTH, taps_BTF = hidden_BTH[:, :T], taps_BTF[:, :T]
    last_logits_BV = target.logits(gather_rows(hidden_BTH, lengths_B[:, None] - 1)[:, 0])
    return ForwardOut(hidden_BTH, taps_BTF, cache), last_logits_BV
