"""Round costs for ``budget="auto"``: the default cost model and the calibrated cost file.

A ``CostTable`` holds, at one batch size, what a round costs in AR steps (the time of one
1-row verify round at the same batch size): the verify + accept + commit of ``r`` rows, and
each method's draft. ``DecodeConfig(budget="auto")`` uses ``auto_costs`` if given, else
``default_tables()``, the cost model below; it never reads a file. The per-machine table
that ``python -m dominotree_jax.calibrate`` measures is loaded explicitly, by
``load_calibrated_costs`` (``Pair.config(budget="auto")`` does so for you). The in-loop
policy that reads these costs is ``auto_size.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os

import jax

from dominotree_jax.precision import precision_name

COSTS_ENV = "DOMINOTREE_JAX_COSTS"   # path of a cost file that replaces the cached one
COSTS_VERSION = 1

# Defaults when this machine has no calibration (``python -m dominotree_jax.calibrate``): one
# target forward over ``m`` row-tokens (batch rows x verify rows) is modelled as ``1 + s (m - 1)``
# single-row steps (the weights are read once, then every row adds compute), so at batch ``B`` a
# verify of ``r`` rows costs ``(1 + s (B r - 1)) / (1 + s (B - 1))`` AR steps; ``s`` is set a
# little above the idle 2-core CPU's 0.084 (docs/results.md, round-stage table), erring
# towards plain steps.
# The draft (the drafter's block forward + chain/tree build) costs ``DEFAULT_DRAFT`` AR steps at
# batch 1 and grows with its ``8 B`` block rows by the same model.
DEFAULT_ROW_SLOPE = 0.1
DEFAULT_DRAFT = (("dflash", 0.5), ("domino", 0.9), ("ddtree", 0.5), ("condstatic", 0.55),
                 ("dominotree", 0.55), ("dspark", 0.55), ("dsparktree", 0.55), ("dflash2", 0.55),
                 ("dflash2tree", 0.55))
DEFAULT_ROWS = (1, 3, 5, 9, 17, 33)
DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
DRAFT_BLOCK_ROWS = 8


def _model_steps(m: int) -> float:
    return 1.0 + DEFAULT_ROW_SLOPE * (m - 1)


def default_verify(batch: int = 1) -> tuple[tuple[int, float], ...]:
    ar = _model_steps(batch)
    return tuple((r, round(_model_steps(batch * r) / ar, 4)) for r in DEFAULT_ROWS)


def default_draft(batch: int = 1) -> tuple[tuple[str, float], ...]:
    scale = (_model_steps(DRAFT_BLOCK_ROWS * batch) / _model_steps(DRAFT_BLOCK_ROWS)
             / _model_steps(batch))
    return tuple((m, round(d * scale, 4)) for m, d in DEFAULT_DRAFT)


@dataclasses.dataclass(frozen=True)
class CostTable:
    """Round costs in AR steps at one batch size (hashable: it is part of ``DecodeConfig``).

    ``verify``: ``(rows, cost)`` points, rows ascending from 1: the verify + accept + commit of
    ``rows`` rows in auto mode, linear between points and past the last one (1 row: auto mode's
    plain step, an ``ar`` step plus the drafter-context update, so slightly above 1.0).
    ``draft``: ``(method, cost)``: the drafter's block forward + the chain or tree build.
    """
    batch: int = 1
    verify: tuple[tuple[int, float], ...] = default_verify(1)
    draft: tuple[tuple[str, float], ...] = DEFAULT_DRAFT
    source: str = "default"

    def __post_init__(self):
        rows = [r for r, _ in self.verify]
        if len(rows) < 2 or rows[0] != 1 or rows != sorted(set(rows)):
            raise ValueError(f"cost table verify rows must start at 1 and ascend (at least two "
                             f"points), got {rows}")
        bad = [(r, c) for r, c in self.verify if not (c > 0 and math.isfinite(c))]
        bad += [(m, c) for m, c in self.draft if not (c >= 0 and math.isfinite(c))]
        if bad or self.batch < 1:
            raise ValueError(f"cost table has bad entries {bad} (batch {self.batch})")

    def verify_cost(self, rows: int) -> float:
        pts = self.verify
        for (r0, c0), (r1, c1) in zip(pts, pts[1:]):
            if rows <= r1 or (r1, c1) == pts[-1]:
                return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)
        raise AssertionError("unreachable")

    def draft_cost(self, method: str) -> float:
        table = dict(default_draft(self.batch)) | dict(self.draft)
        return table[method]

    @classmethod
    def default(cls, batch: int = 1) -> "CostTable":
        """The cost model's table at ``batch`` (see ``DEFAULT_ROW_SLOPE``)."""
        return cls(batch=batch, verify=default_verify(batch), draft=default_draft(batch))

    def to_json(self) -> dict:
        return {"batch": self.batch, "verify": [list(p) for p in self.verify],
                "draft": dict(self.draft), "source": self.source}

    @classmethod
    def from_json(cls, d: dict, source: str) -> "CostTable":
        return cls(batch=int(d["batch"]),
                   verify=tuple((int(r), float(c)) for r, c in d["verify"]),
                   draft=tuple((str(m), float(c)) for m, c in sorted(d["draft"].items())),
                   source=source)


# ------------------------------------------------------------------ the cost file

def cost_file_path() -> str:
    """``$DOMINOTREE_JAX_COSTS`` if set, else ``$XDG_CACHE_HOME/dominotree_jax/costs.json``
    (``~/.cache/...``)."""
    if os.environ.get(COSTS_ENV):
        return os.environ[COSTS_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dominotree_jax", "costs.json")


def _fingerprint(cfg) -> str:
    if cfg is None:
        return "none"
    fields = dataclasses.asdict(cfg)
    fields.pop("draft_window", None)   # a decode setting, not the model
    if fields.get("attention_impl") == "auto":  # the default: keys stored before it existed hold
        fields.pop("attention_impl")            # (the other modes cost differently: kept)
    return hashlib.sha1(repr(sorted(fields.items())).encode()).hexdigest()[:12]


def machine_key(target_cfg, drafter_cfg, precision="float32") -> str:
    """Backend, device kind, the two models' shapes and the target's precision (a name or a
    one-model ``precision.Precision``): what the costs depend on. float32 keys carry no
    precision suffix (cost files written before precisions existed stay valid)."""
    precision = precision_name(precision, "cost table precision")
    dev = jax.devices()[0]
    kind = getattr(dev, "device_kind", "") or dev.platform
    suffix = "" if precision == "float32" else f"|{precision}"
    return (f"{jax.default_backend()}|{kind}|{os.cpu_count()}cpu|target-{_fingerprint(target_cfg)}"
            f"|drafter-{_fingerprint(drafter_cfg)}{suffix}")


def _read(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"cost file {path} is not valid JSON ({e}); delete it or rerun "
                         "`python -m dominotree_jax.calibrate`") from e
    if not isinstance(data, dict) or data.get("version") != COSTS_VERSION:
        raise ValueError(f"cost file {path} is not a version-{COSTS_VERSION} cost file; delete it "
                         "or rerun `python -m dominotree_jax.calibrate`")
    return data


def default_tables() -> tuple[CostTable, ...]:
    """The cost model's tables at ``DEFAULT_BATCHES``."""
    return tuple(CostTable.default(b) for b in DEFAULT_BATCHES)


def load_calibrated_costs(target_cfg, drafter_cfg, path: str | None = None, *,
                          precision="float32") -> tuple[CostTable, ...]:
    """The calibrated tables for this machine, model pair and target precision (from ``path``,
    else ``cost_file_path()``), else ``default_tables()``. Reads the file and queries the devices
    (``machine_key``): call it outside jit and pass the result as ``auto_costs``."""
    path = path or cost_file_path()
    if not os.path.exists(path):
        if path == os.environ.get(COSTS_ENV):
            raise ValueError(f"{COSTS_ENV}={path}: no such cost file")
        return default_tables()
    entry = _read(path).get("machines", {}).get(machine_key(target_cfg, drafter_cfg, precision))
    if not entry:
        return default_tables()
    try:
        tables = tuple(CostTable.from_json(t, source=path) for t in entry["tables"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"cost file {path}: bad entry for this machine ({e})") from e
    return tuple(sorted(tables, key=lambda t: t.batch)) or default_tables()


def save_costs(target_cfg, drafter_cfg, tables, path: str | None = None, info=None, *,
               precision="float32") -> str:
    """Write (or replace) this machine's entry (for ``precision``) in the cost file; returns its
    path."""
    path = path or cost_file_path()
    data = _read(path) if os.path.exists(path) else {"version": COSTS_VERSION, "machines": {}}
    data["machines"][machine_key(target_cfg, drafter_cfg, precision)] = {
        "tables": [t.to_json() for t in tables], **(info or {})}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path


def table_for_batch(tables: tuple[CostTable, ...], batch: int) -> CostTable:
    """The table measured at the batch size nearest ``batch`` (log scale)."""
    return min(tables, key=lambda t: (abs(math.log(t.batch) - math.log(batch)), t.batch))
