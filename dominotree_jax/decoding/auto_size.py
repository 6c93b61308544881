"""Cost-aware draft size: ``DecodeConfig(budget="auto")`` (the CaDDTree idea, static shapes).

Every round picks one size ``n`` from a static set (``config.auto_sizes``, e.g. ``0, 2, 4, 8,
16`` tree nodes; ``0`` = a plain AR step) and verifies only the first ``n`` nodes of the draft
(``round.auto_round`` runs one ``lax.switch`` branch per size). Costs are in AR steps (the time
of one 1-row verify round at the same batch size) from ``config.auto_costs``, ``CostTable``s
(``costs.py``: the default cost model, or a calibrated table loaded explicitly).

This docstring is the one description of the policy; the README and docs/ link here.

The policy, all of it inside the jitted loop (``AutoState`` is part of the loop carry):

1. Draft or not, *before* drafting (a draft costs ~0.5-1.2 AR steps on a CPU whatever size is
   then verified): draft while ``rate`` -- an EMA of the tokens per AR step that drafted rounds
   really delivered, draft cost included -- is at least the AR rate ``1 / cost(0)``; otherwise
   take plain steps and draft again only as a probe, after ``gap`` rounds. The base gap is
   ``auto_probe_every``, raised to ``draft cost / PROBE_SHARE`` rounds when drafting is dear
   (so a useless drafter's probes cost at most ~4% of the time); it doubles after each probe
   that leaves ``rate`` below the AR rate, up to 16x the base, and resets when one lifts it
   above. A probe's round counts more in ``rate`` than other drafted rounds (``PROBE_ALPHA``:
   the estimate it updates dates from before the plain stretch). ``rate`` starts optimistic,
   so the first round drafts. When even a strong drafter (3/4 of the longest path accepted)
   could not beat the AR rate at any size (a large batch on a CPU), no round drafts at all and
   the loop is compiled as plain steps. ``method="lookup"`` has no drafter: no round drafts,
   and each verifies lookup paths at the size point 2 picks from their scores (or is a plain
   step), as the rounds a drafter sits out do with ``lookup=K``.
2. Which size, once drafted: the drafter's scores are cumulative path log-probs in pop order
   (parents before children, best first), so the first ``n`` nodes are a valid subtree and
   ``E(n) = 1 + c * sum_{i<n} exp(score_i)`` is its expected committed tokens. ``c`` calibrates an
   over- (or under-) confident drafter: realised accepted nodes / predicted, EMAs over drafted
   rounds (a size-0 round still tells whether the target's token was one of the root's
   children); it starts at ``CALIB_PRIOR`` (drafters are overconfident, at every temperature)
   and again when the drafter changes. The draft cost is already paid, so the size maximising
   the round's surplus ``sum_rows E(n) - rho * rows * verify_cost(n)`` is the one that
   maximises the long-run rate ``rho`` (Dinkelbach); ``rho = max(AR rate, rate)``. Each row's
   ``E(n)`` of the chosen size goes out as ``DecodeOutput.predicted_lengths`` (1 at a plain
   step), to compare with what was committed.
3. Rows on their own: ``c`` is kept per row as well (``row_pred``/``row_real``, and the same for
   lookup-only rounds), started each call from the batch's ``c`` and then following that row's
   own accepted / predicted nodes, so a row that keeps accepting counts with its larger ``c``
   and one that does not with its smaller one in ``sum_rows E(n)``. The rows' surpluses add up
   to the batch's, and within fixed shapes every row pays for the largest size verified, so one
   size serves the batch and each row verifies all of its nodes (a row cut to a smaller subtree
   would save no compute and lose expected tokens); a row that does not accept commits one
   token, as a plain step would. The batch-level EMAs are what a next call starts from (its rows
   are new texts).
4. Sources, with lookup drafting (``lookup=K`` beside a drafter): each round first finds the
   lookup paths (no drafter pass) and the size they would get alone (point 2, with the lookup
   rounds' own calibration). When that size verifies nodes, the drafter runs only if drafted
   rounds have delivered (``rate``) at least the tokens per AR step that lookup-only round
   expects; a round whose text the lookup paths already copy well skips the drafter's cost.
   ``rate`` then learns only from drafted rounds whose lookup paths alone were not worth a
   verify: what the drafter delivers by itself, not the copied tokens a merged tree also holds.
   So each round is a plain step, lookup only, or the drafter's tree with the lookup paths
   merged in (both; the drafter alone where the lookup finds nothing).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp

from dominotree_jax.decoding.costs import table_for_batch
from dominotree_jax.tree.builder import TREE_METHODS

if TYPE_CHECKING:   # shape annotations only; tests check them (tests/shape_check.py)
    from jaxtyping import Array, Float, Int

RATE_START = 1.1       # initial ``rate`` (x the AR rate): optimistic, the first round drafts
RATE_ALPHA = 0.3       # EMA weight of the newest drafted round in ``rate``
# ... of a probe's round: ``rate`` was last updated before the plain stretch the probe ends, so
# it may be stale (the drafter or the text has changed since); with RATE_ALPHA, a drafter that
# became good needed several probes at doubling gaps to lift ``rate`` from below the AR rate
# (the GRPO example's final policy, ~6 rounds a call: no draft in 20 calls). Measured
# acceptance of one round is noisy, so not 1: a lucky probe costs a few drafted rounds.
PROBE_ALPHA = 0.5
CALIB_ALPHA = 0.2      # ... in the calibration EMAs
CALIB_MAX = 2.0        # largest calibration factor ``c``
# ``c`` before any round has measured it: a drafter's path probabilities overpredict its
# accepted nodes ~1.5-1.9x at every temperature (shipped SmolLM2 pair, T 0 / 0.7 / 0.9 / 1:
# c = 0.64 / 0.65 / 0.59 / 0.52; ``methods temperature_accept`` @ ad0568c), so the
# policy starts from that, not from trusting the drafter
CALIB_PRIOR = 0.6
MAX_GAP_FACTOR = 16    # the probe gap grows up to ``16 *`` its base
PLAUSIBLE_ACCEPT = 0.75  # share of the longest draft path a strong drafter gets accepted
PROBE_SHARE = 0.04     # base probe gap >= draft cost / this: a useless drafter's probes cost
                       # at most ~4% of the time, then halving as the gap doubles


def default_sizes(method: str, num_draft_positions: int | None) -> tuple[int, ...]:
    """Trees and lookup paths: ``0, 2, 4, 8, 16`` nodes; chains: ``0, 2, 4, 8, ...`` capped
    at (and ending with) the drafter's ``J`` positions."""
    if method in TREE_METHODS + ("lookup",):
        return (0, 2, 4, 8, 16)
    J = num_draft_positions
    sizes, n = [0], 2
    while n < J:
        sizes.append(n)
        n *= 2
    return tuple(sizes + [J])


def check_sizes(sizes, method: str, num_draft_positions: int | None) -> tuple[int, ...]:
    sizes = tuple(sizes)
    if (len(sizes) < 2 or sizes[0] != 0 or any(not isinstance(n, int) for n in sizes)
            or list(sizes) != sorted(set(sizes))):
        raise ValueError(f"auto_sizes must be ascending distinct ints starting at 0 with at least "
                         f"one positive size, got {sizes}")
    if method not in TREE_METHODS + ("lookup",) and sizes[-1] > num_draft_positions:
        raise ValueError(f"auto_sizes {sizes}: a {method} chain has only {num_draft_positions} "
                         "draft positions")
    return sizes


class AutoState(NamedTuple):
    """Policy state in the decode loop carry (scalars, and ``[B]`` per-row calibrations)."""
    rate: Float[Array, ""]  # EMA of tokens per row per AR step delivered by drafted rounds
    pred: Float[Array, ""]  # EMA of predicted accepted nodes (drafter's own scores)
    real: Float[Array, ""]  # EMA of accepted nodes
    since: Int[Array, ""]   # rounds since the last drafted round
    gap: Int[Array, ""]     # rounds between probes while not drafting
    # lookup-only rounds (config.lookup_paths): EMAs of their predicted and accepted nodes, the
    # calibration of the lookup table's scores on this text (None in states from before them)
    lpred: Float[Array, ""] | None = None
    lreal: Float[Array, ""] | None = None
    # the same calibration EMAs per row (module docstring, 3), reset from the batch's at each
    # call's start: drafted rounds, then lookup-only ones
    row_pred: Float[Array, " B"] | None = None
    row_real: Float[Array, " B"] | None = None
    row_lpred: Float[Array, " B"] | None = None
    row_lreal: Float[Array, " B"] | None = None


class SizeChoice(NamedTuple):
    index: jax.Array        # i32 scalar: index into ``sizes``
    predicted_B: jax.Array  # [B] f32 expected accepted nodes of the chosen size (uncalibrated)
    root_mass_B: jax.Array  # [B] f32 drafter probability of the root's children
    # [B] f32 the policy's expected tokens committed this round: 1 + c * predicted (1 at size 0)
    expected_B: jax.Array | None = None


class AutoPolicy:
    """The static side of the policy for one config and batch size (``B``)."""

    def __init__(self, config, batch: int):
        self.batch = batch
        self.sizes = config.size_options
        table = table_for_batch(config.auto_costs, batch)
        self.verify_costs = tuple(table.verify_cost(n + 1) for n in self.sizes)
        # method "lookup" has no drafter: its rounds verify lookup paths or take plain steps
        self.draft_cost = table.draft_cost(config.method) if config.uses_drafter else 0.0
        self.ar_rate = 1.0 / self.verify_costs[0]
        self.probe_every = max(config.auto_probe_every,
                               math.ceil(self.draft_cost / PROBE_SHARE))
        # Can drafting pay at all? A round whose draft has 3/4 of its longest path accepted
        # (a strong drafter) commits ``1 + PLAUSIBLE_ACCEPT * min(n, J)`` tokens; when that
        # never beats the AR rate (a large batch on a CPU), no round drafts, not even a probe,
        # and the loop compiles to plain steps only.
        J = config.drafter.num_draft_positions if config.uses_drafter else 0
        self.can_pay = config.uses_drafter and any(
            (1 + PLAUSIBLE_ACCEPT * min(n, J)) / (self.draft_cost + v) > self.ar_rate
            for n, v in zip(self.sizes[1:], self.verify_costs[1:]))
        # lookup drafting (config.lookup_paths): rounds the drafter sits out may still verify the
        # lookup paths, which cost no drafter pass
        self.lookup = bool(config.lookup_paths)
        self.lookup_can_pay = self.lookup and any(
            (1 + PLAUSIBLE_ACCEPT * min(n, config.draft_depth)) / v > self.ar_rate
            for n, v in zip(self.sizes[1:], self.verify_costs[1:]))

    def init(self, carried: AutoState | None = None) -> AutoState:
        """The optimistic start, or a previous call's final state (``carried``); the per-row
        calibrations start from the batch's either way (a call's rows are new texts)."""
        f32, i32 = jnp.float32, jnp.int32
        if carried is not None:
            if not isinstance(carried, AutoState):
                raise ValueError(f"auto_state must be a DecodeOutput.auto_state (AutoState), got "
                                 f"{type(carried).__name__}")
            types = dict(rate=f32, pred=f32, real=f32, since=i32, gap=i32, lpred=f32,
                         lreal=f32)
            st = AutoState(**{name: jnp.asarray(1.0 if getattr(carried, name) is None
                                                else getattr(carried, name), t).reshape(())
                              for name, t in types.items()})
        else:
            st = AutoState(rate=jnp.asarray(RATE_START * self.ar_rate, f32),
                           pred=jnp.ones((), f32), real=jnp.full((), CALIB_PRIOR, f32),
                           since=jnp.zeros((), i32), gap=jnp.asarray(self.probe_every, i32),
                           lpred=jnp.ones((), f32), lreal=jnp.ones((), f32))
        # each row starts with one predicted node's weight at the batch's calibration
        ones_B = jnp.ones((self.batch,), f32)
        return st._replace(row_pred=ones_B, row_real=ones_B * self.calibration(st),
                           row_lpred=ones_B, row_lreal=ones_B * self.calibration(st, True))

    @property
    def plain_runs(self) -> bool:
        """Whether ``decode`` runs the rounds this policy does not draft in as ``ar`` steps in
        an inner loop (``round.plain_step``): when it may draft, and an undrafted round is
        always a plain step (no lookup paths to verify instead)."""
        return self.can_pay and not self.lookup_can_pay

    def skip(self, st: AutoState) -> AutoState:
        """``st`` after a round without a draft and without lookup nodes: one more round
        since the last drafted one."""
        return st._replace(since=st.since + 1)

    def wants_draft(self, st: AutoState, lookup: SizeChoice | None = None, live_B=None):
        """Whether this round runs the drafter (point 1 of the module docstring). ``lookup``:
        the size the lookup paths alone would get this round (``choose(..., lookup=True)``);
        when it verifies nodes, the drafter runs only if its rounds' ``rate`` is at least the
        rate that lookup-only round expects (point 4)."""
        if not self.can_pay:
            return jnp.zeros((), bool)
        wants = (st.rate >= self.ar_rate) | (st.since + 1 >= st.gap)
        if lookup is None:
            return wants
        return wants & ((lookup.index == 0) | (st.rate >= self.expected_rate(lookup, live_B)))

    def expected_rate(self, choice: SizeChoice, live_B):
        """Tokens per live row per AR step a round of ``choice`` expects without a draft (a
        lookup-only round, or a plain step at size 0: the AR rate)."""
        live_B = live_B.astype(jnp.float32)
        rows = jnp.maximum(live_B.sum(), 1.0)
        tokens = jnp.sum(live_B * jnp.where(choice.index > 0, choice.expected_B, 1.0))
        return tokens / (rows * jnp.asarray(self.verify_costs, jnp.float32)[choice.index])

    def calibration(self, st: AutoState, lookup: bool = False):
        """Realised / predicted accepted nodes: of drafted rounds, or of lookup-only ones."""
        real, pred = (st.lreal, st.lpred) if lookup else (st.real, st.pred)
        return jnp.clip(real / jnp.maximum(pred, 1e-6), 0.0, CALIB_MAX)

    def row_calibration(self, st: AutoState, lookup: bool = False):
        """``[B]``: each row's own realised / predicted accepted nodes."""
        real, pred = (st.row_lreal, st.row_lpred) if lookup else (st.row_real, st.row_pred)
        return jnp.clip(real / jnp.maximum(pred, 1e-6), 0.0, CALIB_MAX)

    def choose(self, st: AutoState, draft, live_B, lookup: bool = False) -> SizeChoice:
        """The size maximising the batch's expected surplus (see the module docstring).
        ``lookup``: a lookup-only draft, calibrated by the lookup rounds' own record."""
        p_BN = jnp.where(draft.valid_BN, jnp.exp(draft.scores_BN.astype(jnp.float32)), 0.0)
        cum_BN = jnp.concatenate([jnp.zeros_like(p_BN[:, :1]), jnp.cumsum(p_BN, axis=1)], 1)
        pred_Bn = cum_BN[:, jnp.asarray(self.sizes)]
        live_B = live_B.astype(jnp.float32)
        rows = jnp.maximum(live_B.sum(), 1.0)
        calib_B = self.row_calibration(st, lookup)
        gain_n = jnp.sum(live_B[:, None] * (1.0 + calib_B[:, None] * pred_Bn), axis=0)
        rho = jnp.maximum(self.ar_rate, st.rate)
        surplus_n = gain_n - rho * rows * jnp.asarray(self.verify_costs, jnp.float32)
        index = jnp.argmax(surplus_n).astype(jnp.int32)   # ties: the smaller size
        root_mass_B = jnp.sum(jnp.where(draft.parents_BN < 0, p_BN, 0.0), axis=1)
        return SizeChoice(index=index, predicted_B=pred_Bn[:, index], root_mass_B=root_mass_B,
                          expected_B=1.0 + calib_B * pred_Bn[:, index])

    def update(self, st: AutoState, drafted, choice: SizeChoice, committed_B, accepted_B,
               root_hit_B, live_B, lookup: SizeChoice | None = None) -> AutoState:
        """After a round: ``committed_B`` tokens, ``accepted_B`` draft nodes; ``root_hit_B``:
        the target's first token was one of the root's children (informative at size 0).
        ``lookup``: the size the lookup paths alone had this round (``wants_draft``'s); a
        drafted round whose lookup paths alone were worth a verify leaves ``rate`` as it was:
        ``rate`` is what the drafter delivers where the lookup does not, the figure
        ``wants_draft`` weighs against a lookup-only round (tokens the lookup paths bring to a
        merged tree would otherwise count for the drafter, and keep it drafting in rounds the
        paths alone serve for less)."""
        f32 = jnp.float32
        live_B = live_B.astype(f32)
        rows = jnp.maximum(live_B.sum(), 1.0)
        cost = self.draft_cost + jnp.asarray(self.verify_costs, f32)[choice.index]
        realized = jnp.sum(live_B * committed_B.astype(f32)) / (rows * cost)
        probe = st.rate < self.ar_rate   # drafted only because the gap ran out
        alpha = jnp.where(probe, PROBE_ALPHA, RATE_ALPHA)
        rate = (1 - alpha) * st.rate + alpha * realized
        if lookup is not None:
            rate = jnp.where(lookup.index == 0, rate, st.rate)
        size0 = choice.index == 0
        live = live_B > 0
        a = CALIB_ALPHA

        def ema(old_B, new_B):   # the live rows' per-row EMAs; a done row keeps its own
            return jnp.where(live, (1 - a) * old_B + a * new_B, old_B)

        real_B = jnp.where(size0, root_hit_B.astype(f32), accepted_B.astype(f32))
        pred_B = jnp.where(size0, choice.root_mass_B, choice.predicted_B)
        real, pred = jnp.sum(live_B * real_B), jnp.sum(live_B * pred_B)
        max_gap = MAX_GAP_FACTOR * self.probe_every
        gap = jnp.where((rate < self.ar_rate) & probe, jnp.minimum(2 * st.gap, max_gap),
                        self.probe_every)
        new = st._replace(rate=rate, pred=(1 - a) * st.pred + a * pred,
                          real=(1 - a) * st.real + a * real,
                          since=jnp.zeros_like(st.since), gap=gap.astype(jnp.int32),
                          row_pred=ema(st.row_pred, pred_B), row_real=ema(st.row_real, real_B))
        skipped = self.skip(st)
        if self.lookup_can_pay:   # a lookup-only round that verified nodes: its calibration
            looked = (~drafted) & ~size0
            lp_B, la_B = choice.predicted_B, accepted_B.astype(f32)
            lp, la = jnp.sum(live_B * lp_B), jnp.sum(live_B * la_B)
            skipped = skipped._replace(
                lpred=jnp.where(looked, (1 - a) * st.lpred + a * lp, st.lpred),
                lreal=jnp.where(looked, (1 - a) * st.lreal + a * la, st.lreal),
                row_lpred=jnp.where(looked, ema(st.row_lpred, lp_B), st.row_lpred),
                row_lreal=jnp.where(looked, ema(st.row_lreal, la_B), st.row_lreal))
        return jax.tree.map(lambda x, y: jnp.where(drafted, x, y), new, skipped)


def probe_next(st: AutoState) -> AutoState:
    """``st`` after its drafter changed (new parameters, a refresh step that made it better on
    the latest rollouts): the next round drafts as a probe and the drafter's calibration starts
    afresh; the delivered ``rate`` stays, so a probe that shows no gain leaves the policy where
    it was (one drafted round per change)."""
    one = jnp.ones_like(jnp.asarray(st.pred))
    return st._replace(since=jnp.maximum(jnp.asarray(st.gap) - 1, 0).astype(jnp.int32),
                       pred=one, real=CALIB_PRIOR * one)


def initial_state(config, batch: int, carried: AutoState | None = None) -> AutoState:
    """The policy state a ``budget="auto"`` decode of ``batch`` rows starts from: the optimistic
    default, or ``carried`` (a previous call's ``DecodeOutput.auto_state``) checked and cast.
    Pass it as ``decode(..., auto_state=...)`` to fix its pytree before the first call (an
    ahead-of-time compile, a carried state per config)."""
    return AutoPolicy(config, batch).init(carried)
