"""The DFlash drafter backbone (SPEC §2) and the Domino head's chain decoding (SPEC §3).

The drafter is a few Qwen3 layers at the target's hidden size with no embedding or LM head of
its own: block tokens are embedded with the target's ``embed_tokens`` and logits come from the
target's head. Attribute names are the checkpoint's key names (``fc.weight``,
``layers.0.self_attn.q_proj.weight``, ``prefix_gru.weight_ih_l0``, ``embed_proj.2.weight`` …).

Context. Each committed token's tapped target features ``[nT*H]`` are projected
(``fc`` → ``hidden_norm``) and every layer turns them into its own K/V with its own
``k_proj``/``k_norm``/``v_proj`` and RoPE at the token's absolute position. These rows live in a
``DrafterContext`` (row ``s`` = absolute position ``s``) and are extended once per round.

Block. ``[t0, MASK, …, MASK]`` (``block_size`` slots at positions ``start …``) attends,
non-causally, to the committed context rows and to the whole block. The final-normed hidden
states ``z`` and the float32 base logits are returned per tree depth (``shift_label`` decides
which slots those are).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from dominotree_jax.config import ConfigError, DrafterConfig, TargetConfig
from dominotree_jax.model.cache import write_rows
from dominotree_jax.model.domino_head import corrected_logits, gru_step
from dominotree_jax.model.layers import (Attention, Linear, RMSNorm, SwiGLU, attend, rope_cos_sin,
                                         rope_inv_freq)


class DrafterContext(NamedTuple):
    """Cached context K/V of the drafter layers; rows at or beyond ``length`` are never read."""
    k: jax.Array       # [Ld, B, S, Kh, D]
    v: jax.Array       # [Ld, B, S, Kh, D]
    length: jax.Array  # [B] int32: committed rows (row s holds absolute position s)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @classmethod
    def zeros(cls, cfg: DrafterConfig, batch: int, max_len: int, dtype=jnp.float32):
        shape = (cfg.num_hidden_layers, batch, max_len, cfg.num_key_value_heads, cfg.head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype),
                   jnp.zeros((batch,), jnp.int32))


class DrafterLayer(nnx.Module):
    """A Qwen3 decoder layer (q/k RMSNorm, no qkv bias)."""

    def __init__(self, cfg: DrafterConfig, *, dtype, rngs: nnx.Rngs):
        H = cfg.hidden_size
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps, dtype=dtype)
        self.self_attn = Attention(H, cfg.num_attention_heads, cfg.num_key_value_heads,
                                   cfg.head_dim, qk_norm=True, bias=False, eps=cfg.rms_norm_eps,
                                   dtype=dtype, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps, dtype=dtype)
        self.mlp = SwiGLU(H, cfg.intermediate_size, dtype=dtype, rngs=rngs)


class PrefixGRU(nnx.Module):
    """Bias-free single-layer GRU weights in PyTorch layout (gate order r, z, n)."""

    def __init__(self, hidden: int, state: int, *, dtype, rngs: nnx.Rngs):
        std = 0.02
        self.weight_ih_l0 = nnx.Param(std * jax.random.normal(rngs.params(), (3 * state, hidden),
                                                              dtype))
        self.weight_hh_l0 = nnx.Param(std * jax.random.normal(rngs.params(), (3 * state, state),
                                                              dtype))


class SiLU(nnx.Module):
    """Parameter-free slot 1 of ``embed_proj`` (Linear, SiLU, Linear), kept for the key names."""


class Drafter(nnx.Module):
    def __init__(self, cfg: DrafterConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
        self.cfg = cfg
        H = cfg.hidden_size
        self.fc = Linear(cfg.num_taps * H, H, dtype=dtype, rngs=rngs)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps, dtype=dtype)
        self.layers = nnx.List([DrafterLayer(cfg, dtype=dtype, rngs=rngs)
                                for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(H, cfg.rms_norm_eps, dtype=dtype)
        if cfg.is_domino:
            G, E = cfg.gru_hidden_dim, cfg.emb_dim
            self.prefix_gru = PrefixGRU(H, G, dtype=dtype, rngs=rngs)
            self.embed_proj = nnx.List([Linear(H + G, E, dtype=dtype, rngs=rngs), SiLU(),
                                        Linear(E, cfg.vocab_size, dtype=dtype, rngs=rngs)])
        else:
            self.prefix_gru = None
            self.embed_proj = None

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
        """Write the context K/V of ``T`` new tokens at rows ``start_b …`` (``F = nT*H``).

        Only the first ``num_new_b`` rows of each batch row count: ``length = start + num_new``.
        ``start_b + T`` must not exceed ``ctx.max_len`` (the write would be clamped).
        """
        x_BTH = self.hidden_norm(self.fc(feats_BTF.astype(self.dtype)))
        cos, sin = self._rope(positions_BT)
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            k_BTKD, v_BTKD = layer.self_attn.keys_values(x_BTH, cos, sin)
            new_k.append(write_rows(ctx.k[i], k_BTKD, start_B))
            new_v.append(write_rows(ctx.v[i], v_BTKD, start_B))
        length = (start_B + num_new_B).astype(jnp.int32)
        return DrafterContext(jnp.stack(new_k), jnp.stack(new_v), length)

    # ------------------------------------------------------------------ block
    def draft(self, target, ctx: DrafterContext, t0_B, start_B, mask_token_id=None):
        """One block forward → ``(z [B, K, H], base [B, K, V] float32)`` indexed by tree depth.

        ``target`` supplies ``embed`` and ``logits``; the block sits at absolute positions
        ``start_b … start_b + block_size - 1``; ``mask_token_id`` defaults to the config's.
        """
        cfg = self.cfg
        Bs = cfg.block_size
        mask_id = cfg.mask_token_id if mask_token_id is None else mask_token_id
        batch = t0_B.shape[0]
        tokens_BT = jnp.concatenate(
            [t0_B[:, None].astype(jnp.int32),
             jnp.full((batch, Bs - 1), mask_id, jnp.int32)], axis=1)
        positions_BT = start_B[:, None] + jnp.arange(Bs, dtype=jnp.int32)[None, :]
        cos, sin = self._rope(positions_BT)
        S = ctx.max_len
        ctx_visible_BS = jnp.arange(S)[None, :] < ctx.length[:, None]
        mask_BTS = jnp.concatenate(
            [jnp.broadcast_to(ctx_visible_BS[:, None, :], (batch, Bs, S)),
             jnp.ones((batch, Bs, Bs), bool)], axis=-1)
        h_BTH = target.embed(tokens_BT).astype(self.dtype)
        for i, layer in enumerate(self.layers):
            x_BTH = layer.input_layernorm(h_BTH)
            q_BTND = layer.self_attn.queries(x_BTH, cos, sin)
            k_BTKD, v_BTKD = layer.self_attn.keys_values(x_BTH, cos, sin)
            k_all = jnp.concatenate([ctx.k[i].astype(k_BTKD.dtype), k_BTKD], axis=1)
            v_all = jnp.concatenate([ctx.v[i].astype(v_BTKD.dtype), v_BTKD], axis=1)
            h_BTH = h_BTH + layer.self_attn.output(attend(q_BTND, k_all, v_all, mask_BTS))
            h_BTH = h_BTH + layer.mlp(layer.post_attention_layernorm(h_BTH))
        z_BTH = self.norm(h_BTH)
        z_BKH = z_BTH if cfg.shift_label else z_BTH[:, 1:]
        head_dtype = target.head_weight_VH.dtype
        base_BKV = target.logits(z_BKH.astype(head_dtype))
        return z_BKH, base_BKV

    # ------------------------------------------------------------------ Domino head
    def gru_init(self, target, t0_B):
        """The root's GRU state: ``GRU(embed(t0), 0)`` → ``[B, G]``."""
        x_BH = target.embed(t0_B).astype(self.dtype)
        s0 = jnp.zeros((t0_B.shape[0], self.cfg.gru_hidden_dim), self.dtype)
        return self.gru_advance(x_BH, s0)

    def gru_advance(self, x_sH, s_sG):
        return gru_step(x_sH, s_sG, self.prefix_gru.weight_ih_l0[...],
                        self.prefix_gru.weight_hh_l0[...])

    def correct(self, base_sV, z_sH, s_sG):
        """Full-vocabulary corrected logits ``base + W2 · SiLU(W1 · [z ; s])`` (float32)."""
        return corrected_logits(base_sV, z_sH, s_sG, self.embed_proj[0].weight[...],
                                self.embed_proj[2].weight[...]).astype(jnp.float32)

    def domino_chain(self, target, z_BKH, base_BKV, t0_B, prefix_len=None):
        """Greedy Domino chain → ``(tokens [B, K] int32, logprobs [B, K] float32)``.

        Depths ``< prefix_len`` use ``base``; later depths use the corrected logits with the GRU
        state after ``t0`` and the chain's earlier tokens. Log-probs are under the distribution
        used at that depth.
        """
        if not self.cfg.is_domino:
            raise ConfigError("domino_chain needs a drafter with projector_type='domino'")
        P = self.cfg.pure_draft_prefix_len if prefix_len is None else prefix_len
        K = z_BKH.shape[1]

        def step(s_BG, xs):
            d, z_BH, base_BV = xs
            logits = jnp.where(d < P, base_BV, self.correct(base_BV, z_BH, s_BG))
            tok_B, lp_B = _greedy(logits)
            s_BG = self.gru_advance(target.embed(tok_B).astype(self.dtype), s_BG)
            return s_BG, (tok_B, lp_B)

        xs = (jnp.arange(K), jnp.swapaxes(z_BKH, 0, 1), jnp.swapaxes(base_BKV, 0, 1))
        _, (tok_KB, lp_KB) = jax.lax.scan(step, self.gru_init(target, t0_B), xs)
        return tok_KB.T, lp_KB.T


def _greedy(logits_sV):
    """argmax token and its log-softmax value (float32)."""
    logits = logits_sV.astype(jnp.float32)
    tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    lp = jnp.max(logits, axis=-1) - jax.nn.logsumexp(logits, axis=-1)
    return tok, lp


def dflash_chain(base_BKV):
    """Greedy DFlash chain: argmax of ``base`` per depth → ``(tokens, logprobs)``, both [B, K]."""
    return _greedy(base_BKV)


# ---------------------------------------------------------------------- params and checks

@functools.lru_cache(maxsize=None)
def drafter_graphdef(cfg: DrafterConfig, dtype_name: str = "float32"):
    """(graphdef, abstract state) of a ``Drafter`` for ``cfg``: no arrays are allocated."""
    abstract = nnx.eval_shape(lambda: Drafter(cfg, dtype=jnp.dtype(dtype_name),
                                              rngs=nnx.Rngs(0)))
    return nnx.split(abstract)


def bind_drafter(cfg: DrafterConfig, params) -> Drafter:
    """A ``Drafter`` over the parameter pytree ``params`` (an ``nnx.State``); jit-safe."""
    leaves = jax.tree.leaves(params)
    dtype_name = jnp.dtype(leaves[0].dtype).name if leaves else "float32"
    graphdef, _ = drafter_graphdef(cfg, dtype_name)
    return nnx.merge(graphdef, params)


def init_drafter_params(cfg: DrafterConfig, seed: int = 0, dtype=jnp.float32):
    """Random parameters (tests, examples)."""
    return nnx.state(Drafter(cfg, dtype=dtype, rngs=nnx.Rngs(seed)))


def drafter_problems(cfg: DrafterConfig, target_cfg: TargetConfig | None = None) -> list[str]:
    """Every reason ``cfg`` cannot draft (for ``target_cfg``, when given), one line each."""
    problems = []
    if target_cfg is not None and cfg.hidden_size != target_cfg.hidden_size:
        problems.append(f"hidden size differs: drafter {cfg.hidden_size}, target "
                        f"{target_cfg.hidden_size}")
    if target_cfg is not None and cfg.vocab_size != target_cfg.vocab_size:
        problems.append(f"vocab size differs: drafter {cfg.vocab_size}, target "
                        f"{target_cfg.vocab_size}")
    if target_cfg is not None:
        L = target_cfg.num_hidden_layers
        bad = [i for i in cfg.target_layer_ids if not 0 <= i < L]
        if bad:
            problems.append(f"tap layer(s) {bad} outside the target's {L} layers "
                            f"(target_layer_ids={list(cfg.target_layer_ids)})")
    vocab = min(cfg.vocab_size, target_cfg.vocab_size) if target_cfg else cfg.vocab_size
    if not 0 <= cfg.mask_token_id < vocab:
        problems.append(f"mask_token_id={cfg.mask_token_id} is outside the vocabulary "
                        f"[0, {vocab})")
    if cfg.block_size < 2:
        problems.append(f"block_size={cfg.block_size} is too small: a block needs t0 and at "
                        "least one MASK slot (block_size >= 2)")
    if cfg.is_domino and not 0 <= cfg.pure_draft_prefix_len <= cfg.num_draft_positions:
        problems.append(f"pure_draft_prefix_len={cfg.pure_draft_prefix_len} is outside "
                        f"[0, {cfg.num_draft_positions}]")
    return problems


def check_drafter(cfg: DrafterConfig) -> None:
    """Raise ``ConfigError`` naming every reason the drafter cannot draft at all."""
    problems = drafter_problems(cfg)
    if problems:
        raise ConfigError("invalid drafter config:\n  " + "\n  ".join(problems))


def check_pair(target_cfg: TargetConfig, drafter_cfg: DrafterConfig) -> None:
    """Raise ``ConfigError`` naming every reason the drafter cannot serve this target."""
    problems = drafter_problems(drafter_cfg, target_cfg)
    if problems:
        raise ConfigError("drafter does not fit the target:\n  " + "\n  ".join(problems))
