"""``decode``: checks, prefill, then a ``jax.lax.while_loop`` of rounds (docs/algorithm.md §5).

The round is ``round.round_step`` (draft → verify → accept → keep → commit, fixed size or
``budget="auto"``), in ``decoding/round.py`` with its pieces. Every method is a tree: ``ar``
drafts nothing (one verify row, the bonus), the chain methods draft a chain, the tree methods
a best-first tree. A round commits ``tau = accepted + 1`` tokens per row; rows finish
independently on a stop token or ``max_new_tokens``. Batches are right-padded: row ``b``
holds its prompt in columns ``0 .. prompt_lengths[b]-1``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp

from dominotree_jax.decoding import checks, lookup
from dominotree_jax.decoding.auto_size import AutoPolicy, AutoState
from dominotree_jax.decoding.commit import PAD
from dominotree_jax.decoding.config import DecodeConfig
from dominotree_jax.decoding.draft import bind_drafter_for, tap_layers_for
from dominotree_jax.decoding.stages import STAGE_PREFILL
from dominotree_jax.decoding.loop_inputs import LoopConstants
from dominotree_jax.decoding.round import (LoopState, first_state, output_width, plain_step,
                                           prefill_context, repeat_prefilled, round_step)
from dominotree_jax.model.drafter import bind_drafter_float32_view
from dominotree_jax.model.target import bind_float32_view, bind_target
from dominotree_jax.precision import bind_view_if_needed

if TYPE_CHECKING:   # shape annotations only; tests check them (tests/shape_check.py)
    from jaxtyping import Array, Float, Int

__all__ = ["DecodeOutput", "LoopState", "cache_length", "decode", "draft_head"]


class DecodeOutput(NamedTuple):
    """What ``decode`` returns: ``B`` batch rows, ``Y = max_new_tokens`` columns (a row takes
    at most ``Y`` rounds), ``W = T + Y`` positions."""
    tokens: Int[Array, "B Y"]          # int32, PAD (-1) after num_tokens
    num_tokens: Int[Array, " B"]       # int32 tokens generated (stop token included)
    accept_lengths: Int[Array, "B Y"]  # int32 tokens committed per round, 0 = none
    num_rounds: Int[Array, " B"]       # int32 rounds this row took part in
    logprobs: Float[Array, "B Y"]      # float32 (zeros unless return_logprobs)
    # draft nodes verified in each round (0 = a plain AR step; the fixed size unless
    # budget="auto"; the candidates are ``DecodeConfig.size_options``), -1 = no round
    draft_sizes: Int[Array, "B Y"]
    # with return_features (else None): the target's tapped features at absolute positions;
    # known below prompt_length + num_tokens - 1 (the last token has not been through the
    # target), zeros/garbage from there on
    features: Float[Array, "B W F"] | None = None
    # budget="auto": the policy's state after the last round (``auto_size.AutoState``); pass it
    # as ``decode(..., auto_state=...)`` to the next call of the same config so that it starts
    # from what these rounds measured instead of the optimistic default
    auto_state: AutoState | None = None
    # budget="auto": the policy's expected tokens committed in each round when it chose the
    # round's size (1 + calibration x the drafter's predicted accepted nodes; 1 at a plain
    # step), NaN where no round; compare with accept_lengths (else None)
    predicted_lengths: Float[Array, "B Y"] | None = None

    def mean_tau(self) -> jax.Array:
        """τ over the batch: tokens committed per round (per target forward), float32."""
        return (jnp.sum(self.accept_lengths).astype(jnp.float32)
                / jnp.maximum(jnp.sum(self.num_rounds), 1))


def cache_length(config: DecodeConfig, prompt_len: int) -> int:
    need = prompt_len + config.max_new_tokens + config.num_draft_nodes + 1
    if config.max_len is None:
        return need
    if config.max_len < need:
        raise ValueError(
            f"prompt ({prompt_len} tokens) + max_new_tokens ({config.max_new_tokens}) + "
            f"verify rows ({config.num_draft_nodes + 1}) need {need} cache slots, but "
            f"max_len is {config.max_len}")
    return config.max_len


def draft_head(params, config: DecodeConfig):
    """``[C, H]``: the target's LM-head rows of the drafter's draft vocabulary, which every
    drafting round multiplies by (None when ``config`` drafts nothing or the drafter has no
    draft vocabulary). ``decode`` gathers them once per call; a caller that decodes many times
    with the same parameters (a rollout engine between parameter updates) can make them once
    and pass them as ``decode(..., draft_head=...)``. Jittable."""
    drafter = bind_drafter_for(config, params.get("drafter"))
    if drafter is None:
        return None
    return drafter.head_rows(bind_target(config.target, params["target"]))


def decode(params, prompt, *, config: DecodeConfig, key=None, prompt_lengths=None,
           auto_state=None, row_stop_ids=None, prompt_rows=None, draft_head=None,
           sampling=None, lookup_history=None, value_checks: bool = True) -> DecodeOutput:
    """Generate up to ``config.max_new_tokens`` tokens after ``prompt`` (``[T]`` or ``[B, T]``).

    ``params``: ``{"target": state, "drafter": state or None}``. Call it directly: the inputs
    are checked (``decoding/checks.py``), then a program compiled once per ``config.program``
    runs (every temperature, top-k and top-p share it: they are runtime values). Inside your
    own ``jax.jit`` it runs inline, its value checks in the program: a host callback, which
    keeps jax from writing your program to its persistent compilation cache;
    ``value_checks=False`` leaves it out once you have checked the concrete values with
    ``check_inputs`` (shapes and settings are checked either way). ``auto_state``
    (``budget="auto"`` only): a previous call's ``DecodeOutput.auto_state`` (or
    ``auto_size.initial_state``), to carry the draft-size policy's measurements (delivered
    rate, drafter calibration, probe gap) from call to call. ``row_stop_ids``: each row's own
    stop ids, ``[B, e]`` int (-1 pads a row's list), on top of ``config.stop_ids`` (a runtime
    array: new stop sets do not recompile). ``prompt_rows``: one prefill shared by several rows
    (GRPO's G samples of a prompt): ``prompt`` holds ``b`` distinct prompts, ``prompt_rows``
    (``[B]`` int, values in ``[0, b)``) says which one each of the ``B`` output rows
    continues; each prompt is prefilled once and its caches, drafter context and last logits
    are copied to its rows. The output equals decoding ``prompt[prompt_rows]`` (same key: same
    tokens at any temperature); ``row_stop_ids`` and ``auto_state`` are per output row.
    ``draft_head``: ``draft_head(params, config)`` made beforehand for these parameters (else
    gathered here, once per call). ``sampling``: ``sampling.Sampling`` values (temperature,
    top_k, top_p; e.g. traced inside your own jit) used instead of the config's, which must
    then sample (temperature > 0: greediness is static). ``lookup_history``
    (``config.lookup_history = H``): ``[B, H, C]`` int, each output row's ``H`` earlier texts
    (e.g. earlier samples of its prompt; -1 past each one's end) that its lookup drafting
    searches too; None: none.
    """
    inputs = checks.checked_inputs(prompt, config=config, key=key, prompt_lengths=prompt_lengths,
                                   prompt_rows=prompt_rows, row_stop_ids=row_stop_ids,
                                   sampling=sampling, lookup_history=lookup_history)
    if auto_state is not None and not config.is_auto:
        raise ValueError("auto_state is only for budget='auto' configs")
    checks.check_params(params, config, config.uses_drafter)
    key = jax.random.key(0) if key is None else key
    if checks.is_traced((params, inputs, key, auto_state, draft_head)):
        # inside the caller's trace: inline (a trace of its own, never a cached one)
        if value_checks:
            inputs = checks.refuse_in_program(inputs, config)
        return _decode_program(params, inputs, key, auto_state, draft_head,
                               config=config.program)
    checks.refuse_on_host(inputs, config)
    return _compiled_program(params, inputs, key, auto_state, draft_head,
                             config=config.program)


def check_inputs(prompt, *, config: DecodeConfig, key=None, prompt_lengths=None,
                 row_stop_ids=None, prompt_rows=None, sampling=None,
                 lookup_history=None) -> None:
    """Refuse, by name, what ``decode`` would refuse of these concrete arguments (shapes,
    settings and values): call it on the host before a ``decode(..., value_checks=False)``
    inside your own ``jax.jit``."""
    checks.refuse_on_host(checks.checked_inputs(
        prompt, config=config, key=key, prompt_lengths=prompt_lengths, prompt_rows=prompt_rows,
        row_stop_ids=row_stop_ids, sampling=sampling, lookup_history=lookup_history), config)


def _decode_program(params, inputs: checks.DecodeInputs, key, auto_state, head_CH, *,
                    config: DecodeConfig) -> DecodeOutput:
    """``decode`` on checked inputs: prefill, then the loop of rounds. ``config`` is a
    ``DecodeConfig.program``: its sampling values are ``inputs.sampling``."""
    prompt_bT, lengths_b, rows_B, stops_Be, sampling, history_BhW = inputs
    T = prompt_bT.shape[1]
    B = lengths_b.shape[0] if rows_B is None else rows_B.shape[0]
    lengths_B = lengths_b if rows_B is None else lengths_b[rows_B]
    target = bind_target(config.target, params["target"])
    drafter = bind_drafter_for(config, params.get("drafter"))
    policy = AutoPolicy(config, B) if config.is_auto else None

    with jax.named_scope(STAGE_PREFILL):
        pre = prefill_context(target=target, drafter=drafter, prompt_BT=prompt_bT,
                              lengths_B=lengths_b, max_len=cache_length(config, T),
                              tap_layers=tap_layers_for(config),
                              dtype=jax.tree.leaves(params["target"])[0].dtype)
    if rows_B is not None:   # each distinct prompt's prefill, copied to its rows
        pre = repeat_prefilled(pre, rows_B)
    plain_target = plain_drafter = None   # auto's plain steps on 16-bit CPU weights: the
    if policy is not None and policy.can_pay:   # float32 views, made once before the loop
        plain_target = bind_view_if_needed(bind_float32_view, config.target, params["target"],
                                           "target parameters", B)
        if drafter is not None:
            plain_drafter = bind_view_if_needed(bind_drafter_float32_view, config.drafter,
                                                params["drafter"], "drafter parameters", B)
    # what no round changes, built once and passed down whole
    prompt_BT = prompt_bT if rows_B is None else prompt_bT[rows_B]
    group, history_BhW = lookup.sources(config, prompt_BT, lengths_B, history_BhW,
                                        width=T + output_width(config))
    consts = LoopConstants(config=config, target=target, drafter=drafter, lengths_B=lengths_B,
                           prompt_BT=prompt_BT,
                           head_rows_CH=_head_rows(drafter, target, head_CH, config),
                           sampling=sampling, stops_Be=stops_Be, group=group,
                           history_BhW=history_BhW,
                           policy=policy,
                           plain_target=plain_target, plain_drafter=plain_drafter)
    state = first_state(pre, key, consts,
                        auto=None if policy is None else policy.init(auto_state))
    step = functools.partial(round_step, consts=consts)
    body = step
    if policy is not None and policy.plain_runs:
        # between rounds the policy may draft in, its plain steps run as an inner loop of
        # ``ar``-like steps (``round.plain_step``): the draft cond and the size switch of an
        # auto round cost ~4% of a plain step (batch 4, Zen 5), paid every round a policy
        # that rarely drafts takes
        plain = functools.partial(plain_step, consts=consts)

        def body(s: LoopState) -> LoopState:   # one auto round, then its plain steps
            return jax.lax.while_loop(
                lambda s: ~jnp.all(s.done_B) & ~policy.wants_draft(s.auto), plain, step(s))
    final = jax.lax.while_loop(lambda s: ~jnp.all(s.done_B), body, state)
    return _outputs(final, T, config)


# one compiled program per ``DecodeConfig.program`` and argument shapes (``decode`` called
# with concrete values)
_compiled_program = jax.jit(_decode_program, static_argnames="config")


def _head_rows(drafter, target, head_CH, config: DecodeConfig):
    """The draft head the rounds read: ``decode``'s ``draft_head`` argument, checked against
    the drafter's draft vocabulary and the target's LM head, or gathered now when None."""
    if head_CH is None:
        return None if drafter is None else drafter.head_rows(target)
    if drafter is None or drafter.d2t is None:
        raise ValueError("draft_head is only for a drafter with a draft vocabulary (d2t); this "
                         "config drafts " + ("nothing" if drafter is None else
                                             "over the whole vocabulary"))
    want = (drafter.d2t[...].shape[0], config.target.hidden_size)
    dtype = target.head_weight_VH.dtype
    if tuple(head_CH.shape) != want or head_CH.dtype != dtype:
        raise ValueError(f"draft_head must be [C, H] = {list(want)} {dtype} (draft vocabulary, "
                         f"target width, the LM head's dtype), got {list(head_CH.shape)} "
                         f"{head_CH.dtype}: make it with draft_head(params, config)")
    return head_CH


def _outputs(final: LoopState, T: int, config: DecodeConfig) -> DecodeOutput:
    Y = config.max_new_tokens
    n_B = jnp.minimum(final.n_B, Y)
    keep_BY = jnp.arange(Y)[None] < n_B[:, None]
    return DecodeOutput(
        tokens=jnp.where(keep_BY, final.out_BO[:, :Y], PAD), num_tokens=n_B,
        accept_lengths=final.taus_BY, num_rounds=final.rounds_B,
        logprobs=jnp.where(keep_BY, final.logp_BO[:, :Y], 0.0), draft_sizes=final.sizes_BY,
        features=None if final.feats_BWF is None else final.feats_BWF[:, :T + Y],
        auto_state=final.auto, predicted_lengths=final.expected_BY)
