"""The rollout engine's ``budget="auto"`` states, carried from rollout to rollout, and when a new
drafter is probed.

``decode``'s draft-size policy (``decoding.auto_size``) keeps a state (EMAs of what drafting
delivered, rounds until the next probe); the engine carries one per ``(DecodeConfig, rows)``,
so each rollout starts from what the previous ones measured. A new drafter makes every state
probe its next round (``auto_size.probe_next``) instead of waiting out a gap learned with the old
one; the drafter refresh, which brings a new drafter after every rollout, probes only when its
teacher-forced chain τ has risen by ``REPROBE_GAIN`` since the last probe (a probe each time
would cost a drafted round each rollout, whatever it found).
"""

from __future__ import annotations

import jax
import numpy as np

from dominotree_jax.decoding.auto_size import AutoState, initial_state, probe_next
from dominotree_jax.decoding.config import DecodeConfig

# the refresh's teacher-forced chain τ must rise by this factor since the last probe of
# budget="auto" before a refreshed drafter is probed again
REPROBE_GAIN = 1.1


class AutoProbe:
    """The carried ``budget="auto"`` states (``states``, keyed by ``(DecodeConfig, rows)``) and
    the drafter refresh's chain τ at the last probe (``probed_tau``; None before the first)."""

    def __init__(self):
        self.states: dict[tuple[DecodeConfig, int], AutoState] = {}
        self.probed_tau: float | None = None

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

    def probe_all(self) -> None:
        """A new drafter: every carried state drafts its next round as a probe."""
        self.states = {k: probe_next(v) for k, v in self.states.items()}

    def refresh_probes(self, chain_tau: float) -> bool:
        """Whether a refreshed drafter whose teacher-forced chain τ is ``chain_tau`` is probed:
        at the first refresh, then whenever τ reached ``REPROBE_GAIN`` times the τ of the last
        probe (which then becomes ``chain_tau``)."""
        probe = self.probed_tau is None or chain_tau >= REPROBE_GAIN * self.probed_tau
        if probe:
            self.probed_tau = chain_tau
        return probe

    def checkpoint_state(self) -> dict:
        """Host copies: ``{"auto_states": {key: state}, "probed_tau": τ or -1.0}``."""
        host = {k: jax.tree.map(np.asarray, v) for k, v in self.states.items()}
        return {"auto_states": host,
                "probed_tau": -1.0 if self.probed_tau is None else self.probed_tau}

    def restore_checkpoint_state(self, state: dict) -> None:
        """The inverse of ``checkpoint_state`` (``state`` may hold more entries; one without
        ``probed_tau`` reads as no probe yet)."""
        self.states = dict(state["auto_states"])
        probed = float(state.get("probed_tau", -1.0))
        self.probed_tau = None if probed < 0 else probed
