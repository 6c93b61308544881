"""The rollout engine's ``budget="auto"`` states, carried from rollout to rollout, and when a new
drafter is probed.

``decode``'s draft-size policy (``decoding.auto_size``) keeps a state (EMAs of what drafting
delivered, rounds until the next probe); the engine carries one per ``(DecodeConfig, rows)``,
so each rollout starts from what the previous ones measured. A new drafter makes every state
probe its next round (``auto_size.probe_next``) instead of waiting out a gap learned with the old
one; the drafter refresh, which brings a new drafter after every rollout, probes only when the
moving average of its teacher-forced chain τ (``RefreshSchedule.ema``) has risen by
``REPROBE_GAIN`` since the last probe (a probe each time would cost a drafted round each
rollout, whatever it found; one call's chain τ wanders ~15 %, so the raw value rose 10 % by
chance about every other refresh step: in a bf16 GRPO run on a Zen 4 ~1 call in 4 ran the
drafting program while the drafter never paid, and such a call cost ~17 % over ``ar``).

A call whose carried state would not run the drafter in its first round (``rate`` below the AR
rate and no probe due: ``AutoPolicy.wants_draft``) runs as a *plain call*: ``plain_config``,
the same sampling as ``method="ar"`` (or ``method="lookup"`` with the same lookup paths when
``lookup=K``: the rounds the drafter sits out verify them), so it pays none of what a policy
that does not draft still pays in a drafting program (the prompt's drafter context, keeping it
current each round, the first round's draft decision): ``auto`` ran 0.93-0.95x ``ar`` in GRPO
rollouts it rightly did not draft in. Its rounds count towards the state's probe gap
(``since``), so the call in which the gap runs out drafts a probe in its first round, as a
drafting program would in that round; a new drafter (``probe_all``) makes the next call probe.
Samples are the target's either way (every method is lossless).

With ``lookup=K`` a plain call is a lookup-only program, which pays per round for the search
and the size decision (~5 % of a plain step at batch 4) and gains only where the text copies
itself. So the calls keep a record of their own (``LookupCalls``): what each lookup-only call
delivered, tokens per AR step over the AR rate (``call_gain``, from its rounds' sizes and the
cost table), as a moving average; while that is below ``LOOKUP_PAYS`` (1.05: the table does not
price the search) the plain calls run ``ar``, and a lookup-only call comes back as a probe
after ``gap`` calls (doubling while it does not pay, up to ``MAX_LOOKUP_GAP``; 1 once it
pays).

**The calls' own clock** (``CallRates``). The carried state decides from the cost table, which
prices a round in AR steps measured outside rollouts; inside them a drafting call may cost more
than the table says (a bf16 GRPO run on a Zen 4 on the host's calibrated table drafted 79 of 192
calls and ran 0.90x ``ar``), and nothing in the state can see that. So the engine times its calls
(committed tokens per second of wall time, a moving average per program: drafting, ``ar``,
lookup-only; a call that compiled a program is not counted) and holds the drafting program back
while its calls are measured slower than the ``ar`` ones: a drafting call then runs only as a
probe, after ``gap`` plain calls (doubling while drafting stays slower, up to
``MAX_CLOCK_GAP``; 1 once it is faster). A lookup-only call's record (``LookupCalls``) reads its
measured speed over ``ar``'s instead of the table's estimate (in a bf16 GRPO lookup arm on the
Zen 4 lookup-only calls at τ 1.6-2.0 ran 0.80-0.93x ``ar``). A new drafter (``probe_all``)
clears the drafting calls' measure, so its first call is timed afresh; after
``REFERENCE_EVERY`` calls without an ``ar`` one the next plain call runs ``ar`` to re-time the
reference. The refresh's time budget reads the measured gain where it says less than the table
(``gain``). Samples are the target's whichever program runs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.decoding.auto_size import AutoPolicy, AutoState, initial_state, probe_next
from dominotree_jax.decoding.config import DecodeConfig
from dominotree_jax.rollout.backoff import ProbeBackoff, moving_average

# the refresh's teacher-forced chain τ must rise by this factor since the last probe of
# budget="auto" before a refreshed drafter is probed again
REPROBE_GAIN = 1.1
LOOKUP_ALPHA = 0.5    # the newest lookup-only call's weight in ``LookupCalls.gain``
# a lookup-only call pays when its rounds deliver this much more than ``ar``'s per AR step of
# the cost table: its rounds also search the text and decide a size, which the table does not
# price (an auto round's cond and size switch alone cost ~4 % of a plain step at batch 4, Zen 5)
LOOKUP_PAYS = 1.05
MAX_LOOKUP_GAP = 16   # plain ``ar`` calls between lookup-only probes, at most
CLOCK_ALPHA = 0.5     # the newest call's weight in ``CallRates``' moving averages
MAX_CLOCK_GAP = 16    # plain calls between drafting probes while drafting calls are slower
REFERENCE_EVERY = 16  # calls without an ``ar`` one before a plain call re-times ``ar``


@dataclasses.dataclass
class LookupCalls(ProbeBackoff):
    """The plain calls' record of one ``lookup=K`` config (module docstring); ``gap`` and
    ``waited`` (``ar`` calls since the last lookup-only one): when a lookup-only call comes back
    while it does not pay."""
    gain: float = LOOKUP_PAYS   # moving average of the lookup-only calls' ``call_gain``

    def wants_lookup(self) -> bool:
        return self.gain >= LOOKUP_PAYS or self.probe_due()

    def record(self, gain: float) -> None:
        self.gain = moving_average(self.gain, gain, LOOKUP_ALPHA)
        self.probed(self.gain >= LOOKUP_PAYS, MAX_LOOKUP_GAP)


@dataclasses.dataclass
class CallRates(ProbeBackoff):
    """The measured speed of one ``(config, rows)``'s calls (module docstring): committed tokens
    per second, moving averages per program (0.0: not measured yet); ``gap`` and ``waited``
    (plain calls since the last drafting one): when a drafting call comes back as a probe
    while drafting is slower."""
    drafting: float = 0.0   # calls that ran the drafting program
    ar: float = 0.0         # plain ``ar`` calls: the reference
    lookup: float = 0.0     # lookup-only plain calls (``lookup=K``)
    since_ar: int = 0       # calls since the last ``ar`` one

    def slower(self) -> bool:
        """Whether drafting calls are measured slower than ``ar`` ones (both measured)."""
        return 0.0 < self.drafting < self.ar

    def wants_reference(self) -> bool:
        """Whether the next call runs ``ar`` to re-time the reference."""
        return self.since_ar >= REFERENCE_EVERY

    def allows_draft(self) -> bool:
        """Whether a call whose state wants to draft may run the drafting program."""
        if self.wants_reference():
            return False
        return not self.slower() or self.probe_due()

    def over_ar(self, tokens_per_s: float) -> float | None:
        """``tokens_per_s`` over the ``ar`` calls' (None before one is measured)."""
        return tokens_per_s / self.ar if self.ar > 0.0 else None

    def record(self, kind: str, tokens_per_s: float) -> None:
        """One timed call of ``kind``: ``"drafting"``, ``"ar"`` or ``"lookup"``."""
        old = getattr(self, kind)
        setattr(self, kind, moving_average(old if old > 0.0 else None, tokens_per_s,
                                           CLOCK_ALPHA))
        self.since_ar = 0 if kind == "ar" else self.since_ar + 1
        if kind == "drafting":
            self.probed(not self.slower(), MAX_CLOCK_GAP)
        else:
            self.skipped()

    def new_drafter(self) -> None:
        """A new drafter: its calls are timed afresh, the next one may draft."""
        self.drafting, self.gap, self.waited = 0.0, 1, 0

    def gain(self) -> float | None:
        """Drafting calls' speed over ``ar`` calls' (None until both are measured)."""
        return None if self.drafting <= 0.0 else self.over_ar(self.drafting)


def call_gain(policy: AutoPolicy, out) -> float:
    """What an ``auto`` call under ``policy`` (its config and rows) delivered against ``ar``:
    committed tokens per AR step of its rounds (each row's round priced at the cost table's
    verify of its size) x the AR step's cost: 1.0 is ``ar``'s rate."""
    sizes_BY = out.draft_sizes               # (jnp: also a multi-process global array)
    ran_BY = sizes_BY >= 0
    index_BY = jnp.searchsorted(jnp.asarray(policy.sizes), jnp.maximum(sizes_BY, 0))
    cost_BY = jnp.asarray(policy.verify_costs, jnp.float32)[index_BY]
    spent = float(jnp.sum(jnp.where(ran_BY, cost_BY, 0.0)))
    tokens = float(jnp.sum(jnp.where(ran_BY, out.accept_lengths, 0)))
    return tokens * policy.verify_costs[0] / max(spent, 1e-9)


def plain_config(config: DecodeConfig, lookup: bool = True) -> DecodeConfig:
    """What a plain call of a drafting ``budget="auto"`` config runs: ``method="lookup"``
    (``budget="auto"``, the same lookup settings) when ``config`` verifies lookup paths and
    ``lookup``, else ``method="ar"``; it keeps the drafter config only to return its features
    (``return_features``: the drafter refresh trains on them)."""
    drafter = config.drafter if config.return_features else None
    if config.lookup_paths and lookup:
        return config.replace(method="lookup", drafter=drafter,
                              lookup_length=config.lookup_path_length)
    return config.without_lookup(method="ar", drafter=drafter)


class AutoProbe:
    """The carried ``budget="auto"`` states (``states``, keyed by ``(DecodeConfig, rows)``) and
    the drafter refresh's chain τ at the last probe (``probed_tau``; None before the first)."""

    def __init__(self):
        self.states: dict[tuple[DecodeConfig, int], AutoState] = {}
        self.probed_tau: float | None = None
        self.lookup_calls: dict[tuple[DecodeConfig, int], LookupCalls] = {}
        self.call_rates: dict[tuple[DecodeConfig, int], CallRates] = {}
        self._policies: dict[tuple[DecodeConfig, int], AutoPolicy] = {}

    def policy(self, config: DecodeConfig, rows: int) -> AutoPolicy:
        """The ``AutoPolicy`` of ``rows`` rows under ``config``, made once."""
        key = (config, rows)
        if key not in self._policies:
            self._policies[key] = AutoPolicy(config, rows)
        return self._policies[key]

    def start_state(self, config: DecodeConfig, rows: int) -> AutoState | None:
        """The state a decode of ``rows`` rows under ``config`` starts from (None unless
        ``config.is_auto``): the carried one, else the initial one, as host (NumPy) values, so
        the first and the carried state trace alike (a carried device state would hold the
        mesh's sharding, the first one none)."""
        if not config.is_auto:
            return None
        carried = self.states.get((config, rows))
        state = initial_state(config, rows) if carried is None else carried
        return jax.tree.map(np.asarray, state)

    def carry(self, config: DecodeConfig, rows: int, state: AutoState | None) -> None:
        """Keep a decode's final state (``DecodeOutput.auto_state``) for the next one."""
        if config.is_auto:
            self.states[(config, rows)] = state

    def call_config(self, config: DecodeConfig, rows: int) -> DecodeConfig:
        """The config a call of ``rows`` rows under ``config`` runs: ``plain_config(config)``
        when the carried state would not run the drafter in the call's first round (module
        docstring), else ``config``. A first call (no carried state) drafts."""
        carried = self.states.get((config, rows))
        if not (config.is_auto and config.uses_drafter) or carried is None:
            return config
        policy = self.policy(config, rows)
        rates = self.call_rates.get((config, rows), CallRates())
        if bool(policy.wants_draft(policy.init(carried))) and rates.allows_draft():
            return config
        calls = self.lookup_calls.get((config, rows), LookupCalls())
        return plain_config(config, lookup=calls.wants_lookup() and not rates.wants_reference())

    def carry_call(self, config: DecodeConfig, ran: DecodeConfig, rows: int, out,
                   tokens_per_s: float | None = None) -> None:
        """After a call under ``config`` that ran ``ran`` (``call_config``'s) and returned
        ``out`` (a ``DecodeOutput``): keep the final state of what ran, and after a plain call
        count its rounds towards ``config``'s probe gap (up to the round before the gap runs
        out: the next call then probes in its first round). ``tokens_per_s``: the call's
        measured speed for the calls' own clock (None: not timed; the engine does not time a
        call that compiled a program); a lookup-only call's record then reads it over the
        ``ar`` calls' speed instead of the cost table's estimate."""
        self.carry(ran, rows, out.auto_state)
        rates = None
        if tokens_per_s is not None and config.is_auto and config.uses_drafter:
            rates = self.call_rates.setdefault((config, rows), CallRates())
            rates.record("drafting" if ran is config else "lookup" if ran.is_auto else "ar",
                         tokens_per_s)
        if ran is config:
            return
        if config.lookup_paths:   # the plain calls' record: a lookup-only call, or one more ar call
            calls = self.lookup_calls.setdefault((config, rows), LookupCalls())
            if ran.is_auto:
                measured = None if rates is None else rates.over_ar(tokens_per_s)
                calls.record(call_gain(self.policy(ran, rows), out) if measured is None
                             else measured)
            else:
                calls.skipped()
        st = self.states[(config, rows)]
        rounds = int(jax.device_get(jnp.max(out.num_rounds)))
        since = np.minimum(np.asarray(st.since) + rounds,
                           np.maximum(np.asarray(st.gap) - 1, 0)).astype(np.int32)
        self.states[(config, rows)] = st._replace(since=since)

    def gain(self, config: DecodeConfig, rows: int) -> float | None:
        """What drafting delivers under ``config`` over the AR rate: the carried state's
        ``rate`` x the AR step's cost, or the calls' own clock where it says less (1.0 before
        a first call; None for a fixed budget, which drafts every round whatever it
        delivers)."""
        if not config.uses_drafter:
            return 1.0
        if not config.is_auto:
            return None
        carried = self.states.get((config, rows))
        if carried is None:
            return 1.0
        table = float(np.asarray(carried.rate)) / self.policy(config, rows).ar_rate
        rates = self.call_rates.get((config, rows))
        measured = None if rates is None else rates.gain()
        return table if measured is None else min(table, measured)

    def probe_all(self) -> None:
        """A new drafter: every carried state drafts its next round as a probe, and the
        drafting calls are timed afresh."""
        self.states = {k: probe_next(v) for k, v in self.states.items()}
        for rates in self.call_rates.values():
            rates.new_drafter()

    def refresh_probes(self, chain_tau: float) -> bool:
        """Whether a refreshed drafter whose teacher-forced chain τ (the engine passes its moving
        average) is ``chain_tau`` is probed: at the first refresh, then whenever τ reached
        ``REPROBE_GAIN`` times the τ of the last probe (which then becomes ``chain_tau``)."""
        probe = self.probed_tau is None or chain_tau >= REPROBE_GAIN * self.probed_tau
        if probe:
            self.probed_tau = chain_tau
        return probe

    def checkpoint_state(self) -> dict:
        """Host copies: ``{"auto_states": {key: state}, "probed_tau": τ or -1.0,
        "lookup_calls": {key: LookupCalls fields}, "call_rates": {key: CallRates fields}}``."""
        host = {k: jax.tree.map(np.asarray, v) for k, v in self.states.items()}
        return {"auto_states": host,
                "probed_tau": -1.0 if self.probed_tau is None else self.probed_tau,
                "lookup_calls": {k: dataclasses.asdict(v) for k, v in self.lookup_calls.items()},
                "call_rates": {k: dataclasses.asdict(v) for k, v in self.call_rates.items()}}

    def restore_checkpoint_state(self, state: dict) -> None:
        """The inverse of ``checkpoint_state`` (``state`` may hold more entries; one without
        ``probed_tau`` reads as no probe yet)."""
        self.states = dict(state["auto_states"])
        probed = float(state.get("probed_tau", -1.0))
        self.probed_tau = None if probed < 0 else probed
        self.lookup_calls = {k: LookupCalls(**v)
                             for k, v in state.get("lookup_calls", {}).items()}
        self.call_rates = {k: CallRates(**v) for k, v in state.get("call_rates", {}).items()}
