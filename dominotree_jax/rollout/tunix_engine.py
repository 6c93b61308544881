"""``DominoTreeRollout``: a tunix rollout engine (``BaseRollout``) that samples with ``decode``.

Prompts are tokenized as tunix's sampler does, right-padded to ``max_prompt_length`` columns
(or the next power of two above the longest prompt, as tunix does) and decoded in one batch
with speculative decoding (DominoTree by default): the samples are exactly the target's at any
temperature, and the per-token log-probs come from the verification logits (no extra forward).

Log-probs (docs/rl.md): ``generate``'s and ``get_per_token_logps``' are what tunix's trainer
computes for the same tokens (``common.compute_per_token_logps`` at the rollout temperature):
``log softmax(logits / T)`` over the whole vocabulary, not the top-k / top-p filtered
distribution the tokens are drawn from. ``get_per_token_logps`` uses the temperature of the
``rollout_config`` the engine was built with (RLCluster passes its TRAIN config; else the last
``generate``'s, else 1). Pad ids inside prompts: ``prompt_pads`` (``__init__``). The pad id is
a stop id: a completion ends at its first pad or EOS (the trainer masks pad ids, so a
completion never holds one).

Drafter refresh (opt-in, ``drafter_refresh=``): after a ``generate`` call (so per micro-batch
RLCluster rolls out) one ``DrafterRefresher`` step on that rollout's features (by default
after every call; ``schedule="adaptive"``: when the ``RefreshSchedule`` says one is due, after
every call while the drafter's chain τ rises or falls, less often while it is flat; with a
``clock``, either within the schedule's time budget: ~3 % of the rollout time while drafting
saves nothing, half of what it saves where it does), the new drafter used from the next call
on; ``refresh_log`` holds each step's metrics, time and memory, ``refreshed`` the last call's
(None when it took none), ``tunix_metrics`` hands them (and τ) to tunix's metrics logger.

``budget="auto"`` calls whose carried state would not draft run as plain calls (``ar``, or
``lookup`` with ``lookup=K``; ``auto_probe``), so a policy that does not draft costs what
``ar`` does.

The stale-drafter guard (``drafter_guard``, on by default; ``drafter_guard=False`` turns it
off): when a drafted call's tokens per drafted round collapse against the drafter's recent
record, calls run plain (the same sampling as ``ar``) until a probe finds the drafter healthy;
``guard.events`` and the log say when, ``rollout/drafter_stale`` reports it to tunix.

Drafts from the group and the history: ``lookup=K`` with ``lookup_group=G`` (a row also copies
from the rows of its block of ``G`` with the same prompt: GRPO's group) and ``lookup_history=H``
(and from the last ``H`` rollouts of its prompt in earlier calls, ``prompt_history``).

The clock (``clock=``, off by default): without one, which program a call runs and when the
refresh steps follow the cost table and the measured chain τ alone, so two runs with the same
seeds make the same rollouts. With one (``time.perf_counter``) the engine times its calls and
steps: ``auto_probe.CallRates`` holds drafting back while its calls run slower than ``ar``'s,
and the refresh's time budget applies (``refresh_schedule``); choices then follow wall time
(every sample is still the target's). Tests pass a fake clock to drive each branch.

Parameters are arguments of one jitted program per ``(DecodeConfig, batch, width)``, so
``update_params`` changes the next rollout without compiling anything (``num_compilations``).

Use it from tunix's ``RLCluster`` with ``ClusterConfig(rollout_engine=functools.partial(
DominoTreeRollout, drafter_config=..., drafter_params=...), ...)`` and a ``TunixCausalLM``
actor (``tests/test_tunix_learner.py`` runs tunix's ``GRPOLearner`` this way), or directly:
``DominoTreeRollout(rollout_actor=dj.Target or TargetModel, tokenizer=...)``.

Parameters and meshes: the engine decodes with the arrays it is given, except those placed on a
mesh with ``AxisType.Explicit`` axes (``jax.make_mesh``'s default, which RLCluster reshards the
actor onto): ``decode`` is written for ``Auto`` meshes (XLA's partitioner places the
intermediates), so such arrays are copied once to the same devices and ``PartitionSpec`` on the
same mesh with ``Auto`` axes, at construction and at every ``update_params``. With an ``Auto``
mesh (``tunix.utils.mesh.create_mesh``, ``dominotree_jax.sharding.make_mesh``) a colocated
engine shares the actor's parameter variables (no copy; tunix then never calls
``update_params``, and each rollout reads the trainer's current values); with an ``Explicit``
one it holds that copy, which tunix sees as separate weights and refreshes through
``update_params`` after every global step.

The class composes one module per concern: ``engine_params`` (reading the actor, placement off
``Explicit`` axes, ``update_params`` / ``update_drafter_params`` values), ``engine_tokenizer``
and ``engine_batches`` (tunix prompts into padded batches, decoded rows into ``RolloutOutput``),
``engine_programs`` (the jitted decode and log-prob programs), ``auto_probe`` (the carried
``budget="auto"`` states and when a new drafter is probed), ``engine_metrics`` (``LastRollout``,
``tunix_metrics``), ``drafter_refresh`` (the refresh step) and ``placement`` (rows on the mesh).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.decoding.config import DecodeConfig
from dominotree_jax.precision import Precision
from dominotree_jax.rollout.auto_probe import AutoProbe, plain_config
from dominotree_jax.rollout.drafter_guard import DrafterGuard, drafted_tau
from dominotree_jax.rollout.drafter_refresh import DrafterRefresher
from dominotree_jax.rollout.engine_batches import (prompt_batch, prompt_pads_for, rollout_output,
                                                   row_stop_array, stop_ids)
from dominotree_jax.rollout.engine_metrics import LastRollout, tunix_metrics
from dominotree_jax.rollout.engine_params import (merged_target_params, placed_like, target_of,
                                                  without_explicit_axes)
from dominotree_jax.rollout.refresh_schedule import RefreshSchedule
from dominotree_jax.rollout.engine_programs import (RolloutPrograms, decode_config_for,
                                                   key_of_seed)
from dominotree_jax.rollout.engine_tokenizer import RolloutTokenizer
from dominotree_jax.rollout.placement import BatchPlacement
from dominotree_jax.rollout.prompt_history import PromptHistory
from dominotree_jax.rollout.trainer_logprobs import (padded_completions, trainer_model,
                                                      trainer_per_token_logps)
from dominotree_jax.rollout.tunix_model import TunixCausalLM
from dominotree_jax.rollout.tunix_types import BaseRollout, RolloutConfig, RolloutOutput


class DominoTreeRollout(BaseRollout):
    """tunix's ``BaseRollout`` sampling with ``decode`` (module docstring)."""

    def __init__(self, rollout_actor=None, tokenizer=None, mesh=None, rollout_config=None, *,
                 drafter_config=None, drafter_params=None, method: str = "dominotree",
                 budget: int = 16, node_topk: int = 8, top_m: int = 0, seed: int = 0,
                 return_features: bool = False, prompt_pads: str | None = None,
                 drafter_refresh: bool | dict | None = None, share_prefill: bool = True,
                 plain_calls: bool = True, clock: Callable[[], float] | None = None,
                 drafter_guard: bool = True, trainer_logprobs: bool = False,
                 compiler_options: dict | None = None,
                 **decode_options):
        """``rollout_actor``: the target (see ``engine_params.target_of``). ``tokenizer``: HF or
        tunix style (only needed for text prompts). ``mesh``/``rollout_config``: accepted for
        tunix's ``RLCluster``; the parameters are used where they are
        (``dominotree_jax.sharding`` places them), except that arrays on ``Explicit`` mesh axes
        are moved to ``Auto`` ones (module docstring).
        ``method``/``budget``/``node_topk``/``top_m``: ``DecodeConfig`` settings (``"ar"``
        needs no drafter). ``return_features``: keep the committed tokens' tapped target
        features of each rollout (``last.out.features``) for ``drafter_refresh``.
        ``prompt_pads``: how a pad id inside a prompt is read, the same way by the rollout and
        by the trainer scoring it. ``"keep"``: a real token (the engine conditions on it; the
        policy/reference must be ``TunixCausalLM(..., pad_id=pad)`` so that tunix's trainer
        scores it so too); ``"drop"``: padding, tunix's trainer's own reading (the engine
        removes pad ids from prompts before decoding). Default: ``"drop"`` when
        ``rollout_actor`` is a ``TunixCausalLM`` without a ``pad_id``, else ``"keep"``.
        ``drafter_refresh``: True or ``DrafterRefresher`` keyword arguments (``lr``,
        ``anchors``, ``rows``, ``vocab_ids``, ...) plus ``schedule`` (``"every"``, the
        default: a drafter step after every ``generate`` call; ``"adaptive"``: when
        ``refresh_schedule.RefreshSchedule`` says one is due).
        ``share_prefill``: prefill each distinct prompt of a ``generate`` call once and copy
        its caches to the rows repeating it (GRPO hands over G copies of each prompt); the
        samples are the same as without (``decode``'s ``prompt_rows``); one compilation per
        number of distinct prompts. Off on a multi-process mesh.
        ``plain_calls`` (``budget="auto"`` with a drafter): a call whose carried state would
        not run the drafter in its first round runs as ``ar`` (or ``lookup`` with
        ``lookup=K``), its rounds counted towards the next probe (``auto_probe``'s docstring);
        False: every call runs the drafting program.
        ``clock``: seconds now, e.g. ``time.perf_counter`` (module docstring). None (default):
        no timed decisions, the same seeds give the same rollouts. With ``plain_calls`` the
        engine times its calls on it and holds the drafting program back while its calls run
        slower than its ``ar`` calls (``auto_probe.CallRates``; not on a multi-process mesh,
        whose processes must all run one program); the refresh's time budget spends from it.
        The reported seconds (``last.seconds``, ``refresh_log``) are read from it too
        (``time.perf_counter`` without one).
        ``drafter_guard``: the stale-drafter guard (module docstring; ``drafter_guard``).
        ``trainer_logprobs``: ``generate``'s log-probs and ``get_per_token_logps`` computed by
        tunix's own ``compute_per_token_logps`` on the learner's arrays, bit for bit the
        trainer's on the same batch (``rollout/trainer_logprobs.py``; one teacher-forced
        forward per call; not with a rollout precision other than the parameters' own, nor
        on a multi-process mesh).
        ``compiler_options``: passed to ``jax.jit`` (e.g. a lower XLA optimisation level).
        Other keywords: ``DecodeConfig`` fields (``auto_sizes``, ``auto_costs``,
        ``draft_window``, ...). ``precision`` (one of them): the ``Precision`` the target and
        drafter parameters are held in, default: read from them (``self.precision``). A
        16-bit precision with float32 parameters (a trainer's master copy) rolls out from a
        copy cast to it, while the drafter refresh trains the float32 drafter and hands the
        engine its cast; a float32 precision with 16-bit parameters is refused by name.
        ``update_params`` casts to it."""
        if rollout_actor is None:
            raise ValueError("DominoTreeRollout needs rollout_actor (the target model)")
        self.tcfg, params = target_of(rollout_actor)
        self.prompt_pads = prompt_pads_for(rollout_actor, prompt_pads, tokenizer)
        self._model_pad = rollout_actor.pad_id if isinstance(rollout_actor, TunixCausalLM) \
            else None
        self.dcfg = drafter_config
        precision = decode_options.pop("precision", None)
        self.precision = (Precision.of_params(params, drafter_params) if precision is None
                          else Precision.of(precision))
        held, held_drafter = self.precision.narrowed(params, drafter_params)
        self.trainer_logprobs = bool(trainer_logprobs)
        self._trainer_model = None   # (the target parameters it was built from, the model)
        if self.trainer_logprobs and held is not params:
            raise ValueError("trainer_logprobs computes the trainer's bits from the parameters "
                             f"the engine holds; this engine rolls out a {self.precision} "
                             "copy of them: give it the trainer's precision")
        self.precision.check_params(held, held_drafter, what="rollout's precision")
        self._params = {"target": without_explicit_axes(held),
                        "drafter": without_explicit_axes(held_drafter)}
        self._tok = None if tokenizer is None else RolloutTokenizer(tokenizer)
        self._settings = dict(drafter=drafter_config, method=method, budget=budget,
                              node_topk=node_topk, top_m=top_m, precision=self.precision,
                              **decode_options)
        self.return_features = bool(return_features or drafter_refresh)
        self.share_prefill = bool(share_prefill)
        self.plain_calls = bool(plain_calls)
        if "call_clock" in decode_options:
            raise TypeError("call_clock is gone: pass clock=time.perf_counter for timed choices "
                            "(call_clock=True), or no clock (call_clock=False)")
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be None or a function returning seconds (e.g. "
                            f"time.perf_counter), got {clock!r}")
        self.clock = clock
        # get_per_token_logps' temperature: RLCluster's TRAIN rollout config, as its trainer's
        self._logp_temperature = (None if rollout_config is None
                                  else float(rollout_config.temperature))
        DecodeConfig(target=self.tcfg, return_features=self.return_features,
                     **self._settings)  # bad settings fail here, not at the first rollout
        if method != "ar" and drafter_params is None:
            raise ValueError(f"method {method!r} needs drafter_params")
        self._key = jax.random.key(seed)
        self.refresher = self.refresh_schedule = None
        self.refresh_log: list[dict] = []
        self.refreshed: dict | None = None   # the last call's refresh step (None: none)
        if drafter_refresh:
            opts = {} if drafter_refresh is True else dict(drafter_refresh)
            self.refresh_schedule = RefreshSchedule.of(opts.pop("schedule", "every"))
            opts.setdefault("compiler_options", compiler_options)
            self.refresher = DrafterRefresher(drafter_config, self.tcfg, drafter_params, **opts)
        self.programs = RolloutPrograms(self.tcfg, self.prompt_pads, compiler_options)
        self.traces, self.logp_traces = self.programs.traces, self.programs.logp_traces
        self.last: LastRollout | None = None
        self._last_temperature = 1.0
        self.auto_probe = AutoProbe()
        self.guard = DrafterGuard() if drafter_guard else None
        hist = int(decode_options.get("lookup_history", 0) or 0)
        self.history = PromptHistory(hist) if hist else None
        self.num_calls = 0

    # ------------------------------------------------------------------ BaseRollout
    def generate(self, prompts: Sequence[str | Sequence[int]], rollout_config: RolloutConfig,
                 stop_tokens: Sequence[Sequence[int]] | None = None, **kwargs) -> RolloutOutput:
        """Sample completions of ``prompts`` (strings, or token-id lists used as they are).
        ``stop_tokens``: optional per-prompt stop ids (one list per prompt, may be empty), on
        top of the ``rollout_config``'s (EOS, pad); a completion ends at (and drops) the first
        one of either. (The lists are a runtime ``[B, e]`` array: ``e`` is rounded up to a
        power of two, one compilation per ``e``.)"""
        if len(prompts) == 0:
            raise ValueError("generate needs at least one prompt")
        rc = rollout_config
        place = BatchPlacement.of(self._params["target"])
        if place.multi_process and self.refresher is not None:
            raise ValueError("drafter_refresh is not supported on a multi-process mesh (the "
                             "refresh step would train on every process's rows; untested)")
        if place.multi_process and self.history is not None:
            raise ValueError("lookup_history is not supported on a multi-process mesh (each "
                             "process would keep its own rows' history)")
        batch = prompt_batch(prompts, rc.max_prompt_length, self._tok, self.prompt_pads, place)
        stop = stop_ids(rc, self._tok)
        row_stops_Be = row_stop_array(stop_tokens, batch.size, self.tcfg.vocab_size, place)
        config = self.decode_config(rc)
        key = key_of_seed(rc.seed)
        if key is None:   # a fresh key per call
            self._key, key = jax.random.split(self._key)
        seconds_now = self.clock or time.perf_counter
        t0 = seconds_now()
        rows = place.global_rows(batch.size)
        ran = self.auto_probe.call_config(config, rows) if self.plain_calls else config
        guarded = (self.guard is not None and ran.uses_drafter
                   and not self.guard.allows_draft())
        if guarded:   # a stale drafter: the plain program (the same sampling as ``ar``)
            ran = plain_config(config)
        state = self.auto_probe.start_state(ran, rows)
        compiled = len(self.traces)
        history_BhW = None
        if ran.lookup_history:
            history_BhW = self.history.array(batch.prompt_BT, batch.lengths_B,
                                             ran.max_new_tokens)
        out, prompt_in, lengths_in = self.programs.decode(
            self._params, batch, key, state, row_stops_Be, ran, place, self.share_prefill,
            history_BhW)
        self.last = LastRollout(jnp.asarray(prompt_in), jnp.asarray(lengths_in), out,
                                seconds_now() - t0, plain=ran is not config,
                                method=ran.method)
        if self.history is not None:   # (outside the call's timed window)
            self.history.add(batch.prompt_BT, batch.lengths_B, np.asarray(out.tokens),
                             np.asarray(out.num_tokens))
        self.num_calls += 1
        # (not across processes: each would read its own clock, and all must run one program)
        timed = self.plain_calls and self.clock is not None and len(self.traces) == compiled \
            and not place.multi_process
        if guarded:   # (not the auto policy's plain call: nothing counts towards its probe)
            self.auto_probe.carry(ran, rows, out.auto_state)
        else:
            self.auto_probe.carry_call(
                config, ran, rows, out,
                self.last.num_tokens / self.last.seconds if timed else None)
        if self.guard is not None:
            if ran.uses_drafter:
                self.guard.observe(config, rows, drafted_tau(out), self.num_calls)
            elif self.guard.stale:
                self.guard.plain_call()
            self.last.stale = self.guard.stale
        if rc.temperature is not None:
            self._last_temperature = float(rc.temperature)
        self.refreshed = None
        if self.refresher is not None:
            if self.clock is not None:   # (without a clock the time budget holds nothing back)
                self.refresh_schedule.earn(self.last.seconds, self.auto_probe.gain(config, rows))
            if self.refresh_schedule.due():
                self._refresh()
        result = rollout_output(  # this process's rows
            place.local(out.tokens), place.local(out.num_tokens),
            place.local(out.logprobs) if rc.return_logprobs else None, stop, row_stops_Be,
            batch.left_BT, self._tok)
        if rc.return_logprobs and self.trainer_logprobs:
            if place.multi_process:
                raise ValueError("trainer_logprobs runs on one process")
            lp_BY = np.asarray(self.get_per_token_logps(
                result.left_padded_prompt_tokens,
                padded_completions(result.tokens, rc.max_tokens_to_generate, self.pad_id()),
                float(rc.temperature)))
            result = dataclasses.replace(
                result, logprobs=[lp_BY[b, :len(t)] for b, t in enumerate(result.tokens)])
        return result

    def get_per_token_logps(self, prompt_tokens, completion_tokens,
                            temperature: float | None = None) -> jax.Array:
        """``[B, Y]`` log-probs of the completions (tunix's layout: prompts left-padded,
        completions right-padded with ``pad_id``), one teacher-forced forward, as tunix's
        trainer computes them: at ``temperature`` (default: the engine's rollout temperature,
        module docstring; 0 is read as 1, as tunix does), the pad ids read per
        ``prompt_pads``; 0 at completion padding."""
        if temperature is None:
            temperature = self._logp_temperature
        if temperature is None:
            temperature = self._last_temperature
        if self.trainer_logprobs:
            held = self._params["target"]
            if self._trainer_model is None or self._trainer_model[0] is not held:
                self._trainer_model = (held, trainer_model(self.tcfg, held, self._model_pad))
            return trainer_per_token_logps(self._trainer_model[1], prompt_tokens,
                                           completion_tokens, self.pad_id(), self.eos_id(),
                                           float(temperature))
        return self.programs.per_token_logps(self._params["target"], prompt_tokens,
                                             completion_tokens, int(self.pad_id()),
                                             float(temperature))

    def update_params(self, params, filter_types=None) -> None:
        """New target parameter values (a ``TargetModel``/``TunixCausalLM`` module or state,
        or a nested dict; a subset is merged in, as tunix's vanilla rollout does, whatever
        ``filter_types`` chose them). Shapes must match; values are cast to the rollout dtype
        (and moved off ``Explicit`` mesh axes). No recompilation."""
        self._params = dict(self._params, target=without_explicit_axes(
            merged_target_params(self._params["target"], params)))

    def update_drafter_params(self, drafter_params, probe: bool = True) -> None:
        """New drafter parameter values (same structure), placed as the current ones (a
        refresh step's output carries the training mesh's sharding): no recompilation.
        ``probe``: ``budget="auto"`` probes the new drafter in its next round
        (``auto_size.probe_next``) instead of waiting out a gap learned with the old one, and
        a stale-drafter guard probes it in the next call."""
        self._params = dict(self._params, drafter=without_explicit_axes(
            placed_like(drafter_params, self._params["drafter"])))
        if probe:
            self.auto_probe.probe_all()
            if self.guard is not None:
                self.guard.new_drafter()

    def checkpoint_state(self) -> dict:
        """Host (numpy) copies of what the engine carries from rollout to rollout that is not
        the target's parameters (tunix checkpoints those): the PRNG key, the carried
        ``budget="auto"`` states (keyed by ``(DecodeConfig, rows)``), the last rollout
        temperature and, with the drafter refresh on, the refreshed drafter and the
        refresher's optimizer state. ``restore_checkpoint_state`` puts it back: the next
        rollouts are then those the saved engine would have made."""
        return {"key": np.asarray(jax.random.key_data(self._key)),
                "last_temperature": self._last_temperature,
                "refresher": None if self.refresher is None else self.refresher.checkpoint_state(),
                "refresh_schedule": None if self.refresh_schedule is None
                else self.refresh_schedule.checkpoint_state(),
                "drafter_guard": None if self.guard is None else self.guard.checkpoint_state(),
                "prompt_history": None if self.history is None
                else self.history.checkpoint_state(),
                "num_calls": self.num_calls,
                **self.auto_probe.checkpoint_state()}

    def restore_checkpoint_state(self, state: dict) -> None:
        """The inverse of ``checkpoint_state`` on an engine built with the same settings."""
        if (state["refresher"] is None) != (self.refresher is None):
            raise ValueError("the checkpointed engine state and this engine disagree on the "
                             "drafter refresh (one has it on, the other off)")
        self._key = jax.random.wrap_key_data(jnp.asarray(state["key"], jnp.uint32))
        self.auto_probe.restore_checkpoint_state(state)
        self._last_temperature = float(state["last_temperature"])
        self.num_calls = int(state.get("num_calls", 0))
        if self.guard is not None:   # (a state saved before the guard: a fresh one)
            self.guard = DrafterGuard.from_checkpoint(state.get("drafter_guard"))
        if self.history is not None and state.get("prompt_history") is not None:
            self.history = PromptHistory.from_checkpoint(state["prompt_history"])
        if self.refresher is not None:
            self.refresher.restore_checkpoint_state(state["refresher"])
            if state.get("refresh_schedule") is not None:   # (saved before it existed: kept)
                self.refresh_schedule = RefreshSchedule.from_checkpoint(
                    state["refresh_schedule"])
            self.update_drafter_params(self.refresher.state)

    def pad_id(self) -> int:
        if self._tok is None:
            raise ValueError("pad_id needs a tokenizer")
        return int(self._tok.pad_id())

    def eos_id(self) -> int:
        if self._tok is None:
            raise ValueError("eos_id needs a tokenizer")
        return int(self._tok.eos_id())

    def model(self) -> TunixCausalLM:
        pad = None
        if self.prompt_pads == "keep":
            pad = self._model_pad if self._model_pad is not None else self.pad_id()
        return TunixCausalLM.from_params(self.tcfg, self._params["target"], pad)

    # ------------------------------------------------------------------ helpers
    @property
    def params(self) -> dict:
        """``{"target": ..., "drafter": ...}`` as ``decode`` takes them."""
        return self._params

    @property
    def num_compilations(self) -> int:
        return len(self.traces)

    def _refresh(self) -> None:
        """One drafter step on the latest rollout's features; the engine decodes with the new
        drafter from the next ``generate`` on (probed per ``auto_probe.REPROBE_GAIN``)."""
        self._key, sub = jax.random.split(self._key)
        m = self.refresher.step(self._params["target"], self.last, sub,
                                self.clock or time.perf_counter)
        trend = self.refresh_schedule.record(float(m["chain_tau_before"]))
        # probed on the moving average: one call's chain τ is too noisy (~15 %) to call a gain
        probe = self.auto_probe.refresh_probes(self.refresh_schedule.ema)
        self.update_drafter_params(self.refresher.state, probe=probe)
        if self.clock is not None:
            self.refresh_schedule.spend(m["seconds"])
        self.refreshed = {**m, "step": self.refresher.num_steps, "trend": trend,
                          "next_gap": self.refresh_schedule.gap,
                          "batch": int(self.last.out.tokens.shape[0])}
        self.refresh_log.append(self.refreshed)

    def tunix_metrics(self, **unused) -> dict:
        """The latest rollout's acceptance and refresh step as ``(value, aggregation)`` pairs
        (``engine_metrics.tunix_metrics``): pass ``metric_fns=[engine.tunix_metrics]`` to a
        tunix learner (called once per rollout micro-batch) and they reach tunix's metrics
        logger each global step."""
        return tunix_metrics(self.last, [] if self.refreshed is None else [self.refreshed],
                             guarded=self.guard is not None)

    def decode_config(self, rc: RolloutConfig) -> DecodeConfig:
        """The ``DecodeConfig`` a ``RolloutConfig`` maps to (one compiled program each)."""
        return decode_config_for(self.tcfg, rc, stop_ids(rc, self._tok), self.return_features,
                             self._settings)
