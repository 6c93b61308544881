"""The best drafter of a training run, exported whenever it beats a reference on held-out τ.

A long run evaluates its drafter on held-out sequences every ``--eval-every`` steps
(``trainer.evaluate``: teacher-forced chain τ of the corrected head, ``tau_corr``).
``BestDrafter`` compares each evaluation with the reference drafter's τ on the same sequences
and anchors (for example the shipped drafter) and with every earlier export of the run; when
the new τ beats both, the drafter is written in the released format to ``<run>/best`` and
``<run>/best.json`` records its step, τ and the reference's τ. The record survives a resumed
run, so a resumed run only exports what beats its own best so far.
"""

from __future__ import annotations

import json
import os

from convert.drafter import save_drafter
from dominotree_jax.config import DrafterConfig
from dominotree_jax.train.data.shards import atomic_write

METRIC = "tau_corr"


def _read_record(run_dir: str, reference: str) -> dict | None:
    """``<run>/best.json`` if it was written against ``reference``, else ``None``."""
    path = os.path.join(run_dir, "best.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        rec = json.load(f)
    return rec if rec.get("reference") == reference else None


def recorded_reference_tau(run_dir: str, reference: str) -> float | None:
    """The reference's τ kept in ``<run>/best.json`` by an earlier call of this run, or
    ``None`` (no record, or one against another reference)."""
    rec = _read_record(run_dir, reference)
    return None if rec is None else float(rec["reference_tau"])


class BestDrafter:
    """``offer(params, metrics, step)`` exports ``params`` if ``metrics[METRIC]`` beats the
    reference and the best earlier export of this run."""

    def __init__(self, run_dir: str, dcfg: DrafterConfig, reference_tau: float,
                 reference: str = "reference", export_dtype: str = "bfloat16"):
        self.dir = os.path.join(run_dir, "best")
        self.record_path = os.path.join(run_dir, "best.json")
        self.dcfg, self.export_dtype = dcfg, export_dtype
        self.record = _read_record(run_dir, reference) or {
            "reference": reference, "reference_tau": float(reference_tau), "step": None,
            "tau": None}
        self._write_record()

    @property
    def bar(self) -> float:
        """The τ an evaluation has to exceed to be exported."""
        best = self.record["tau"]
        ref = self.record["reference_tau"]
        return ref if best is None else max(best, ref)

    def offer(self, params, metrics: dict, step: int) -> bool:
        tau = float(metrics[METRIC])
        if not tau > self.bar:
            return False
        save_drafter(self.dir, self.dcfg, params, dtype=self.export_dtype)
        self.record.update(step=int(step), tau=tau,
                           metrics={k: v for k, v in metrics.items() if k != "step"})
        self._write_record()
        return True

    def _write_record(self):
        text = json.dumps(self.record, indent=1).encode()
        atomic_write(self.record_path, lambda f: f.write(text))
