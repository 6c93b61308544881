"""Base-anchored curriculum loss for a Domino drafter (docs/algorithm.md §6), on the inference
code path.

A batch holds whole sequences (tokens and tapped target features) and anchor positions. Each
sequence's drafter context K/V is built once with ``Drafter.extend_context`` over all its
positions; every anchor ``a`` then drafts one block with ``ctx.length = a`` — queries see the
context rows ``< a`` only, plus their own block (``Drafter.draft``'s mask) — exactly what
inference does after committing ``x_0 … x_{a-1}`` with bonus token ``x_a``.

The Domino head is teacher-forced: depth ``d`` uses the GRU state after ``x_a … x_{a+d}``.
Labels are ``x_{a+1} … x_{a+K}`` (``shift_label``). Depths ``< P`` use the base logits, as at
inference. Loss ``(1-λ)·CE(corrected) + λ·CE(base)``, per-depth weight ``exp(-d/γ)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dominotree_jax.config import DrafterConfig, TargetConfig
from dominotree_jax.domino_head import corrected_logits, gru_path_states
from dominotree_jax.model.drafter import DrafterContext, bind_drafter, drafter_graphdef
from dominotree_jax.linalg import matmul_t
from dominotree_jax.model.state import state_from_flat
from dominotree_jax.model.target import bind_target


class _SubsetHead:
    """The target's embedding with its LM head restricted to the rows ``vocab_ids``: what
    ``Drafter.draft`` needs from a target (``embed``, ``logits``, ``head_weight_VH``)."""

    def __init__(self, target, vocab_ids):
        self._target = target
        self.head_weight_VH = jnp.take(target.head_weight_VH, vocab_ids, axis=0)

    def embed(self, tokens):
        return self._target.embed(tokens)

    def logits(self, hidden_sH):
        return matmul_t(hidden_sH, self.head_weight_VH).astype(jnp.float32)


def flat_to_state(cfg: DrafterConfig, flat: dict):
    """An ``nnx.State`` for ``cfg`` from ``{dotted.name: array}`` (jit-safe)."""
    _, abstract = drafter_graphdef(cfg, "float32")
    return state_from_flat(abstract, flat)


def curriculum_lambda(step, total_steps: int):
    """λ: 1 → 0 linearly over the first half of training, then 0."""
    half = max(1.0, total_steps / 2)
    return jnp.clip(1.0 - jnp.asarray(step, jnp.float32) / half, 0.0, 1.0)


def depth_weights(K: int, gamma: float | None):
    d = jnp.arange(K, dtype=jnp.float32)
    return jnp.ones((K,), jnp.float32) if not gamma else jnp.exp(-d / gamma)


def block_logits(dcfg: DrafterConfig, tcfg: TargetConfig, dparams, tparams, batch,
                 vocab_ids=None):
    """``(base [N, K, V], corrected [N, K, V], targets [N, K])`` with ``N = B·A`` blocks.

    With ``vocab_ids [Va]`` the logits are computed over those vocabulary rows only (column
    ``j`` is token ``vocab_ids[j]``; targets stay token ids): the full-vocabulary LM head is
    the dominant training cost on a CPU.
    """
    drafter = bind_drafter(dcfg, dparams)
    target = bind_target(tcfg, jax.lax.stop_gradient(tparams))
    head = target if vocab_ids is None else _SubsetHead(target, vocab_ids)
    tokens, feats = batch["tokens"], batch["feats"]
    anchors, labels = batch["anchors"], batch["labels"]
    B, W = tokens.shape
    A = anchors.shape[1]
    K = dcfg.num_draft_positions
    ctx = DrafterContext.zeros(dcfg, B, W)
    pos = jnp.broadcast_to(jnp.arange(W, dtype=jnp.int32), (B, W))
    ctx = drafter.extend_context(ctx, feats, pos, jnp.zeros((B,), jnp.int32),
                                 jnp.full((B,), W, jnp.int32))
    a_N = anchors.reshape(-1).astype(jnp.int32)
    ctx_N = DrafterContext(jnp.repeat(ctx.k, A, axis=1), jnp.repeat(ctx.v, A, axis=1), a_N)
    lab = labels.reshape(B * A, -1)
    t0 = jnp.maximum(lab[:, 0], 0)
    z, base = drafter.draft(head, ctx_N, t0, a_N)
    if dcfg.is_domino:
        domino = drafter.head_weights(target)
        inp = jnp.maximum(lab[:, :K], 0)                         # x_a … x_{a+K-1}
        states = gru_path_states(domino, inp, drafter.dtype)      # [N, K, G]
        w2 = domino.proj_w2 if vocab_ids is None else jnp.take(domino.proj_w2, vocab_ids, axis=0)
        corr = corrected_logits(base, z, states, domino.proj_w1, w2).astype(jnp.float32)
        P = dcfg.pure_draft_prefix_len
        corr = jnp.where((jnp.arange(K) < P)[None, :, None], base, corr)
    else:
        corr = base
    return base, corr, lab[:, 1:K + 1]


def _ce(logits, tgt):
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, jnp.maximum(tgt, 0)[..., None], axis=-1)[..., 0]
    return lse - picked


def leading_correct(correct_NK, valid_NK):
    """Number of leading correct depths per block (stops at the first wrong or invalid)."""
    ok = (correct_NK & valid_NK).astype(jnp.int32)
    return jnp.sum(jnp.cumprod(ok, axis=1), axis=1)


def target_soft_logits(tcfg: TargetConfig, tparams, batch, vocab_ids=None):
    """The target's next-token logits at each label's position ``[N, K, V]`` (``soft_pos``;
    from the stored final hidden states through the target's own LM head)."""
    target = bind_target(tcfg, jax.lax.stop_gradient(tparams))
    hidden, pos = batch["hidden"], batch["soft_pos"]
    B, A, K = pos.shape
    h = jnp.take_along_axis(hidden[:, None, :, :],
                            jnp.maximum(pos, 0).reshape(B, 1, A * K, 1), axis=2)
    h = h.reshape(B * A, K, -1)
    head = target if vocab_ids is None else _SubsetHead(target, vocab_ids)
    return jax.lax.stop_gradient(head.logits(h.astype(target.embed_tokens.weight[...].dtype)))


def _soft_ce(logits, p_target):
    return -jnp.sum(p_target * jax.nn.log_softmax(logits, axis=-1), axis=-1)


def loss_and_metrics(dcfg: DrafterConfig, tcfg: TargetConfig, dparams, tparams, batch, lam,
                     gamma: float | None = 7.0, vocab_ids=None, vocab_index=None,
                     soft: float = 0.0):
    """Curriculum loss and metrics. ``vocab_ids``/``vocab_index`` (token → column or -1, [V])
    restrict the softmax to a vocabulary subset (labels outside it are ignored). ``soft`` mixes
    in soft targets: each head's loss is ``(1-soft)·CE(label) + soft·CE(target distribution)``
    (needs ``batch["hidden"]`` and ``batch["soft_pos"]``)."""
    base, corr, tgt = block_logits(dcfg, tcfg, dparams, tparams, batch, vocab_ids)
    if vocab_ids is not None:
        tgt = jnp.where(tgt >= 0, vocab_index[jnp.maximum(tgt, 0)], -1)
    K = tgt.shape[1]
    valid = tgt >= 0
    vf = valid.astype(jnp.float32)
    w = depth_weights(K, gamma)[None, :] * vf
    ce_b, ce_c = _ce(base, tgt), _ce(corr, tgt)
    hb, hc = ce_b, ce_c
    if soft:
        p_t = jax.nn.softmax(target_soft_logits(tcfg, tparams, batch, vocab_ids), axis=-1)
        hb = (1.0 - soft) * ce_b + soft * _soft_ce(base, p_t)
        hc = (1.0 - soft) * ce_c + soft * _soft_ce(corr, p_t)
    loss = jnp.sum(w * ((1.0 - lam) * hc + lam * hb)) / jnp.maximum(jnp.sum(w), 1.0)
    n_d = jnp.maximum(jnp.sum(vf, axis=0), 1.0)
    acc_b = (jnp.argmax(base, -1) == tgt) & valid
    acc_c = (jnp.argmax(corr, -1) == tgt) & valid
    full = jnp.all(valid, axis=1)  # blocks whose K labels all exist
    metrics = {
        "loss": loss,
        "base_loss": jnp.sum(vf * ce_b) / jnp.maximum(jnp.sum(vf), 1.0),
        "corr_loss": jnp.sum(vf * ce_c) / jnp.maximum(jnp.sum(vf), 1.0),
        "base_acc_d": jnp.sum(acc_b, axis=0) / n_d,   # [K]
        "corr_acc_d": jnp.sum(acc_c, axis=0) / n_d,   # [K]
        # Greedy chain acceptance (τ = leading correct depths + 1) on full blocks: teacher
        # forcing equals the chain while the chain is right, so this is the offline chain τ.
        "tau_base": 1.0 + jnp.sum(jnp.where(full, leading_correct(acc_b, valid), 0))
        / jnp.maximum(jnp.sum(full), 1),
        "tau_corr": 1.0 + jnp.sum(jnp.where(full, leading_correct(acc_c, valid), 0))
        / jnp.maximum(jnp.sum(full), 1),
        "num_labels": jnp.sum(vf),
    }
    return loss, metrics
