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

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dominotree_jax.model.state import flat_to_state, state_to_flat, trainable
from dominotree_jax.config import DrafterConfig, TargetConfig
from dominotree_jax.train.loss import (block_logits, leading_correct,
                                       loss_and_metrics)


def rollout_drafter_batch(prompt_BT, lengths_B, tokens_BY, num_B, features_BWF, key,
                          anchors: int, block: int) -> dict:
    """The training batch of one rollout: ``tokens [B, W]`` (prompt then completion),
    ``feats [B, W, F]``, ``anchors [B, A]`` drawn uniformly inside each completion and
    ``labels [B, A, block+1]`` (``x_a … x_{a+block}``, -1 past the end).

    ``features_BWF`` (``W = T + Y``) holds the features of positions ``< len + num - 1`` (the
    last committed token has not been through the target yet); anchors are ``a`` in
    ``[len-1, len+num-2]``: the drafter's context is the features of positions ``< a``.
    """
    B, T = prompt_BT.shape
    Y = tokens_BY.shape[1]
    W = T + Y
    col_W = jnp.arange(W)[None]
    gen_BW = jnp.take_along_axis(tokens_BY, jnp.clip(col_W - lengths_B[:, None], 0, Y - 1), 1)
    seq_BW = jnp.where(col_W < lengths_B[:, None], jnp.pad(prompt_BT, ((0, 0), (0, Y))),
                       gen_BW)
    end_B = lengths_B + num_B                       # tokens in each sequence
    seq_BW = jnp.where(col_W < end_B[:, None], jnp.maximum(seq_BW, 0), 0)
    lo_B = lengths_B - 1
    hi_B = jnp.maximum(end_B - 1, lengths_B)        # exclusive
    u_BA = jax.random.uniform(key, (B, anchors))
    anc_BA = (lo_B[:, None] + jnp.floor(u_BA * (hi_B - lo_B)[:, None])).astype(jnp.int32)
    idx_BAP = anc_BA[..., None] + jnp.arange(block + 1)[None, None]
    lab_BAP = jnp.take_along_axis(seq_BW[:, None, :], jnp.minimum(idx_BAP, W - 1), 2)
    lab_BAP = jnp.where(idx_BAP < end_B[:, None, None], lab_BAP, -1)
    feats_BWF = jnp.where((col_W < end_B[:, None] - 1)[..., None], features_BWF, 0)
    return {"tokens": seq_BW, "feats": feats_BWF, "anchors": anc_BA, "labels": lab_BAP}


def chain_tau(dcfg: DrafterConfig, tcfg: TargetConfig, dparams, tparams, batch) -> jax.Array:
    """Mean ``1 + leading correct depths`` of the (corrected) greedy chain over anchor blocks
    that have at least one label."""
    blocks = block_logits(dcfg, tcfg, dparams, tparams, batch)
    corr, tgt = blocks.corr, blocks.targets
    valid = tgt >= 0
    pred = jnp.argmax(corr, -1)                      # a draft-vocabulary column
    if dcfg.draft_vocab_size is not None:
        pred = jnp.take(dparams["d2t"][...], pred, axis=0)
    ok = (pred == tgt) & valid
    has = valid[:, 0]
    lead = jnp.where(has, leading_correct(ok, valid), 0)
    return 1.0 + jnp.sum(lead) / jnp.maximum(jnp.sum(has), 1)


def take_rows(key, rows: int | None, *arrays_B):
    """``rows`` batch rows drawn without replacement (the same rows of every array), or the
    arrays unchanged when ``rows`` is None or not below the batch."""
    B = arrays_B[0].shape[0]
    if rows is None or rows >= B:
        return arrays_B
    idx = jax.random.choice(key, B, (rows,), replace=False)
    return tuple(jnp.take(x, idx, axis=0) for x in arrays_B)


class DrafterRefresher:
    """AdamW on the drafter from rollout batches (the offline loss at λ = 0: corrected
    logits only, as at the end of the offline curriculum).

    Memory: the loss's logits are ``rows x anchors x (block + 1) x |vocab|`` float32, bounded by
    ``rows`` (rows drawn per step; None = all), ``anchors`` (anchor blocks per row) and
    ``vocab_ids`` (sorted token ids the softmax is restricted to, as in offline training;
    labels outside are ignored; None = the full vocabulary). ``logits_bytes`` is that bound;
    ``memory`` holds XLA's own figures for the compiled step (per batch shape)."""

    def __init__(self, dcfg: DrafterConfig, tcfg: TargetConfig, drafter_state, *,
                 lr: float = 3e-4, anchors: int = 4, gamma: float | None = 7.0,
                 clip: float = 1.0, weight_decay: float = 0.0, rows: int | None = None,
                 vocab_ids=None, compiler_options=None):
        if anchors < 1 or (rows is not None and rows < 1):
            raise ValueError(f"anchors and rows must be >= 1, got anchors={anchors}, "
                             f"rows={rows}")
        if dcfg.is_dspark:
            raise ValueError("the drafter refresh does not train DSpark drafters: their loss "
                             "reads the target's distribution, which rollouts do not keep; "
                             "run the engine with drafter_refresh off")
        self.dcfg, self.tcfg = dcfg, tcfg
        self.anchors, self.block, self.rows = anchors, dcfg.num_draft_positions, rows
        if vocab_ids is None:
            vocab_ids_V = vocab_index_V = None
        else:
            ids = np.asarray(vocab_ids, np.int32)
            if ids.ndim != 1 or ids.size == 0 or (np.diff(ids) <= 0).any() or ids[0] < 0 \
                    or ids[-1] >= tcfg.vocab_size:
                raise ValueError("vocab_ids must be sorted, distinct token ids of the vocabulary")
            index = np.full((tcfg.vocab_size,), -1, np.int32)
            index[ids] = np.arange(ids.size, dtype=np.int32)
            vocab_ids_V, vocab_index_V = jnp.asarray(ids), jnp.asarray(index)
        self.vocab_size = dcfg.draft_vocab if vocab_ids is None else int(vocab_ids_V.shape[0])
        flat = state_to_flat(drafter_state)
        # the draft vocabulary's map is fixed: it rides beside the trained leaves
        fixed = {} if dcfg.draft_vocab_size is None else {"d2t": jnp.asarray(flat["d2t"])}
        self.fixed = fixed
        self.flat = trainable(flat)
        self.opt = optax.chain(optax.clip_by_global_norm(clip),
                               optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=weight_decay))
        self.opt_state = self.opt.init(self.flat)
        self.traces: list[tuple] = []
        self.memory: dict[tuple, dict] = {}
        self._programs: dict[tuple, object] = {}
        self.num_steps = 0

        def step(flat, opt_state, tparams, prompt_BT, lengths_B, tokens_BY, num_B, feats_BWF,
                 key):
            self.traces.append(prompt_BT.shape + tokens_BY.shape)   # once per compilation
            pick, key = jax.random.split(key)
            prompt_BT, lengths_B, tokens_BY, num_B, feats_BWF = take_rows(
                pick, self.rows, prompt_BT, lengths_B, tokens_BY, num_B, feats_BWF)
            batch = rollout_drafter_batch(prompt_BT, lengths_B, tokens_BY, num_B, feats_BWF,
                                          key, self.anchors, self.block)

            def f(p):
                return loss_and_metrics(dcfg, tcfg, flat_to_state(dcfg, {**p, **fixed}), tparams,
                                        batch, 0.0, gamma, vocab_ids_V, vocab_index_V)

            tau_before = chain_tau(dcfg, tcfg, flat_to_state(dcfg, {**flat, **fixed}), tparams,
                                   batch)
            (loss, m), grads = jax.value_and_grad(f, has_aux=True)(flat)
            updates, opt_state = self.opt.update(grads, opt_state, flat)
            # what this step trained on, computed from the batch inside the program: rows, and
            # the sum of their token ids (prompt + committed tokens; a checksum callers compare
            # with the rollouts they saw)
            real_BW = jnp.arange(batch["tokens"].shape[1])[None] < (lengths_B + num_B)[:, None]
            return optax.apply_updates(flat, updates), opt_state, {
                "loss": loss, "chain_tau_before": tau_before, "labels": m["num_labels"],
                "rows": jnp.asarray(batch["tokens"].shape[0], jnp.int32),
                "token_sum": jnp.sum(jnp.where(real_BW, batch["tokens"], 0))}

        def evaluate(flat, tparams, prompt_BT, lengths_B, tokens_BY, num_B, feats_BWF, key):
            batch = rollout_drafter_batch(prompt_BT, lengths_B, tokens_BY, num_B, feats_BWF,
                                          key, self.anchors, self.block)
            return chain_tau(dcfg, tcfg, flat_to_state(dcfg, {**flat, **fixed}), tparams, batch)

        self._step = jax.jit(step, donate_argnums=(0, 1), compiler_options=compiler_options)
        self._eval = jax.jit(evaluate, compiler_options=compiler_options)

    def logits_bytes(self, batch_rows: int) -> int:
        """The float32 bytes of one step's drafter logits at a rollout of ``batch_rows``."""
        rows = batch_rows if self.rows is None else min(self.rows, batch_rows)
        return 4 * rows * self.anchors * (self.block + 1) * self.vocab_size

    @property
    def state(self):
        """The drafter parameters as an ``nnx.State`` (``DominoTreeRollout.update_drafter_params``
        / ``decode``'s ``params["drafter"]``), copied: ``step`` donates its buffers."""
        return flat_to_state(self.dcfg, {**jax.tree.map(jnp.copy, self.flat), **self.fixed})

    def checkpoint_state(self) -> dict:
        """Host (numpy) copies of what later steps depend on: ``{"flat": the trained drafter
        leaves, "opt_state": AdamW's state, "num_steps": steps taken}``."""
        return {"flat": jax.tree.map(np.asarray, self.flat),
                "opt_state": jax.tree.map(np.asarray, self.opt_state),
                "num_steps": self.num_steps}

    def restore_checkpoint_state(self, saved: dict) -> None:
        """The inverse of ``checkpoint_state`` on a refresher of the same drafter."""
        if jax.tree.structure(saved["flat"]) != jax.tree.structure(self.flat):
            raise ValueError("the checkpointed refreshed drafter has another structure")
        self.flat = jax.tree.map(jnp.asarray, saved["flat"])
        self.opt_state = jax.tree.map(jnp.asarray, saved["opt_state"])
        self.num_steps = int(saved["num_steps"])

    def _compiled_for(self, args):
        """The step compiled for these argument shapes (once each; ``traces`` counts them),
        with XLA's memory figures for it in ``memory``."""
        shape = tuple(tuple(jnp.shape(a)) for a in args[1:6])
        if shape not in self._programs:
            compiled = self._step.lower(self.flat, self.opt_state, *args).compile()
            stats = compiled.memory_analysis()
            self.memory[shape] = {} if stats is None else {
                "temp_bytes": int(stats.temp_size_in_bytes),
                "argument_bytes": int(stats.argument_size_in_bytes),
                "output_bytes": int(stats.output_size_in_bytes)}
            self._programs[shape] = compiled
        return self._programs[shape], self.memory[shape]

    def step(self, tparams, rollout, key, clock=time.perf_counter) -> dict:
        """One update from a ``LastRollout`` decoded with ``return_features=True``: the
        metrics (floats), the step's ``seconds`` on ``clock`` (without compiling) and XLA's
        memory figures for its program."""
        out = rollout.out
        if out.features is None:
            raise ValueError("the drafter refresh needs a rollout decoded with "
                             "return_features=True")
        args = (tparams, rollout.prompt_BT, rollout.lengths_B, out.tokens, out.num_tokens,
                out.features, key)
        program, memory = self._compiled_for(args)
        t0 = clock()
        self.flat, self.opt_state, m = program(self.flat, self.opt_state, *args)
        jax.block_until_ready(m)
        seconds = clock() - t0
        self.num_steps += 1
        return {**{k: float(v) for k, v in m.items()}, "seconds": seconds,
                "logits_bytes": self.logits_bytes(out.tokens.shape[0]), **memory}

    def chain_tau(self, tparams, rollout, key, flat=None) -> float:
        """``chain_tau`` of these parameters (or ``flat``) on a rollout."""
        out = rollout.out
        return float(self._eval(self.flat if flat is None else flat, tparams, rollout.prompt_BT,
                                rollout.lengths_B, out.tokens, out.num_tokens, out.features,
                                key))
