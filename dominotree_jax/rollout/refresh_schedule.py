"""When the rollout engine's drafter refresh takes a step: after every rollout call while its
drafter is still improving or falling behind the policy, less and less often while it is not.

A refresh step costs the same whatever it finds: ~0.11 s in the GRPO example (SmolLM2, decode
batch 4, 2 CPU cores), 7 % of a 1.6 s rollout call at its start and 24 % of a 0.5 s call once
the policy answered tersely. After every call, that is paid for ever, also once the drafter has
learned what the policy's samples allow (or when they are unpredictable). ``budget="auto"``
decides per round whether a draft pays; this decides per call whether a refresh step does, from
the one measure each step gives for free: the drafter's teacher-forced chain τ on the latest
rollout before the step (``chain_tau_before``). Its moving average (weight ``ema_weight`` on the
newest) is compared with ``best``, the highest average since the schedule last reset:

- **rising** (above ``rise`` x ``best``: a new high by default): the drafter is learning: a step
  after every call;
- **fallen** (at most ``best`` / ``fall``): the policy moved away from the drafter: a step after
  every call, ``best`` starting again from the fallen level;
- **flat** (between): the gap between steps doubles, up to ``max_gap`` calls.

The chain τ of one call is noisy (~15 % on the GRPO example's 4 rows x 4 anchors), far more than
what a learning drafter gains per call (~1 %), so a trend cannot be read from a few calls; the
average's new highs can: a learning drafter's average keeps making them, a flat one's makes them
ever more rarely. So a drafter that keeps gaining is refreshed at every call, and a flat one
costs at most one step per ``max_gap`` calls (0.11 s per 16 calls: at most 1.5 % of the GRPO
example's rollout time).

**A time budget on top** (``invest_share``), the refresh's own version of ``budget="auto"``'s
question whether a draft is worth its cost: a step's time is paid from a credit that each call
adds to, ``share x`` the call's seconds, where ``share`` is half of what drafting saves there
(``(gain - 1) / 2``, ``gain``: ``budget="auto"``'s delivered rate over the AR rate) and at least
``invest_share`` (3 %), what the refresh may invest while drafting saves nothing. A step the
schedule calls for waits until the credit covers the last step's time (the first step needs
none: it is paid back before the next). So where the drafter is not used (``auto`` takes plain
calls) the refresh costs at most ~3 % of the rollout time, however unpredictable the policy's
samples, and where drafting pays it may spend half of the gain, as the policy estimates it (in
the cost table's AR steps; in the GRPO example's lookup arm on a Zen 4 it promised more than
drafting delivered, and the refresh spent 6 %: docs/rl_results.md). The credit is capped at
``CREDIT_STEPS`` steps' time (no burst of steps after a long call). ``invest_share=None``: no
budget.

``every=True`` takes a step after every call (within the budget): the engine's default
(``drafter_refresh``'s ``schedule="every"``). Measured in the GRPO example (60 steps, Zen 5,
2026-12-05, before the budget; docs/rl_results.md): the adaptive schedule took 68 steps in 240
calls and spent 8.5 s on them against 28.6 s for a step after every call in an earlier run, but
its drafter reached a chain τ of 2.7 over the last 20 steps against 4.0: fewer steps learn less,
and it was the better drafter that made drafting pay (1.26x ``ar``); so it is opt-in until a
rule keeps both.
"""

from __future__ import annotations

import dataclasses

from dominotree_jax.rollout.backoff import ProbeBackoff, moving_average

CREDIT_STEPS = 2   # the budget's credit holds at most this many steps' time

@dataclasses.dataclass
class RefreshSchedule(ProbeBackoff):
    """The schedule's settings and its state (module docstring); a plain value. ``gap``: calls
    from one step to the next; ``waited``: calls since the last step."""
    every: bool = False       # a step after every call, whatever the chain τ does
    rise: float = 1.0         # the average above rise x ``best`` counts as learning
    fall: float = 1.15        # its loss below ``best`` that counts as falling behind
    max_gap: int = 16         # calls between steps, at most
    ema_weight: float = 0.25  # the newest chain τ's weight in the moving average
    ema: float | None = None  # the moving average of chain τ (None before the first step)
    best: float | None = None
    invest_share: float | None = 0.03   # the time budget's least share (None: no budget)
    credit: float = 0.0       # seconds of refresh the budget allows now
    step_seconds: float = 0.0  # the last step's time (0 before the first)

    def __post_init__(self):
        if not (self.rise >= 1.0 and self.fall >= 1.0 and self.max_gap >= 1
                and 0.0 < self.ema_weight <= 1.0
                and (self.invest_share is None or 0.0 <= self.invest_share <= 1.0)):
            raise ValueError(f"refresh schedule: rise and fall must be >= 1, max_gap >= 1 and "
                             f"ema_weight in (0, 1] and invest_share None or in [0, 1], got "
                             f"rise={self.rise}, fall={self.fall}, max_gap={self.max_gap}, "
                             f"ema_weight={self.ema_weight}, invest_share={self.invest_share}")

    @classmethod
    def of(cls, spec) -> "RefreshSchedule":
        """A schedule from ``drafter_refresh``'s ``schedule`` option: ``"adaptive"`` (default
        settings), ``"every"``, a ``RefreshSchedule`` or a dict of its settings."""
        if isinstance(spec, RefreshSchedule):
            return dataclasses.replace(spec)
        if spec == "adaptive":
            return cls()
        if spec == "every":
            return cls(every=True)
        if isinstance(spec, dict):
            return cls(**spec)
        raise ValueError(f"drafter_refresh schedule must be 'adaptive', 'every', a "
                         f"RefreshSchedule or a dict of its settings, got {spec!r}")

    def due(self) -> bool:
        """Whether the call that just ended takes a refresh step (call once per call, after
        ``earn``): the schedule calls for one and the budget's credit covers it."""
        if not self.every:
            due = self.probe_due()
            self.skipped()   # (until ``record``: a step taken starts the count afresh)
            if not due:
                return False
        return self.invest_share is None or self.credit >= self.step_seconds

    def earn(self, call_seconds: float, gain: float | None) -> None:
        """The budget's credit after a rollout call of ``call_seconds`` whose drafting
        delivered ``gain`` x the AR rate (module docstring); ``gain`` None: a config that
        drafts every round whatever it delivers (a fixed budget), whose steps the budget does
        not hold back."""
        if self.invest_share is None:
            return
        if gain is None:
            self.credit = max(self.credit, self.step_seconds)
            return
        share = max(self.invest_share, 0.5 * (gain - 1.0))
        credit = self.credit + share * call_seconds
        if self.step_seconds > 0:
            credit = min(credit, CREDIT_STEPS * self.step_seconds)
        self.credit = credit

    def spend(self, seconds: float) -> None:
        """A step of ``seconds`` was taken: paid from the credit."""
        self.step_seconds = float(seconds)
        if self.invest_share is not None:
            self.credit -= self.step_seconds

    def record(self, chain_tau: float) -> str:
        """A step was taken and measured ``chain_tau`` before it: the next gap. Returns what
        the average did: ``"rising"``, ``"fallen"`` or ``"flat"``."""
        self.ema = moving_average(self.ema, chain_tau, self.ema_weight)
        if self.best is None or self.ema > self.rise * self.best:
            self.best, trend = self.ema, "rising"
        elif self.ema * self.fall <= self.best:
            self.best, trend = self.ema, "fallen"
        else:
            trend = "flat"
        self.probed(trend != "flat", self.max_gap)
        return trend

    def checkpoint_state(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_checkpoint(cls, state: dict) -> "RefreshSchedule":
        state = dict(state)
        if "wait" in state:   # saved before ``waited``: it counted down the calls to the step
            state["waited"] = state["gap"] - state.pop("wait")
        return cls(**state)
