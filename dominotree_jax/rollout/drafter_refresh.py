"""A drafter that follows the policy: train it on rollouts, with no extra target forward.

Every speculative rollout already runs the target over each committed token (the verify pass)
and so computes the tapped features the drafter conditions on. ``decode(...,
return_features=True)`` returns them (``features_BWF``: prompt and committed tokens at their
absolute positions). ``rollout_drafter_batch`` turns a rollout into the batch layout of the
offline training loss (``train.loss``: whole sequences + anchor blocks inside the completions),
and ``DrafterRefresher.step`` takes one jitted AdamW step on that same loss. Parameters and
the batch are arguments of one compiled program: new policy / drafter values never recompile.

``chain_tau`` is an acceptance measure that needs no decode: on a rollout batch, the mean of
1 + leading correct greedy draft depths per anchor block (teacher-forced, as
``train.loss``'s ``tau_*`` metrics but over blocks cut by the end of a completion too).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from dominotree_jax.model.state import state_to_flat
from dominotree_jax.config import DrafterConfig, TargetConfig
from dominotree_jax.train.loss import (block_logits, flat_to_state, leading_correct,
                                       loss_and_metrics)


def rollout_drafter_batch(prompt_BT, lengths_B, tokens_BN, num_B, features_BWF, key,
                          anchors: int, block: int) -> dict:
    """The training batch of one rollout: ``tokens [B, W]`` (prompt then completion),
    ``feats [B, W, F]``, ``anchors [B, A]`` drawn uniformly inside each completion and
    ``labels [B, A, block+1]`` (``x_a … x_{a+block}``, -1 past the end).

    ``features_BWF`` (``W = T + N``) holds the features of positions ``< len + num - 1`` (the
    last committed token has not been through the target yet); anchors are ``a`` in
    ``[len-1, len+num-2]``: the drafter's context is the features of positions ``< a``.
    """
    B, T = prompt_BT.shape
    N = tokens_BN.shape[1]
    W = T + N
    col_W = jnp.arange(W)[None]
    gen_BW = jnp.take_along_axis(tokens_BN, jnp.clip(col_W - lengths_B[:, None], 0, N - 1), 1)
    seq_BW = jnp.where(col_W < lengths_B[:, None], jnp.pad(prompt_BT, ((0, 0), (0, N))),
                       gen_BW)
    end_B = lengths_B + num_B                       # tokens in each sequence
    seq_BW = jnp.where(col_W < end_B[:, None], jnp.maximum(seq_BW, 0), 0)
    lo_B = lengths_B - 1
    hi_B = jnp.maximum(end_B - 1, lengths_B)        # exclusive
    u_BA = jax.random.uniform(key, (B, anchors))
    anc_BA = (lo_B[:, None] + jnp.floor(u_BA * (hi_B - lo_B)[:, None])).astype(jnp.int32)
    idx_BAJ = anc_BA[..., None] + jnp.arange(block + 1)[None, None]
    lab_BAJ = jnp.take_along_axis(seq_BW[:, None, :], jnp.minimum(idx_BAJ, W - 1), 2)
    lab_BAJ = jnp.where(idx_BAJ < end_B[:, None, None], lab_BAJ, -1)
    feats_BWF = jnp.where((col_W < end_B[:, None] - 1)[..., None], features_BWF, 0)
    return {"tokens": seq_BW, "feats": feats_BWF, "anchors": anc_BA, "labels": lab_BAJ}


def chain_tau(dcfg: DrafterConfig, tcfg: TargetConfig, dparams, tparams, batch) -> jax.Array:
    """Mean ``1 + leading correct depths`` of the (corrected) greedy chain over anchor blocks
    that have at least one label."""
    _, corr, tgt = block_logits(dcfg, tcfg, dparams, tparams, batch)
    valid = tgt >= 0
    ok = (jnp.argmax(corr, -1) == tgt) & valid
    has = valid[:, 0]
    lead = jnp.where(has, leading_correct(ok, valid), 0)
    return 1.0 + jnp.sum(lead) / jnp.maximum(jnp.sum(has), 1)


class DrafterRefresher:
    """AdamW on the drafter from rollout batches (the offline loss at λ = 0: corrected
    logits only, as at the end of the offline curriculum)."""

    def __init__(self, dcfg: DrafterConfig, tcfg: TargetConfig, drafter_state, *,
                 lr: float = 3e-4, anchors: int = 4, gamma: float | None = 7.0,
                 clip: float = 1.0, weight_decay: float = 0.0, compiler_options=None):
        self.dcfg, self.tcfg = dcfg, tcfg
        self.anchors, self.block = anchors, dcfg.num_draft_positions
        self.flat = {k: jnp.asarray(v, jnp.float32)
                     for k, v in state_to_flat(drafter_state).items()}
        self.opt = optax.chain(optax.clip_by_global_norm(clip),
                               optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=weight_decay))
        self.opt_state = self.opt.init(self.flat)
        self.traces: list[tuple] = []
        self.num_steps = 0

        def step(flat, opt_state, tparams, prompt_BT, lengths_B, tokens_BN, num_B, feats_BWF,
                 key):
            self.traces.append(prompt_BT.shape + tokens_BN.shape)   # once per compilation
            batch = rollout_drafter_batch(prompt_BT, lengths_B, tokens_BN, num_B, feats_BWF,
                                          key, self.anchors, self.block)

            def f(p):
                return loss_and_metrics(dcfg, tcfg, flat_to_state(dcfg, p), tparams, batch,
                                        0.0, gamma)

            tau_before = chain_tau(dcfg, tcfg, flat_to_state(dcfg, flat), tparams, batch)
            (loss, m), grads = jax.value_and_grad(f, has_aux=True)(flat)
            updates, opt_state = self.opt.update(grads, opt_state, flat)
            return optax.apply_updates(flat, updates), opt_state, {
                "loss": loss, "chain_tau_before": tau_before, "labels": m["num_labels"]}

        def evaluate(flat, tparams, prompt_BT, lengths_B, tokens_BN, num_B, feats_BWF, key):
            batch = rollout_drafter_batch(prompt_BT, lengths_B, tokens_BN, num_B, feats_BWF,
                                          key, self.anchors, self.block)
            return chain_tau(dcfg, tcfg, flat_to_state(dcfg, flat), tparams, batch)

        self._step = jax.jit(step, donate_argnums=(0, 1), compiler_options=compiler_options)
        self._eval = jax.jit(evaluate, compiler_options=compiler_options)

    @property
    def state(self):
        """The drafter parameters as an ``nnx.State`` (``DominoTreeRollout.update_drafter_params``
        / ``decode``'s ``params["drafter"]``), copied: ``step`` donates its buffers."""
        return flat_to_state(self.dcfg, jax.tree.map(jnp.copy, self.flat))

    def step(self, tparams, rollout, key) -> dict:
        """One update from a ``LastRollout`` decoded with ``return_features=True``."""
        out = rollout.out
        self.flat, self.opt_state, m = self._step(
            self.flat, self.opt_state, tparams, rollout.prompt_BT, rollout.lengths_B,
            out.tokens, out.num_tokens, out.features, key)
        self.num_steps += 1
        return {k: float(v) for k, v in m.items()}

    def chain_tau(self, tparams, rollout, key, flat=None) -> float:
        """``chain_tau`` of these parameters (or ``flat``) on a rollout."""
        out = rollout.out
        return float(self._eval(self.flat if flat is None else flat, tparams, rollout.prompt_BT,
                                rollout.lengths_B, out.tokens, out.num_tokens, out.features,
                                key))
