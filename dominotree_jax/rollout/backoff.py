"""The one policy the engine's host-side probe schedules share: a moving average of what each
probe measured, and a gap between probes that doubles while the probes do not pay (up to a
cap) and closes to 1 once they do.

``ProbeBackoff`` holds the gap and the calls waited since the last probe; the schedules that
use it (``auto_probe.LookupCalls`` and ``auto_probe.CallRates``, ``refresh_schedule``'s
``RefreshSchedule``) inherit its two fields, so their checkpoints stay flat dicts.
``moving_average`` is the average they all keep.
"""

from __future__ import annotations

import dataclasses


def moving_average(old: float | None, new: float, weight: float) -> float:
    """``new`` weighted ``weight``, the average so far ``1 - weight``; ``new`` itself when there
    is no average yet (``old`` None)."""
    return new if old is None else (1.0 - weight) * old + weight * new


@dataclasses.dataclass
class ProbeBackoff:
    """When the next probe comes: after ``gap`` calls, counting the probe's own call."""
    gap: int = 1      # calls from one probe to the next
    waited: int = 0   # calls since the last probe that did not probe

    def probe_due(self) -> bool:
        """Whether the next call is a probe: it is the ``gap``-th since the last one."""
        return self.waited + 1 >= self.gap

    def skipped(self) -> None:
        """A call that did not probe."""
        self.waited += 1

    def probed(self, paid: bool, max_gap: int) -> None:
        """A probe: the gap closes to 1 when it ``paid``, else doubles up to ``max_gap``."""
        self.gap = 1 if paid else min(2 * self.gap, max_gap)
        self.waited = 0
