"""Base-anchored curriculum loss for a Domino drafter (docs/algorithm.md §6), on the inference
code path.

A batch holds whole sequences (tokens and tapped target features) and anchor positions. Each
sequence's drafter context K/V is built once with ``Drafter.extend_context`` over all its
positions; every anchor ``a`` then drafts one block with ``ctx.length = a`` — queries see the
context rows ``< a`` only, plus their own block (``Drafter.draft``'s mask) — exactly what
inference does after committing ``x_0 … x_{a-1}`` with bonus token ``x_a``.

The Domino head is teacher-forced: depth ``d`` uses the GRU state after ``x_a … x_{a+d}``.
Labels are ``x_{a+1} … x_{a+J}`` (``shift_label``). Depths ``< prefix_len`` use the base
logits, as at inference. Loss ``(1-λ)·CE(corrected) + λ·CE(base)``, per-depth weight
``exp(-d/γ)``.

A DSpark drafter (docs/algorithm.md §3b) is teacher-forced the same way: depth ``d``'s Markov
correction reads the true previous token ``x_{a+d}``. Its corrected head's term is the published
mix (``DSparkLoss``): ``ce·CE + l1·‖softmax(corrected) − p_target‖₁ + confidence·BCE(conf, α)``
with ``α = 1 − ½‖…‖₁`` (not differentiated) the depth's acceptance if the draft were sampled,
``p_target`` the target's distribution from the stored final hidden states (over the loss's
columns: a vocabulary subset or draft vocabulary renormalises it).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dominotree_jax.config import DrafterConfig, TargetConfig
from dominotree_jax.domino_head import corrected_logits, gather_rows, gru_path_states
from dominotree_jax.markov_head import markov_bias, markov_rows
from dominotree_jax.selector_head import selector_scores
from dominotree_jax.model.drafter import DrafterContext, bind_drafter
from dominotree_jax.linalg import matmul_t
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


def draft_column_index(d2t_D, vocab_size: int):
    """``[V]`` int32: the draft-vocabulary column of each target id, -1 outside ``D``."""
    return jnp.full((vocab_size,), -1, jnp.int32).at[d2t_D].set(
        jnp.arange(d2t_D.shape[0], dtype=jnp.int32))


def curriculum_lambda(step, total_steps: int, hold: float = 0.0, ramp: float = 0.5,
                      end: float = 0.0):
    """λ of the base-anchored curriculum (docs/algorithm.md §6): 1 for the first ``hold``
    fraction of the steps (the backbone / base distribution alone), then linear down to
    ``end`` over the next ``ramp`` fraction, then ``end``. The defaults (no hold, ramp over the
    first half, end 0) are the original schedule: 1 → 0 over the first half."""
    t = jnp.asarray(step, jnp.float32)
    h = hold * total_steps
    r = max(1.0, ramp * total_steps)
    frac = jnp.clip((t - h) / r, 0.0, 1.0)
    return jnp.float32(1.0) - (1.0 - end) * frac


def depth_weights(J: int, gamma: float | None):
    d = jnp.arange(J, dtype=jnp.float32)
    return jnp.ones((J,), jnp.float32) if not gamma else jnp.exp(-d / gamma)


def anchored_blocks(drafter, dcfg: DrafterConfig, batch):
    """The drafter inputs of every block of ``batch`` as inference sees them:
    ``(ctx_A, t0 [B·A], anchors [B·A], labels [B·A, J+1])``, the ``B·A`` blocks flattened into
    one axis (the context of each sequence extended over its features, repeated for each of its
    ``A`` anchors)."""
    feats, anchors, labels = batch["feats"], batch["anchors"], batch["labels"]
    B, W = batch["tokens"].shape
    A = anchors.shape[1]
    ctx = DrafterContext.zeros(dcfg, B, W)
    pos = jnp.broadcast_to(jnp.arange(W, dtype=jnp.int32), (B, W))
    ctx = drafter.extend_context(ctx, feats, pos, jnp.zeros((B,), jnp.int32),
                                 jnp.full((B,), W, jnp.int32))
    anchor_A = anchors.reshape(-1).astype(jnp.int32)
    ctx_A = DrafterContext(jnp.repeat(ctx.k, A, axis=1), jnp.repeat(ctx.v, A, axis=1), anchor_A)
    lab = labels.reshape(B * A, -1)
    return ctx_A, jnp.maximum(lab[:, 0], 0), anchor_A, lab


@dataclasses.dataclass(frozen=True)
class DSparkLoss:
    """The weights of a DSpark drafter's loss terms (DeepSpec's published defaults): the
    label's cross-entropy, the L1 distance to the target's distribution (twice the total
    variation) and the confidence head's binary cross-entropy."""
    ce: float = 0.1
    l1: float = 0.9
    confidence: float = 1.0


class Blocks(NamedTuple):
    """One batch's blocks as the loss reads them (``A`` = blocks, ``J`` = depths)."""
    base: jax.Array        # [A, J, V'] float32 base logits (V': the loss's columns)
    corr: jax.Array        # [A, J, V'] the corrected head's (the base where there is none)
    targets: jax.Array     # [A, J] label token ids (-1: none)
    z: jax.Array           # [A, J, H] final-normed states
    prev: jax.Array        # [A, J] the true previous token of each depth (x_a … x_{a+J-1})


def block_logits(dcfg: DrafterConfig, tcfg: TargetConfig, dparams, tparams, batch,
                 vocab_ids=None) -> Blocks:
    """``Blocks`` (base, corrected, targets ``[B·A, J]``, …) for the ``B·A`` blocks.

    With ``vocab_ids [Va]`` the logits are computed over those vocabulary rows only (column
    ``j`` is token ``vocab_ids[j]``; targets stay token ids): the full-vocabulary LM head is
    the dominant training cost on a CPU. A drafter with a draft vocabulary computes its own
    columns (``d2t``) and ignores ``vocab_ids``.
    """
    drafter = bind_drafter(dcfg, dparams)
    target = bind_target(tcfg, jax.lax.stop_gradient(tparams))
    if dcfg.draft_vocab_size is not None:   # the drafter's own columns: its draft vocabulary
        vocab_ids = None
    head = target if vocab_ids is None else _SubsetHead(target, vocab_ids)
    J = dcfg.num_draft_positions
    ctx_A, t0, anchor_A, lab = anchored_blocks(drafter, dcfg, batch)
    z, base = drafter.draft(head, ctx_A, t0, anchor_A)
    if dcfg.is_domino:
        domino = drafter.head_weights(target)
        inp = jnp.maximum(lab[:, :J], 0)                         # x_a … x_{a+J-1}
        states = gru_path_states(domino, inp, drafter.dtype)      # [B·A, J, G]
        w2 = domino.proj_w2 if vocab_ids is None else jnp.take(domino.proj_w2, vocab_ids, axis=0)
        corr = corrected_logits(base, z, states, domino.proj_w1, w2).astype(jnp.float32)
        prefix_len = dcfg.pure_draft_prefix_len
        corr = jnp.where((jnp.arange(J) < prefix_len)[None, :, None], base, corr)
    elif dcfg.is_dspark:
        markov = drafter.markov_weights()
        w2 = markov.w2 if vocab_ids is None else jnp.take(markov.w2, vocab_ids, axis=0)
        corr = base + markov_bias(markov._replace(w2=w2),
                                  markov_rows(markov, jnp.maximum(lab[:, :J], 0)))
    else:
        corr = base
    return Blocks(base, corr, lab[:, 1:J + 1], z, jnp.maximum(lab[:, :J], 0))


def _ce(logits, tgt):
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, jnp.maximum(tgt, 0)[..., None], axis=-1)[..., 0]
    return lse - picked


def leading_correct(correct_AJ, valid_AJ):
    """Number of leading correct depths per block (stops at the first wrong or invalid)."""
    ok = (correct_AJ & valid_AJ).astype(jnp.int32)
    return jnp.sum(jnp.cumprod(ok, axis=1), axis=1)


def target_soft_logits(tcfg: TargetConfig, tparams, batch, vocab_ids=None):
    """The target's next-token logits at each label's position ``[B·A, J, V]`` (``soft_pos``;
    from the stored final hidden states through the target's own LM head)."""
    target = bind_target(tcfg, jax.lax.stop_gradient(tparams))
    hidden, pos = batch["hidden"], batch["soft_pos"]
    B, A, J = pos.shape
    h = jnp.take_along_axis(hidden[:, None, :, :],
                            jnp.maximum(pos, 0).reshape(B, 1, A * J, 1), axis=2)
    h = h.reshape(B * A, J, -1)
    head = target if vocab_ids is None else _SubsetHead(target, vocab_ids)
    return jax.lax.stop_gradient(head.logits(h.astype(target.embed_tokens.weight[...].dtype)))


def _soft_ce(logits, p_target):
    return -jnp.sum(p_target * jax.nn.log_softmax(logits, axis=-1), axis=-1)


def topk_targets(batch, vocab_index=None):
    """The stored top-k target distribution of each label: ``(columns [B·A, J, k] int32, p
    [B·A, J, k] float32, has [B·A, J] bool)``. ``p`` is the softmax of the stored logits over the
    k entries (renormalised top-k); with a vocabulary subset (``vocab_index``) entries outside
    it are dropped before renormalising. ``has`` is False where nothing is stored."""
    ids, vals, pos = batch["topk_ids"], batch["topk_logits"], batch["soft_pos"]
    B, A, J = pos.shape
    k = ids.shape[-1]
    g = jnp.maximum(pos, 0).reshape(B, A * J, 1)
    ids_AJk = jnp.take_along_axis(ids, g, axis=1).reshape(B * A, J, k)
    vals_AJk = jnp.take_along_axis(vals.astype(jnp.float32), g, axis=1).reshape(B * A, J, k)
    ok = (ids_AJk >= 0) & (pos.reshape(B * A, J, 1) >= 0)
    if vocab_index is not None:
        ids_AJk = jnp.where(ok, vocab_index[jnp.maximum(ids_AJk, 0)], -1)
        ok = ok & (ids_AJk >= 0)
    p = jax.nn.softmax(jnp.where(ok, vals_AJk, -jnp.inf), axis=-1)
    has = jnp.any(ok, axis=-1)
    p = jnp.where(has[..., None] & ok, p, 0.0)
    return jnp.maximum(ids_AJk, 0), p, has


def _topk_kl(logits, cols, p, has):
    """``KL(p ‖ softmax(logits))`` over the top-k support (0 where ``has`` is False)."""
    logq = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), cols, axis=-1)
    plogp = jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0)
    return jnp.where(has, jnp.sum(plogp - p * logq, axis=-1), 0.0)


def until_fail_mask(correct_AJ, valid_AJ, floor: float = 0.0):
    """Accept-until-fail weights ``[B·A, J]``: 1 at every depth up to and including a block's
    first wrong (or missing) depth, ``floor`` after it. Depth ``d`` counts when depths
    ``0 … d-1`` were all right, i.e. when a greedy chain of this head would reach depth ``d``
    at inference. Not differentiated (argmax)."""
    ok = (correct_AJ & valid_AJ).astype(jnp.float32)
    reach = jnp.concatenate([jnp.ones_like(ok[:, :1]), jnp.cumprod(ok, axis=1)[:, :-1]], 1)
    return jax.lax.stop_gradient(reach + floor * (1.0 - reach))


def loss_and_metrics(dcfg: DrafterConfig, tcfg: TargetConfig, dparams, tparams, batch, lam,
                     gamma: float | None = 7.0, vocab_ids=None, vocab_index=None,
                     soft: float = 0.0, soft_topk: float = 0.0, until_fail: bool = False,
                     until_fail_floor: float = 0.0, dspark: DSparkLoss = DSparkLoss(),
                     selector_weight: float = 1.0, tv: float = 0.0):
    """Curriculum loss and metrics (docs/algorithm.md §6, docs/training.md).

    ``vocab_ids``/``vocab_index`` (token → column or -1, [V]) restrict the softmax to a
    vocabulary subset (labels outside it are ignored). ``soft`` mixes in soft targets from the
    recomputed final hidden states: each head's loss is ``(1-soft)·CE(label) + soft·CE(target
    distribution)`` (needs ``batch["hidden"]``, ``batch["soft_pos"]``). ``soft_topk`` does the
    same with the stored top-k target logits: ``(1-soft_topk)·CE + soft_topk·KL(renormalised
    top-k ‖ head)`` where top-k logits are stored, plain CE elsewhere (needs
    ``batch["topk_ids"]``). ``tv``: each head's term becomes ``(1-tv)·term + tv·‖softmax(head)
    − p_target‖₁`` (twice the total variation to the target's distribution, as DSpark trains:
    ``tv = 0.9`` is its 0.1 CE + 0.9 L1 mix). ``until_fail``: each head's terms are weighted by
    ``until_fail_mask`` of that head's own greedy correctness (the base head by the DFlash
    chain, the corrected head by the Domino chain), so the loss stops after the first wrong
    depth of each block; the normaliser stays ``Σ w_d`` over valid labels. A DSpark drafter's
    corrected term is ``dspark``'s mix (module docstring; ``soft``, ``soft_topk`` and
    ``until_fail`` are refused with it); metrics add ``conf_mae``, the confidence head's mean
    absolute error against α. A DFlash2 drafter's corrected term is ``CE(base) +
    selector_weight · CE(selector)``: the selector's scores over each depth's candidates after
    the true previous token, the label's candidate the target (depths whose label is not a
    candidate add nothing); its accuracy is the selector's."""
    if soft and soft_topk:
        raise ValueError("choose one kind of soft targets: soft (full distribution) or "
                         "soft_topk (stored top-k logits)")
    if dcfg.draft_vocab_size is not None:   # columns = the drafter's draft vocabulary
        vocab_ids = dparams["d2t"][...]
        vocab_index = draft_column_index(vocab_ids, tcfg.vocab_size)
    if (dcfg.is_dspark or dcfg.is_dflash2) and (soft or soft_topk or until_fail or tv):
        raise ValueError("a DSpark drafter trains with its own loss mix (DSparkLoss): drop "
                         "soft, soft_topk, tv and until_fail")
    blocks = block_logits(dcfg, tcfg, dparams, tparams, batch, vocab_ids)
    base, corr, tgt = blocks.base, blocks.corr, blocks.targets
    valid = tgt >= 0          # a label exists (a label outside the columns counts as missed)
    if vocab_ids is not None:
        tgt = jnp.where(valid, vocab_index[jnp.maximum(tgt, 0)], -1)
    J = tgt.shape[1]
    vf = valid.astype(jnp.float32)
    w = depth_weights(J, gamma)[None, :] * (tgt >= 0).astype(jnp.float32)
    ce_b, ce_c = _ce(base, tgt), _ce(corr, tgt)   # (zero weight where tgt < 0)
    hb, hc = ce_b, ce_c
    if soft or tv:   # the target's distribution, once for both terms
        p_t = jax.nn.softmax(target_soft_logits(tcfg, tparams, batch, vocab_ids), axis=-1)
    if soft:
        hb = (1.0 - soft) * ce_b + soft * _soft_ce(base, p_t)
        hc = (1.0 - soft) * ce_c + soft * _soft_ce(corr, p_t)
    if soft_topk:
        if "topk_ids" not in batch:
            raise ValueError("soft_topk needs stored top-k logits (collect --store-topk)")
        cols, p_k, has = topk_targets(batch, vocab_index)
        mix = soft_topk * has.astype(jnp.float32)
        hb = (1.0 - mix) * ce_b + soft_topk * _topk_kl(base, cols, p_k, has)
        hc = (1.0 - mix) * ce_c + soft_topk * _topk_kl(corr, cols, p_k, has)
    if tv:
        hb = (1.0 - tv) * hb + tv * _l1(base, p_t)
        hc = (1.0 - tv) * hc + tv * _l1(corr, p_t)
    extra = {}
    if dcfg.is_dspark:
        hc, extra = _dspark_terms(dcfg, tcfg, dparams, tparams, batch, blocks, ce_c, vocab_ids,
                                  dspark)
    acc_b = (jnp.argmax(base, -1) == tgt) & valid
    acc_c = (jnp.argmax(corr, -1) == tgt) & valid
    if dcfg.is_dflash2:
        sel_ce, acc_c = _selector_terms(dcfg, dparams, blocks, tgt, vocab_ids)
        hc = ce_b + selector_weight * sel_ce
        acc_c = acc_c & valid
    if until_fail:
        hb = hb * until_fail_mask(acc_b, valid, until_fail_floor)
        hc = hc * until_fail_mask(acc_c, valid, until_fail_floor)
    loss = jnp.sum(w * ((1.0 - lam) * hc + lam * hb)) / jnp.maximum(jnp.sum(w), 1.0)
    inside = (tgt >= 0).astype(jnp.float32)   # labels inside the columns (the loss's)
    n_d = jnp.maximum(jnp.sum(vf, axis=0), 1.0)
    full = jnp.all(valid, axis=1)  # blocks whose J labels all exist
    metrics = {
        "loss": loss,
        "base_loss": jnp.sum(inside * ce_b) / jnp.maximum(jnp.sum(inside), 1.0),
        "corr_loss": jnp.sum(inside * ce_c) / jnp.maximum(jnp.sum(inside), 1.0),
        "base_acc_d": jnp.sum(acc_b, axis=0) / n_d,   # [J]
        "corr_acc_d": jnp.sum(acc_c, axis=0) / n_d,   # [J]
        # Greedy chain acceptance (τ = leading correct depths + 1) on full blocks: teacher
        # forcing equals the chain while the chain is right, so this is the offline chain τ.
        "tau_base": 1.0 + jnp.sum(jnp.where(full, leading_correct(acc_b, valid), 0))
        / jnp.maximum(jnp.sum(full), 1),
        "tau_corr": 1.0 + jnp.sum(jnp.where(full, leading_correct(acc_c, valid), 0))
        / jnp.maximum(jnp.sum(full), 1),
        "num_labels": jnp.sum(vf),
    }
    for name, per_AJ in extra.items():   # means over the labels inside the columns
        metrics[name] = jnp.sum(inside * per_AJ) / jnp.maximum(jnp.sum(inside), 1.0)
    return loss, metrics


def _selector_terms(dcfg, dparams, blocks: Blocks, tgt_AJ, vocab_ids):
    """``(CE [A, J], right [A, J])`` of a DFlash2 drafter's selector, teacher-forced: over each
    depth's top candidates of the base logits (columns), scored after the true previous
    token; 0 / False where the label is not a candidate."""
    w = bind_drafter(dcfg, dparams).selector_weights()
    U_AJk, C_AJk = jax.lax.top_k(blocks.base, dcfg.selector_top_k)
    ids_AJk = C_AJk if vocab_ids is None else jnp.take(vocab_ids, C_AJk, axis=0)
    gate_AJr = matmul_t(blocks.z.astype(jnp.float32), w.proj.astype(jnp.float32))
    S_AJkr = gather_rows(w.succ, ids_AJk).astype(jnp.float32) * gate_AJr[..., None, :]
    scores_AJk = selector_scores(U_AJk, S_AJkr, gather_rows(w.pred, blocks.prev))
    hit_AJk = C_AJk == tgt_AJ[..., None]
    has_AJ = jnp.any(hit_AJk, axis=-1)
    picked_AJ = jnp.sum(jnp.where(hit_AJk, scores_AJk, 0.0), axis=-1)
    ce_AJ = jnp.where(has_AJ, jax.nn.logsumexp(scores_AJk, axis=-1) - picked_AJ, 0.0)
    right_AJ = has_AJ & (jnp.argmax(scores_AJk, -1) == jnp.argmax(hit_AJk, -1))
    return ce_AJ, right_AJ


def _l1(logits, p_target):
    """``‖softmax(logits) − p_target‖₁`` over the last axis (2 × the total variation)."""
    return jnp.sum(jnp.abs(jax.nn.softmax(logits, axis=-1) - p_target), axis=-1)


def _dspark_terms(dcfg, tcfg, dparams, tparams, batch, blocks: Blocks, ce_AJ, vocab_ids,
                  weights: DSparkLoss):
    """``(per-depth loss [A, J], {metric: [A, J]})`` of a DSpark drafter's corrected head."""
    p_t = jax.nn.softmax(target_soft_logits(tcfg, tparams, batch, vocab_ids), axis=-1)
    l1_AJ = _l1(blocks.corr, p_t)
    alpha_AJ = jax.lax.stop_gradient(jnp.clip(1.0 - 0.5 * l1_AJ, 0.0, 1.0))
    per_AJ = weights.ce * ce_AJ + weights.l1 * l1_AJ
    extra = {"l1": l1_AJ, "alpha": alpha_AJ}
    if dcfg.confidence_head:
        conf_AJ = bind_drafter(dcfg, dparams).confidence(blocks.z, blocks.prev)
        bce_AJ = jax.nn.softplus(conf_AJ) - alpha_AJ * conf_AJ   # BCE with logits, soft label
        per_AJ = per_AJ + weights.confidence * bce_AJ
        extra["conf_mae"] = jnp.abs(jax.nn.sigmoid(conf_AJ) - alpha_AJ)
    return per_AJ, extra
