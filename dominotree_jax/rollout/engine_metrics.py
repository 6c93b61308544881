"""What the rollout engine keeps of its latest rollout (``LastRollout``) and the figures it
hands to tunix's metrics logger (``tunix_metrics``)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.decoding.decode import DecodeOutput


@dataclasses.dataclass
class LastRollout:
    """The arrays of the latest ``generate`` (device arrays; rows past ``num_prompts`` absent)."""
    prompt_BT: jax.Array       # right-padded prompt ids
    lengths_B: jax.Array       # prompt lengths
    out: DecodeOutput          # tokens, accept lengths, rounds, log-probs (and features)
    seconds: float             # wall time of the decode call (dispatch to ready)
    # a plain call (``auto_probe``): the budget="auto" state would not draft, so it ran as
    # ``method`` ``ar`` or ``lookup``
    plain: bool = False
    method: str = ""           # the method the call ran
    stale: bool = False        # the stale-drafter guard holds the drafter back after this call

    @property
    def tau(self) -> float:
        """Mean tokens committed per target forward over the batch."""
        return float(self.out.mean_tau())

    @property
    def num_tokens(self) -> int:
        return int(jnp.sum(self.out.num_tokens))

    @property
    def mean_draft_size(self) -> float:
        """Mean draft nodes verified per round (0 for ``ar``)."""
        if self.out.draft_sizes is None:
            return 0.0
        sizes = self.out.draft_sizes           # (jnp: also a multi-process global array)
        rounds = jnp.sum(sizes >= 0)
        return float(jnp.sum(jnp.where(sizes >= 0, sizes, 0)) / jnp.maximum(rounds, 1))


def tunix_metrics(last: LastRollout | None, refresh_log: list[dict],
                  guarded: bool = False) -> dict:
    """The latest rollout's acceptance (``rollout/tau``: tokens per target forward,
    ``rollout/draft_size``: mean draft nodes per round, ``rollout/seconds``; with the
    stale-drafter guard ``guarded``, ``rollout/drafter_stale``: 1 while it holds the drafter
    back, else 0) and, when
    ``refresh_log`` holds a drafter refresh step, the latest one's (``refresh/*``), as tunix's
    ``(value, aggregation)`` pairs; ``{}`` before the first rollout."""
    if last is None:
        return {}
    out = {"rollout/tau": (last.tau, np.mean),
           "rollout/draft_size": (last.mean_draft_size, np.mean),
           "rollout/seconds": (last.seconds, np.sum)}
    if guarded:
        out["rollout/drafter_stale"] = (float(last.stale), np.max)
    if refresh_log:
        r = refresh_log[-1]
        out.update({"refresh/loss": (r["loss"], np.mean),
                    "refresh/chain_tau_before": (r["chain_tau_before"], np.mean),
                    "refresh/seconds": (r["seconds"], np.sum),
                    "refresh/temp_bytes": (r.get("temp_bytes", 0), np.max),
                    "refresh/logits_bytes": (r["logits_bytes"], np.max)})
    return out
