"""The DFlash drafter backbone (docs/algorithm.md §2), holding the Domino head's weights (§3).

The drafter is a few Qwen3 layers at the target's hidden size with no embedding or LM head of
its own: block tokens are embedded with the target's ``embed_tokens`` and logits come from the
target's head. Attribute names are the checkpoint's key names (``fc.weight``,
``layers.0.self_attn.q_proj.weight``, ``prefix_gru.weight_ih_l0``, ``embed_proj.2.weight`` …).

Context. Each committed token's tapped target features ``[nT*H]`` are projected
(``fc`` → ``hidden_norm``) and every layer turns them into its own K/V with its own
``k_proj``/``k_norm``/``v_proj`` and RoPE at the token's absolute position. These rows live in a
``DrafterContext`` (a ring of slots; slot ``s`` = position ``s`` when it is as long as the
sequence) and are extended once per round.

Block. ``[t0, MASK, …, MASK]`` (``block_size`` slots at positions ``start …``) attends,
non-causally, to the committed context rows and to the whole block. A layer with a window ``W``
(``DrafterConfig.layer_window``: a released ``sliding_window`` or the ``draft_window`` setting)
sees only the last ``W`` committed context rows; then the context needs only a ``W``-slot ring.
The final-normed hidden states ``z`` and the float32 base logits are returned per draft depth
(``shift_label`` decides which slots those are). The Domino head's computations live in
``dominotree_jax/domino_head.py``; ``Drafter.head_weights`` hands them its weights.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from dominotree_jax.config import ConfigError, DrafterConfig
from dominotree_jax.domino_head import DominoHeadWeights, gather_rows
from dominotree_jax.linalg import matmul_t
from dominotree_jax.markov_head import (ConfidenceWeights, MarkovHeadWeights, confidence_logits,
                                        markov_rows)
from dominotree_jax.selector_head import SelectorWeights, block_conv, conv_coefficients
from dominotree_jax.sharding import declare
from dominotree_jax.model.cache import (as_stored, storage_dtype, value_dtype, view_layer,
                                        write_layers_at)
from dominotree_jax.model.layers import (Attention, Linear, RMSNorm, SwiGLU, attend, rope_cos_sin,
                                         rope_inv_freq)
from dominotree_jax.precision import float32_view, params_precision, to_activation


if TYPE_CHECKING:   # shape annotations only; tests check them (tests/shape_check.py)
    from jaxtyping import Array, Int, Shaped


class DrafterContext(NamedTuple):
    """Cached context K/V of the drafter layers, a ring of ``S`` slots: slot ``s`` holds the
    latest committed position ``p < length`` with ``p = s (mod S)``. With ``S`` at least the
    sequence length slot ``s`` is position ``s``; a drafter window ``W`` needs only ``S = W``.
    A bfloat16 context is stored as its bits (``cache.CACHE_BITS``: XLA:CPU would otherwise
    convert the whole context to float32 and back at every write); ``layer_kv`` reads it."""
    k: Shaped[Array, "L B S K D"]  # L: drafter layers; S: the ring's slots
    v: Shaped[Array, "L B S K D"]
    length: Int[Array, " B"]       # committed positions

    @property
    def dtype(self) -> jnp.dtype:
        """The dtype of the K/V values (bfloat16 for a context stored as bits)."""
        return value_dtype(self.k.dtype)

    def layer_kv(self, i: int):
        """Layer ``i``'s K/V values ``[B, S, K, D]``, each in ``dtype``."""
        return view_layer(self.k[i]), view_layer(self.v[i])

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def slot_positions(self) -> jax.Array:
        """``[B, S]`` int32: the position each slot holds (negative: none yet)."""
        last_B1 = self.length[:, None] - 1
        return last_B1 - jnp.mod(last_B1 - jnp.arange(self.max_len)[None], self.max_len)

    def visible(self, window: int | None) -> jax.Array:
        """``[B, S]`` bool: slots holding one of the last ``window`` (``None``: all) positions."""
        w = self.max_len if window is None else min(window, self.max_len)
        return self.slot_positions() >= jnp.maximum(self.length - w, 0)[:, None]

    @classmethod
    def zeros(cls, cfg: DrafterConfig, batch: int, max_len: int, dtype=jnp.float32):
        shape = (cfg.num_hidden_layers, batch, max_len, cfg.num_key_value_heads, cfg.head_dim)
        stored = storage_dtype(dtype)
        return cls(jnp.zeros(shape, stored), jnp.zeros(shape, stored),
                   jnp.zeros((batch,), jnp.int32))


class BlockConv(nnx.Module):
    """DFlash2's in-block convolution around one sublayer (``base_kernel [2, K, H]``: the one
    before, then the one after; ``kernel_projection``; selector_head.py). Starts as the
    identity: unit self-taps, no correction."""

    def __init__(self, hidden: int, kernel: int, group: int, *, dtype, operand_dtype=None,
                 rngs: nnx.Rngs):
        self.kernel = kernel
        self.base_kernel = nnx.Param(jnp.zeros((2, kernel, hidden), dtype).at[:, 0].set(1.0),
                                     **declare("conv_side", "conv_tap", "embed"))
        self.kernel_projection = Linear(hidden, 2 * kernel * (hidden // group),
                                        axes=("conv_taps", "embed"), dtype=dtype,
                                        operand_dtype=operand_dtype, rngs=rngs)

    def around(self, sublayer, x_BTH):
        """``conv_1(sublayer(conv_0(x)))``, both convolutions' corrections from ``x``."""
        delta = conv_coefficients(self.kernel_projection.weight[...], x_BTH, self.kernel)
        base = self.base_kernel[...]
        y = sublayer(block_conv(x_BTH, base[0], delta[:, :, 0]))
        return block_conv(y, base[1], delta[:, :, 1])


class CandidateSelector(nnx.Module):
    """DFlash2's path selector (``candidate_selector.*``; selector_head.py)."""

    def __init__(self, vocab: int, hidden: int, rank: int, *, dtype, rngs: nnx.Rngs):
        self.predecessor_codebook = nnx.Param(
            0.02 * jax.random.normal(rngs.params(), (vocab, rank), dtype),
            **declare("vocab", "selector_rank"))
        self.successor_codebook = nnx.Param(jnp.zeros((vocab, rank), dtype),
                                            **declare("vocab", "selector_rank"))
        self.hidden_projection = Linear(hidden, rank, axes=("selector_rank", "embed"),
                                        dtype=dtype, rngs=rngs)


class DrafterLayer(nnx.Module):
    """A Qwen3 decoder layer (q/k RMSNorm, no qkv bias); DFlash2's: with ``attention_conv``
    and ``mlp_conv`` around its sublayers."""

    def __init__(self, cfg: DrafterConfig, *, dtype, operand_dtype=None, rngs: nnx.Rngs):
        H = cfg.hidden_size
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps, dtype=dtype)
        self.self_attn = Attention(H, cfg.num_attention_heads, cfg.num_key_value_heads,
                                   cfg.head_dim, qk_norm=True, bias=False, eps=cfg.rms_norm_eps,
                                   dtype=dtype, operand_dtype=operand_dtype, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps, dtype=dtype)
        self.mlp = SwiGLU(H, cfg.intermediate_size, dtype=dtype, operand_dtype=operand_dtype,
                          rngs=rngs)
        conv = functools.partial(BlockConv, H, cfg.conv_kernel, cfg.conv_group, dtype=dtype,
                                 operand_dtype=operand_dtype, rngs=rngs)
        self.attention_conv = conv() if cfg.conv_kernel else None
        self.mlp_conv = conv() if cfg.conv_kernel else None


class PrefixGRU(nnx.Module):
    """Bias-free single-layer GRU weights in PyTorch layout (gate order r, z, n)."""

    def __init__(self, hidden: int, state: int, *, dtype, rngs: nnx.Rngs):
        std = 0.02
        self.weight_ih_l0 = nnx.Param(std * jax.random.normal(rngs.params(), (3 * state, hidden),
                                                              dtype),
                                      **declare("gru_gates", "embed"))
        self.weight_hh_l0 = nnx.Param(std * jax.random.normal(rngs.params(), (3 * state, state),
                                                              dtype),
                                      **declare("gru_gates", "gru_state"))


class DraftVocab(nnx.Variable):
    """The draft-to-target id map ``d2t [|D|]`` (int32, strictly increasing target ids): draft
    column ``j`` is target token ``d2t[j]``. Not trained: a fixed part of the drafter."""


def draft_vocab_variable(d2t) -> DraftVocab:
    """The drafter's ``d2t`` variable holding ``d2t`` (its one home: logical axes declared)."""
    return DraftVocab(d2t, **declare("draft_ids"))


def check_draft_vocab(d2t, vocab_size: int, size: int | None = None, what: str = "d2t"):
    """Refuse a draft-to-target map that is not ``size`` distinct integer ids in
    ``[0, vocab_size)``, naming the fault; returns it as a sorted int32 NumPy array."""
    import numpy as np
    a = np.asarray(d2t)
    if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
        raise ConfigError(f"{what}: a draft vocabulary map must be a 1-D integer array, got "
                          f"shape {a.shape} dtype {a.dtype}")
    if size is not None and len(a) != size:
        raise ConfigError(f"{what}: {len(a)} ids for draft_vocab_size={size}")
    if len(a) == 0:
        raise ConfigError(f"{what}: the draft vocabulary is empty")
    bad = a[(a < 0) | (a >= vocab_size)]
    if len(bad):
        raise ConfigError(f"{what}: ids {bad[:5].tolist()} outside the target's vocabulary "
                          f"[0, {vocab_size})")
    uniq, counts = np.unique(a, return_counts=True)
    if len(uniq) != len(a):
        raise ConfigError(f"{what}: repeated ids {uniq[counts > 1][:5].tolist()}")
    return np.sort(a).astype(np.int32)


class MarkovTable(nnx.Module):
    """``markov_w1``: DSpark's ``[V, r]`` table of Markov rows, indexed by token id."""

    def __init__(self, vocab: int, rank: int, *, dtype, rngs: nnx.Rngs):
        self.weight = nnx.Param(0.02 * jax.random.normal(rngs.params(), (vocab, rank), dtype),
                                **declare("vocab", "markov_rank"))


class MarkovHead(nnx.Module):
    """DSpark's Markov head (``markov_head.markov_w1`` ``[V, r]`` / ``markov_w2`` ``[|D|, r]``:
    rows over the draft vocabulary; markov_head.py)."""

    def __init__(self, vocab: int, draft_vocab: int, rank: int, *, dtype, rngs: nnx.Rngs):
        self.markov_w1 = MarkovTable(vocab, rank, dtype=dtype, rngs=rngs)
        self.markov_w2 = Linear(rank, draft_vocab, axes=("vocab", "markov_rank"), dtype=dtype,
                                rngs=rngs)


class ConfidenceHead(nnx.Module):
    """DSpark's confidence head (``confidence_head.proj``, with its bias; markov_head.py)."""

    def __init__(self, width: int, *, dtype, rngs: nnx.Rngs):
        self.proj = Linear(width, 1, axes=("confidence_out", "confidence_in"), bias=True,
                           dtype=dtype, rngs=rngs)


class SiLU(nnx.Module):
    """Parameter-free slot 1 of ``embed_proj`` (Linear, SiLU, Linear), kept for the key names."""


class Drafter(nnx.Module):
    def __init__(self, cfg: DrafterConfig, *, dtype=jnp.float32, operand_dtype=None,
                 rngs: nnx.Rngs):
        """``operand_dtype`` (static): the float32 view of 16-bit weights
        (``bind_drafter_float32_view``), for the ``Linear`` products."""
        self.cfg = cfg
        H = cfg.hidden_size
        lin = functools.partial(Linear, dtype=dtype, operand_dtype=operand_dtype, rngs=rngs)
        self.fc = lin(cfg.num_taps * H, H, axes=("embed", "taps"))
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps, dtype=dtype)
        self.layers = nnx.List([DrafterLayer(cfg, dtype=dtype, operand_dtype=operand_dtype,
                                             rngs=rngs)
                                for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(H, cfg.rms_norm_eps, dtype=dtype)
        if cfg.is_domino:
            G, E = cfg.gru_hidden_dim, cfg.emb_dim
            self.prefix_gru = PrefixGRU(H, G, dtype=dtype, rngs=rngs)
            self.embed_proj = nnx.List([lin(H + G, E, axes=("head_embed", "head_in")), SiLU(),
                                        lin(E, cfg.draft_vocab, axes=("vocab", "head_embed"))])
        else:
            self.prefix_gru = None
            self.embed_proj = None
        self.markov_head = (MarkovHead(cfg.vocab_size, cfg.draft_vocab, cfg.markov_rank,
                                       dtype=dtype, rngs=rngs)
                            if cfg.is_dspark else None)
        self.confidence_head = (ConfidenceHead(cfg.confidence_width, dtype=dtype, rngs=rngs)
                                if cfg.confidence_head else None)
        self.candidate_selector = (CandidateSelector(cfg.vocab_size, H, cfg.selector_rank,
                                                     dtype=dtype, rngs=rngs)
                                   if cfg.is_dflash2 else None)
        # until a checkpoint or a training run fills it: the |D| lowest ids
        self.d2t = (None if cfg.draft_vocab_size is None
                    else draft_vocab_variable(jnp.arange(cfg.draft_vocab_size, dtype=jnp.int32)))

    @property
    def dtype(self):
        return self.fc.weight[...].dtype

    def _rope(self, positions_BT):
        cfg = self.cfg
        inv_freq, scale = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling,
                                        cfg.max_position_embeddings)
        return rope_cos_sin(positions_BT, inv_freq, scale)

    # ------------------------------------------------------------------ context
    def extend_context(self, ctx: DrafterContext, feats_BTF, positions_BT, start_B,
                       num_new_B) -> DrafterContext:
        """Write the context K/V of ``T`` new tokens at positions ``start_b …`` (``F = nT*H``).

        Only the first ``num_new_b`` rows of each batch row count: ``length = start + num_new``;
        the others are never written, nor are rows that a later one in the same write would
        displace from the ring (``t < num_new - S``). ``context_rows`` + ``write_context``.
        """
        k_rows, v_rows = self.context_rows(feats_BTF, positions_BT)
        return self.write_context(ctx, k_rows, v_rows, start_B, num_new_B)

    def context_rows(self, feats_BTF, positions_BT):
        """The context K/V of ``T`` tokens from their tapped target features: per drafter layer
        ``[B, T, K, D]`` (``fc`` + norm, then each layer's key/value projections)."""
        x_BTH = self.hidden_norm(self.fc(feats_BTF))
        cos, sin = self._rope(positions_BT)
        kv = [layer.self_attn.keys_values(x_BTH, cos, sin) for layer in self.layers]
        return tuple(k for k, _ in kv), tuple(v for _, v in kv)

    def write_context(self, ctx: DrafterContext, k_rows, v_rows, start_B,
                      num_new_B) -> DrafterContext:
        """Write ``context_rows`` output at positions ``start_b …`` (see ``extend_context``)."""
        S, t_1T = ctx.max_len, jnp.arange(k_rows[0].shape[1])[None]
        keep_BT = (t_1T < num_new_B[:, None]) & (t_1T >= num_new_B[:, None] - S)
        slots_BT = jnp.where(keep_BT, jnp.mod(start_B[:, None] + t_1T, S), S)  # S: dropped
        # one scatter per K and V into the stacked [L, B, S, K, D] ring (in place under jit;
        # writing each layer and stacking the results rebuilt the whole context every round)
        new_k = write_layers_at(ctx.k, as_stored(jnp.stack(k_rows), ctx.k.dtype), slots_BT)
        new_v = write_layers_at(ctx.v, as_stored(jnp.stack(v_rows), ctx.v.dtype), slots_BT)
        length = (start_B + num_new_B).astype(jnp.int32)
        return DrafterContext(new_k, new_v, length)

    # ------------------------------------------------------------------ block
    def draft(self, target, ctx: DrafterContext, t0_B, start_B, head_rows_CH=None):
        """One block forward → ``(z [B, J, H], base [B, J, V] float32)`` indexed by draft depth.

        ``target`` supplies ``embed`` and ``logits``; the block sits at absolute positions
        ``start_b … start_b + block_size - 1``. ``head_rows_CH``: ``head_rows(target)`` made
        once outside the loop that drafts (``base_logits``).
        """
        cfg = self.cfg
        Bs = cfg.block_size
        mask_id = cfg.mask_token_id
        batch = t0_B.shape[0]
        tokens_BT = jnp.concatenate(
            [t0_B[:, None].astype(jnp.int32),
             jnp.full((batch, Bs - 1), mask_id, jnp.int32)], axis=1)
        positions_BT = start_B[:, None] + jnp.arange(Bs, dtype=jnp.int32)[None, :]
        cos, sin = self._rope(positions_BT)
        S = ctx.max_len
        masks = {}  # window -> [B, T, S + T]: the visible context slots and the whole block
        for w in {cfg.layer_window(i) for i in range(cfg.num_hidden_layers)}:
            masks[w] = jnp.concatenate(
                [jnp.broadcast_to(ctx.visible(w)[:, None, :], (batch, Bs, S)),
                 jnp.ones((batch, Bs, Bs), bool)], axis=-1)
        h_BTH = to_activation(target.embed(tokens_BT))   # float32 residual stream
        for i, layer in enumerate(self.layers):
            mask_BTS = masks[cfg.layer_window(i)]
            ctx_k, ctx_v = ctx.layer_kv(i)

            def attention(x_BTH, layer=layer, mask_BTS=mask_BTS, ctx_k=ctx_k, ctx_v=ctx_v):
                q_BTQD = layer.self_attn.queries(x_BTH, cos, sin)
                k_BTKD, v_BTKD = layer.self_attn.keys_values(x_BTH, cos, sin)
                # the block's K/V in the context's dtype (products read both alike)
                k_all = jnp.concatenate([ctx_k, k_BTKD.astype(ctx.dtype)], axis=1)
                v_all = jnp.concatenate([ctx_v, v_BTKD.astype(ctx.dtype)], axis=1)
                return layer.self_attn.output(attend(q_BTQD, k_all, v_all, mask_BTS))

            x_BTH = layer.input_layernorm(h_BTH)
            x2_fn = layer.mlp
            if layer.attention_conv is None:
                h_BTH = h_BTH + attention(x_BTH)
            else:   # DFlash2: each sublayer between two in-block convolutions
                h_BTH = h_BTH + layer.attention_conv.around(attention, x_BTH)
                x2_fn = functools.partial(layer.mlp_conv.around, layer.mlp)
            h_BTH = h_BTH + x2_fn(layer.post_attention_layernorm(h_BTH))
        z_BTH = self.norm(h_BTH)
        z_BJH = z_BTH if cfg.shift_label else z_BTH[:, 1:]
        return z_BJH, self.base_logits(target, z_BJH, head_rows_CH)

    def head_rows(self, target):
        """``[C, H]``: the target's LM-head rows of the draft vocabulary (None without one).
        A loop that drafts inside a ``lax.cond`` (``budget="auto"``) gathers them once before
        it and passes them to ``draft``: XLA does not hoist work out of a conditional, and the
        gather (16k x 576 floats for SmolLM2) cost ~1.4 AR steps a drafted round."""
        return None if self.d2t is None else gather_rows(target.head_weight_VH, self.d2t[...])

    def base_logits(self, target, z_sH, head_rows_CH=None):
        """float32 base logits ``[..., |D|]``: the target's LM head over the draft vocabulary
        (all of it without a draft vocabulary); ``head_rows_CH``: ``head_rows(target)``, made
        beforehand (else gathered here)."""
        if self.d2t is None:
            return target.logits(z_sH)
        rows_CH = self.head_rows(target) if head_rows_CH is None else head_rows_CH
        return matmul_t(z_sH, rows_CH).astype(jnp.float32)

    def to_target(self, tokens_s):
        """Target ids of draft-vocabulary ``tokens`` (the identity without a draft vocabulary)."""
        return tokens_s if self.d2t is None else jnp.take(self.d2t[...], tokens_s, axis=0)

    # ------------------------------------------------------------------ Domino head
    def head_weights(self, target) -> DominoHeadWeights:
        """The Domino head's weights, with the target's token embedding the GRU reads."""
        if not self.cfg.is_domino:
            raise ConfigError("the Domino head needs a drafter with projector_type='domino'")
        return DominoHeadWeights(target.embed_tokens.weight[...], self.prefix_gru.weight_ih_l0[...],
                                 self.prefix_gru.weight_hh_l0[...], self.embed_proj[0].weight[...],
                                 self.embed_proj[2].weight[...],
                                 None if self.d2t is None else self.d2t[...])


    # ------------------------------------------------------------------ DFlash2's selector
    def selector_weights(self) -> SelectorWeights:
        """The path selector's weights (``selector_head.py``)."""
        if self.candidate_selector is None:
            raise ConfigError("the path selector needs a DFlash2 drafter (selector_rank > 0)")
        sel = self.candidate_selector
        return SelectorWeights(sel.predecessor_codebook[...], sel.successor_codebook[...],
                               sel.hidden_projection.weight[...])

    # ------------------------------------------------------------------ DSpark heads
    def markov_weights(self) -> MarkovHeadWeights:
        """The Markov head's weights (``markov_head.py``)."""
        if self.markov_head is None:
            raise ConfigError("the Markov head needs a DSpark drafter (markov_rank > 0)")
        return MarkovHeadWeights(self.markov_head.markov_w1.weight[...],
                                 self.markov_head.markov_w2.weight[...],
                                 None if self.d2t is None else self.d2t[...])

    def confidence(self, z_sJH, prev_sJ):
        """``[..., J]`` float32 confidence logits of the depths whose final-normed states are
        ``z`` and whose previous tokens are ``prev`` (the anchor, then the drafted tokens):
        ``sigmoid`` = the estimated acceptance of each depth given the ones before it."""
        if self.confidence_head is None:
            raise ConfigError("this drafter has no confidence head (enable_confidence_head)")
        e_sJr = (markov_rows(self.markov_weights(), prev_sJ)
                 if self.cfg.confidence_with_markov else None)
        proj = self.confidence_head.proj
        return confidence_logits(ConfidenceWeights(proj.weight[...], proj.bias[...]), z_sJH,
                                 e_sJr)


# ---------------------------------------------------------------------- params

@functools.lru_cache(maxsize=None)
def drafter_graphdef(cfg: DrafterConfig, dtype_name: str = "float32",
                     operand_name: str | None = None):
    """(graphdef, abstract state) of a ``Drafter`` for ``cfg``: no arrays are allocated."""
    abstract = nnx.eval_shape(lambda: Drafter(cfg, dtype=jnp.dtype(dtype_name),
                                              operand_dtype=operand_name, rngs=nnx.Rngs(0)))
    return nnx.split(abstract)


def bind_drafter(cfg: DrafterConfig, params) -> Drafter:
    """A ``Drafter`` over the parameter pytree ``params`` (an ``nnx.State``); jit-safe."""
    graphdef, _ = drafter_graphdef(cfg, params_precision(params, "drafter parameters"))
    return nnx.merge(graphdef, params)


def bind_drafter_float32_view(cfg: DrafterConfig, params) -> Drafter:
    """The drafter over the float32 view of 16-bit ``params`` (``precision.float32_view``),
    its ``Linear`` products rounding their input to that precision first: what the plain steps
    of ``budget="auto"`` run for the context rows of a kept token (``context_rows``), with the
    weights' upcast made once before the loop (``model.target.bind_float32_view`` is the
    target's). The Domino head reads its raw weights, so drafting stays on ``bind_drafter``.
    Float32 ``params``: ``bind_drafter``. jit-safe."""
    name = params_precision(params, "drafter parameters")
    if name == "float32":
        return bind_drafter(cfg, params)
    graphdef, _ = drafter_graphdef(cfg, "float32", name)
    return nnx.merge(graphdef, float32_view(params))


def init_drafter_params(cfg: DrafterConfig, seed: int = 0, dtype=jnp.float32, d2t=None):
    """Random parameters (tests, examples); ``d2t``: the draft vocabulary's target ids (for a
    ``cfg`` with ``draft_vocab_size``; default its lowest ids)."""
    params = nnx.state(Drafter(cfg, dtype=dtype, rngs=nnx.Rngs(seed)))
    return params if d2t is None else with_draft_vocab(cfg, params, d2t)


def restrict_to_draft_vocab(cfg: DrafterConfig, params, d2t):
    """A full-vocabulary drafter as a draft-vocabulary one over ``d2t``: ``(cfg, params)`` whose
    base logits and corrections are the original's columns ``d2t`` exactly (``W2``'s rows
    gathered). What a draft vocabulary changes at decode time, on the same drafter."""
    import dataclasses
    if cfg.draft_vocab_size is not None:
        raise ConfigError("this drafter has a draft vocabulary already")
    ids = check_draft_vocab(d2t, cfg.vocab_size)
    new_cfg = dataclasses.replace(cfg, draft_vocab_size=len(ids))
    _, abstract = drafter_graphdef(new_cfg, params_precision(params, "drafter parameters"))
    pure = nnx.to_pure_dict(params)
    if cfg.is_domino:
        pure["embed_proj"][2]["weight"] = jnp.asarray(pure["embed_proj"][2]["weight"])[ids]
    if cfg.is_dspark:
        w2 = pure["markov_head"]["markov_w2"]["weight"]
        pure["markov_head"]["markov_w2"]["weight"] = jnp.asarray(w2)[ids]
    pure["d2t"] = jnp.asarray(ids)
    state = jax.tree.map(lambda x: x, abstract)
    nnx.replace_by_pure_dict(state, pure)
    return new_cfg, state


def with_draft_vocab(cfg: DrafterConfig, params, d2t):
    """``params`` with its draft-to-target map replaced by ``d2t`` (checked:
    ``check_draft_vocab``)."""
    if cfg.draft_vocab_size is None:
        raise ConfigError("this drafter has no draft vocabulary (draft_vocab_size is None)")
    ids = check_draft_vocab(d2t, cfg.vocab_size, cfg.draft_vocab_size)
    params = jax.tree.map(lambda x: x, params)
    params["d2t"] = draft_vocab_variable(jnp.asarray(ids))
    return params
