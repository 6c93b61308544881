"""The stale-drafter guard: the rollout engine notices when the drafter's acceptance collapses
against its own recent record (after a weight update, or a drafter left behind by the policy),
and then stops drafting until a probe finds it healthy again.

A drafter goes stale or corrupt in RL runs without anything failing: the policy moves away from
it, a refresh writes bad values, a checkpoint of the wrong run is loaded. Every sample stays the
target's (verification is lossless whatever is drafted), but each drafted round then costs more
than a plain step and commits one token. The guard watches what the engine already has: the
tokens committed per drafted round of each call (``drafted_tau``; rounds of size 0 are plain
steps and not counted).

- **Record.** Per ``(DecodeConfig, rows)`` (temperature and batch shape change τ), a moving
  average of the drafted calls' τ (``RECORD_ALPHA``).
- **Collapse.** A drafted call whose excess ``τ − 1`` is below ``COLLAPSE`` times its record's:
  the drafter is *stale*. Every drafted call is judged, not only those after an
  ``update_params``: a colocated engine shares the actor's variables, and its weights change
  with no call at all. A record whose excess is under ``MIN_EXCESS`` has nothing to lose and
  never collapses. (One call's τ wanders ~15 %; halving its excess by chance is rare, and a
  false alarm costs two plain calls before the probe clears it.)
- **Fallback.** While stale, calls that would draft run the engine's plain program instead
  (``auto_probe.plain_config``: ``lookup`` with ``lookup=K``, else ``ar``): the same sampling
  as ``method="ar"``, so every sample is still exactly the target's.
- **Recovery.** A drafting call comes back as a probe after ``gap`` plain calls (doubling while
  the probes stay collapsed, up to ``MAX_GUARD_GAP``); a probe whose τ is no collapse clears the
  flag. A new drafter handed in by the caller (``update_drafter_params(..., probe=True)``) is
  probed in the next call. A probe under a config without a record of its own is judged
  against the lowest record the guard has.

Each collapse and recovery is an ``event`` (kept in ``events``, logged as a warning on the
``dominotree_jax.rollout`` logger) and the engine reports ``rollout/drafter_stale`` to tunix.
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp

from dominotree_jax.decoding.config import DecodeConfig
from dominotree_jax.rollout.backoff import ProbeBackoff, moving_average

COLLAPSE = 0.5      # a collapse: excess τ − 1 below this share of the record's
MIN_EXCESS = 0.25   # a record with less excess τ − 1 than this cannot collapse
RECORD_ALPHA = 0.3  # the newest drafted call's weight in the record
MAX_GUARD_GAP = 16  # plain calls between probes of a stale drafter, at most

log = logging.getLogger("dominotree_jax.rollout")


def drafted_tau(out) -> float | None:
    """Tokens committed per drafted round (draft size > 0) of a ``DecodeOutput``; None when no
    round drafted. (jnp reductions: also a multi-process global array.)"""
    drafted = out.draft_sizes > 0
    n, tokens = jax.device_get((jnp.sum(drafted),
                                jnp.sum(jnp.where(drafted, out.accept_lengths, 0))))
    return None if n == 0 else float(tokens) / int(n)


@dataclasses.dataclass
class DrafterGuard(ProbeBackoff):
    """The guard's state (module docstring); ``gap``/``waited``: when a stale drafter is probed."""
    stale: bool = False
    records: dict = dataclasses.field(default_factory=dict)   # (config, rows) -> τ record
    events: list = dataclasses.field(default_factory=list)

    def allows_draft(self) -> bool:
        """Whether the next call may run the drafting program."""
        return not self.stale or self.probe_due()

    def new_drafter(self) -> None:
        """A drafter handed in by the caller: a stale guard probes it in the next call."""
        if self.stale:
            self.gap, self.waited = 1, 0

    def plain_call(self) -> None:
        """A call the guard ran plain."""
        self.skipped()

    def collapsed(self, record: float | None, tau: float) -> bool:
        return (record is not None and record - 1.0 >= MIN_EXCESS
                and tau - 1.0 < COLLAPSE * (record - 1.0))

    def observe(self, config: DecodeConfig, rows: int, tau: float | None,
                call: int) -> dict | None:
        """A call that ran the drafting program and drafted ``tau`` per drafted round (None:
        no round drafted, nothing to judge). Returns the event it caused, if any."""
        if tau is None:
            return None
        key = (config, rows)
        record = self.records.get(key)
        if record is None and self.stale and self.records:
            record = min(self.records.values())
        event = None
        if self.collapsed(record, tau):
            if not self.stale:
                event = {"event": "collapsed", "call": call, "tau": tau, "record": record}
            self.stale = True
            self.probed(False, MAX_GUARD_GAP)
        else:
            if self.stale:
                event = {"event": "recovered", "call": call, "tau": tau, "record": record}
                self.stale = False
                self.probed(True, MAX_GUARD_GAP)
            self.records[key] = moving_average(self.records.get(key), tau, RECORD_ALPHA)
        if event is not None:
            self.events.append(event)
            log.warning(
                "drafter %s: %.2f tokens per drafted round against a record of %.2f (call %d); %s",
                event["event"], tau, record, call,
                "drafting paused, plain calls until a probe finds it healthy"
                if event["event"] == "collapsed" else "drafting again")
        return event

    def checkpoint_state(self) -> dict:
        return {"stale": self.stale, "gap": self.gap,
                "waited": self.waited, "records": dict(self.records)}

    @classmethod
    def from_checkpoint(cls, state: dict | None) -> "DrafterGuard":
        """The inverse of ``checkpoint_state`` (None: a state saved before the guard: fresh)."""
        if state is None:
            return cls()
        return cls(stale=bool(state["stale"]), gap=int(state["gap"]), waited=int(state["waited"]),
                   records={k: float(v) for k, v in state["records"].items()})
