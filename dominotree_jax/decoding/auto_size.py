"""Cost-aware draft size: ``DecodeConfig(budget="auto")`` (the CaDDTree idea, static shapes).

Every round picks one size ``n`` from a static set (``config.auto_sizes``, e.g. ``0, 2, 4, 8,
16`` tree nodes; ``0`` = a plain AR step) and verifies only the first ``n`` nodes of the draft
(``decode.py`` runs one ``lax.switch`` branch per size). Costs are in AR steps (the time of
one 1-row verify round at the same batch size) from a per-machine ``CostTable``.

The policy, all of it inside the jitted loop (``AutoState`` is part of the loop carry):

1. Draft or not, *before* drafting (a draft costs ~0.5-1.2 AR steps on a CPU whatever size is
   then verified): draft while ``rate`` -- an EMA of the tokens per AR step that drafted rounds
   really delivered, draft cost included -- is at least the AR rate ``1 / cost(0)``; otherwise
   take plain steps and draft again only as a probe, after ``gap`` rounds. The base gap is
   ``auto_probe_every``, raised to ``draft cost / PROBE_SHARE`` rounds when drafting is dear
   (so a useless drafter's probes cost at most ~4% of the time); it doubles after each probe
   that leaves ``rate`` below the AR rate, up to 16x the base, and resets when one lifts it
   above. ``rate`` starts optimistic, so the first round drafts. When even a strong drafter
   (3/4 of the longest path accepted) could not beat the AR rate at any size (a large batch
   on a CPU), no round drafts at all and the loop is compiled as plain steps.
2. Which size, once drafted: the drafter's scores are cumulative path log-probs in pop order
   (parents before children, best first), so the first ``n`` nodes are a valid subtree and
   ``E(n) = 1 + c * sum_{i<n} exp(score_i)`` is its expected committed tokens. ``c`` calibrates an
   over- (or under-) confident drafter: realised accepted nodes / predicted, EMAs over drafted
   rounds (a size-0 round still tells whether the target's token was one of the root's
   children). The draft cost is already paid, so the size maximising the round's surplus
   ``sum_rows E(n) - rho * rows * verify_cost(n)`` is the one that maximises the long-run rate
   ``rho`` (Dinkelbach); ``rho = max(AR rate, rate)``. One size serves the whole batch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp

COSTS_ENV = "DOMINOTREE_JAX_COSTS"   # path of a cost file that replaces the cached one
COSTS_VERSION = 1

# Defaults when this machine has no calibration (``python -m dominotree_jax.calibrate``): one
# target forward over ``m`` row-tokens (batch rows x verify rows) is modelled as ``1 + s (m - 1)``
# single-row steps (the weights are read once, then every row adds compute), so at batch ``B`` a
# verify of ``r`` rows costs ``(1 + s (B r - 1)) / (1 + s (B - 1))`` AR steps; ``s`` is set a
# little above the idle 2-core CPU's 0.084 (README round-stage table), erring towards plain steps.
# The draft (the drafter's block forward + chain/tree build) costs ``DEFAULT_DRAFT`` AR steps at
# batch 1 and grows with its ``8 B`` block rows by the same model.
DEFAULT_ROW_SLOPE = 0.1
DEFAULT_DRAFT = (("dflash", 0.5), ("domino", 0.9), ("ddtree", 0.5), ("condstatic", 0.55),
                 ("dominotree", 0.55))
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


RATE_START = 1.1       # initial ``rate`` (x the AR rate): optimistic, the first round drafts
RATE_ALPHA = 0.3       # EMA weight of the newest drafted round in ``rate``
CALIB_ALPHA = 0.2      # ... in the calibration EMAs
CALIB_MAX = 2.0        # largest calibration factor ``c``
MAX_GAP_FACTOR = 16    # the probe gap grows up to ``16 *`` its base
PLAUSIBLE_ACCEPT = 0.75  # share of the longest draft path a strong drafter gets accepted
PROBE_SHARE = 0.04     # base probe gap >= draft cost / this: a useless drafter's probes cost
                       # at most ~4% of the time, then halving as the gap doubles


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


def default_sizes(method: str, num_draft_positions: int) -> tuple[int, ...]:
    """Trees: ``0, 2, 4, 8, 16`` nodes; chains: ``0, 2, 4, 8, ...`` capped at (and ending
    with) the drafter's ``J`` positions."""
    if method in ("ddtree", "condstatic", "dominotree"):
        return (0, 2, 4, 8, 16)
    J = num_draft_positions
    sizes, n = [0], 2
    while n < J:
        sizes.append(n)
        n *= 2
    return tuple(sizes + [J])


def check_sizes(sizes, method: str, num_draft_positions: int) -> tuple[int, ...]:
    sizes = tuple(sizes)
    if (len(sizes) < 2 or sizes[0] != 0 or any(not isinstance(n, int) for n in sizes)
            or list(sizes) != sorted(set(sizes))):
        raise ValueError(f"auto_sizes must be ascending distinct ints starting at 0 with at least "
                         f"one positive size, got {sizes}")
    if method in ("dflash", "domino") and sizes[-1] > num_draft_positions:
        raise ValueError(f"auto_sizes {sizes}: a {method} chain has only {num_draft_positions} "
                         "draft positions")
    return sizes


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
    return hashlib.sha1(repr(sorted(fields.items())).encode()).hexdigest()[:12]


def machine_key(target_cfg, drafter_cfg) -> str:
    """Backend, device kind and the two models' shapes: what the costs depend on."""
    dev = jax.devices()[0]
    kind = getattr(dev, "device_kind", "") or dev.platform
    return (f"{jax.default_backend()}|{kind}|{os.cpu_count()}cpu|target-{_fingerprint(target_cfg)}"
            f"|drafter-{_fingerprint(drafter_cfg)}")


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


def load_costs(target_cfg, drafter_cfg, path: str | None = None) -> tuple[CostTable, ...]:
    """The calibrated tables for this machine and model pair, else ``default_tables()``."""
    path = path or cost_file_path()
    if not os.path.exists(path):
        if path == os.environ.get(COSTS_ENV):
            raise ValueError(f"{COSTS_ENV}={path}: no such cost file")
        return default_tables()
    entry = _read(path).get("machines", {}).get(machine_key(target_cfg, drafter_cfg))
    if not entry:
        return default_tables()
    try:
        tables = tuple(CostTable.from_json(t, source=path) for t in entry["tables"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"cost file {path}: bad entry for this machine ({e})") from e
    return tuple(sorted(tables, key=lambda t: t.batch)) or default_tables()


def save_costs(target_cfg, drafter_cfg, tables, path: str | None = None, info=None) -> str:
    """Write (or replace) this machine's entry in the cost file; returns its path."""
    path = path or cost_file_path()
    data = _read(path) if os.path.exists(path) else {"version": COSTS_VERSION, "machines": {}}
    data["machines"][machine_key(target_cfg, drafter_cfg)] = {
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


# ------------------------------------------------------------------ the in-loop policy

class AutoState(NamedTuple):
    """Policy state in the decode loop carry (all scalars)."""
    rate: jax.Array    # f32 EMA of tokens per row per AR step delivered by drafted rounds
    pred: jax.Array    # f32 EMA of predicted accepted nodes (drafter's own scores)
    real: jax.Array    # f32 EMA of accepted nodes
    since: jax.Array   # i32 rounds since the last drafted round
    gap: jax.Array     # i32 rounds between probes while not drafting


class SizeChoice(NamedTuple):
    index: jax.Array        # i32 scalar: index into ``sizes``
    predicted_B: jax.Array  # [B] f32 expected accepted nodes of the chosen size (uncalibrated)
    root_mass_B: jax.Array  # [B] f32 drafter probability of the root's children


class AutoPolicy:
    """The static side of the policy for one config and batch size."""

    def __init__(self, config, batch: int):
        self.sizes = config.draft_sizes
        table = table_for_batch(config.auto_costs, batch)
        self.verify_costs = tuple(table.verify_cost(n + 1) for n in self.sizes)
        self.draft_cost = table.draft_cost(config.method)
        self.ar_rate = 1.0 / self.verify_costs[0]
        self.probe_every = max(config.auto_probe_every,
                               math.ceil(self.draft_cost / PROBE_SHARE))
        # Can drafting pay at all? A round whose draft has 3/4 of its longest path accepted
        # (a strong drafter) commits ``1 + PLAUSIBLE_ACCEPT * min(n, J)`` tokens; when that
        # never beats the AR rate (a large batch on a CPU), no round drafts, not even a probe,
        # and the loop compiles to plain steps only.
        J = config.drafter.num_draft_positions
        self.can_pay = any((1 + PLAUSIBLE_ACCEPT * min(n, J)) / (self.draft_cost + v)
                           > self.ar_rate
                           for n, v in zip(self.sizes[1:], self.verify_costs[1:]))

    def init(self, carried: AutoState | None = None) -> AutoState:
        """The optimistic start, or a previous call's final state (``carried``)."""
        f32, i32 = jnp.float32, jnp.int32
        if carried is not None:
            if not isinstance(carried, AutoState):
                raise ValueError(f"auto_state must be a DecodeOutput.auto_state (AutoState), got "
                                 f"{type(carried).__name__}")
            return AutoState(*(jnp.asarray(x, t).reshape(()) for x, t in
                               zip(carried, (f32, f32, f32, i32, i32))))
        return AutoState(jnp.asarray(RATE_START * self.ar_rate, f32), jnp.ones((), f32),
                         jnp.ones((), f32), jnp.zeros((), i32),
                         jnp.asarray(self.probe_every, i32))

    def wants_draft(self, st: AutoState):
        if not self.can_pay:
            return jnp.zeros((), bool)
        return (st.rate >= self.ar_rate) | (st.since + 1 >= st.gap)

    def calibration(self, st: AutoState):
        return jnp.clip(st.real / jnp.maximum(st.pred, 1e-6), 0.0, CALIB_MAX)

    def choose(self, st: AutoState, draft, live_B) -> SizeChoice:
        """The size maximising the batch's expected surplus (see the module docstring)."""
        p_BN = jnp.where(draft.valid_BN, jnp.exp(draft.scores_BN.astype(jnp.float32)), 0.0)
        cum_BN = jnp.concatenate([jnp.zeros_like(p_BN[:, :1]), jnp.cumsum(p_BN, axis=1)], 1)
        pred_BS = cum_BN[:, jnp.asarray(self.sizes)]
        live_B = live_B.astype(jnp.float32)
        rows = jnp.maximum(live_B.sum(), 1.0)
        gain_S = jnp.sum(live_B[:, None] * (1.0 + self.calibration(st) * pred_BS), axis=0)
        rho = jnp.maximum(self.ar_rate, st.rate)
        surplus_S = gain_S - rho * rows * jnp.asarray(self.verify_costs, jnp.float32)
        index = jnp.argmax(surplus_S).astype(jnp.int32)   # ties: the smaller size
        root_mass_B = jnp.sum(jnp.where(draft.parents_BN < 0, p_BN, 0.0), axis=1)
        return SizeChoice(index, pred_BS[:, index], root_mass_B)

    def update(self, st: AutoState, drafted, choice: SizeChoice, committed_B, accepted_B,
               root_hit_B, live_B) -> AutoState:
        """After a round: ``committed_B`` tokens, ``accepted_B`` draft nodes; ``root_hit_B``:
        the target's first token was one of the root's children (informative at size 0)."""
        f32 = jnp.float32
        live_B = live_B.astype(f32)
        rows = jnp.maximum(live_B.sum(), 1.0)
        cost = self.draft_cost + jnp.asarray(self.verify_costs, f32)[choice.index]
        realized = jnp.sum(live_B * committed_B.astype(f32)) / (rows * cost)
        rate = (1 - RATE_ALPHA) * st.rate + RATE_ALPHA * realized
        size0 = choice.index == 0
        real = jnp.sum(live_B * jnp.where(size0, root_hit_B.astype(f32), accepted_B.astype(f32)))
        pred = jnp.sum(live_B * jnp.where(size0, choice.root_mass_B, choice.predicted_B))
        max_gap = MAX_GAP_FACTOR * self.probe_every
        probe = st.rate < self.ar_rate   # drafted only because the gap ran out
        gap = jnp.where((rate < self.ar_rate) & probe, jnp.minimum(2 * st.gap, max_gap),
                        self.probe_every)
        new = AutoState(rate, (1 - CALIB_ALPHA) * st.pred + CALIB_ALPHA * pred,
                        (1 - CALIB_ALPHA) * st.real + CALIB_ALPHA * real,
                        jnp.zeros_like(st.since), gap.astype(jnp.int32))
        skipped = st._replace(since=st.since + 1)
        return jax.tree.map(lambda a, b: jnp.where(drafted, a, b), new, skipped)
