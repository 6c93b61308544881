"""The drafter refresh's schedule (``rollout.refresh_schedule``): a step after every call while
the drafter's chain τ rises or falls, gaps doubling to ``max_gap`` while it is flat."""

from __future__ import annotations

import pickle

import pytest

from dominotree_jax.rollout.refresh_schedule import RefreshSchedule


def steps_taken(schedule: RefreshSchedule, chain_tau, calls: int) -> list[int]:
    """The calls (0-based) after which ``schedule`` takes a step; ``chain_tau(i)`` is what the
    ``i``-th step measures."""
    taken = []
    for call in range(calls):
        if schedule.due():
            schedule.record(chain_tau(len(taken)))
            taken.append(call)
    return taken


def test_a_flat_drafter_is_refreshed_at_doubling_gaps_up_to_max_gap():
    taken = steps_taken(RefreshSchedule(max_gap=8), lambda i: 2.0, 60)
    gaps = [b - a for a, b in zip(taken, taken[1:])]
    assert taken[0] == 0 and gaps[:5] == [1, 2, 4, 8, 8] and set(gaps[3:]) == {8}
    assert len(taken) == 10   # of 60 calls


def test_a_learning_drafter_is_refreshed_after_every_call():
    taken = steps_taken(RefreshSchedule(), lambda i: 1.5 * 1.03 ** i, 40)
    assert taken == list(range(40))


def test_a_drafter_left_behind_by_the_policy_is_refreshed_after_every_call_again():
    s = RefreshSchedule(max_gap=16)
    taken = steps_taken(s, lambda i: 3.0, 40)       # flat: the gaps grew
    assert s.gap == 16
    assert s.record(2.8) == "flat" and s.gap == 16   # noise: the average barely moves
    assert [s.record(2.0) for _ in range(2)] == ["flat", "fallen"]   # a lasting drop
    assert s.gap == 1 and s.waited == 0 and len(taken) < 10
    assert s.record(2.9) == "rising"                 # from the fallen level on


def test_every_takes_a_step_after_each_call_and_settings_are_checked():
    assert steps_taken(RefreshSchedule.of("every"), lambda i: 2.0, 10) == list(range(10))
    assert RefreshSchedule.of("adaptive") == RefreshSchedule()
    assert RefreshSchedule.of({"max_gap": 4}).max_gap == 4
    for bad in ("sometimes", 3):
        with pytest.raises(ValueError, match="schedule must be 'adaptive', 'every'"):
            RefreshSchedule.of(bad)
    with pytest.raises(ValueError, match="max_gap >= 1"):
        RefreshSchedule(max_gap=0)
    with pytest.raises(ValueError, match="rise and fall must be >= 1"):
        RefreshSchedule(rise=0.9)


def test_the_schedule_resumes_from_its_checkpoint():
    a = RefreshSchedule(max_gap=8)
    steps_taken(a, lambda i: 2.0, 9)
    b = RefreshSchedule.from_checkpoint(pickle.loads(pickle.dumps(a.checkpoint_state())))
    assert b == a
    assert steps_taken(a, lambda i: 2.0, 30) == steps_taken(b, lambda i: 2.0, 30)


def test_the_time_budget_holds_steps_to_their_share_of_the_rollout_time():
    """``invest_share``: while drafting saves nothing (gain <= 1) the steps cost at most
    ``invest_share`` of the calls' time (the first, taken at once, paid back before the next);
    where drafting saves, half of the saving; a fixed budget (gain None) is not held back."""
    s = RefreshSchedule(every=True)                 # a step after every call, within budget
    assert s.invest_share == 0.03
    taken = []
    for call in range(200):
        s.earn(1.0, 0.9)                            # 1 s calls, drafting below the AR rate
        if s.due():
            s.spend(0.3)                            # a 0.3 s step
            taken.append(call)
    assert taken[0] == 0 and 19 <= len(taken) <= 20          # 6 s earned, 0.3 s a step
    assert 0.3 * len(taken) <= 0.03 * 200 + 1e-9 and taken[1] in (19, 20)
    s = RefreshSchedule(every=True, credit=0.0, step_seconds=0.3)
    steps = 0
    for _ in range(100):
        s.earn(1.0, 1.4)                            # drafting delivers 1.4x: 20 % to spend
        if s.due():
            s.spend(0.3)
            steps += 1
    assert 65 <= steps <= 66                        # 20 s earned, 0.3 s a step
    s = RefreshSchedule(every=True, step_seconds=5.0)
    s.earn(0.01, None)
    assert s.due()                                  # a fixed budget: every step affordable
    s = RefreshSchedule(every=True, step_seconds=0.3)
    for _ in range(1000):                           # credit is capped: no burst after idling
        s.earn(1.0, 0.5)
    assert s.credit == pytest.approx(0.6)
    free = RefreshSchedule(every=True, invest_share=None, step_seconds=9.0)
    assert free.due()
    with pytest.raises(ValueError, match="invest_share"):
        RefreshSchedule(invest_share=1.5)


def test_the_probe_backoff_doubles_while_probes_do_not_pay_and_closes_when_they_do():
    """``backoff.ProbeBackoff`` and ``moving_average``, the policy every host-side probe
    schedule shares (``RefreshSchedule``, ``auto_probe.LookupCalls``, ``auto_probe.CallRates``);
    an old checkpoint's count-down ``wait`` reads as the calls waited."""
    from dominotree_jax.rollout.auto_probe import CallRates, LookupCalls
    from dominotree_jax.rollout.backoff import ProbeBackoff, moving_average
    b, probes = ProbeBackoff(), []
    for call in range(36):
        if b.probe_due():
            b.probed(paid=call >= 30, max_gap=8)
            probes.append(call)
        else:
            b.skipped()
    assert probes == [0, 2, 6, 14, 22, 30, 31, 32, 33, 34, 35] and b.gap == 1 and b.waited == 0
    assert moving_average(None, 3.0, 0.25) == 3.0 and moving_average(2.0, 6.0, 0.25) == 3.0
    assert all(isinstance(c(), ProbeBackoff) for c in (CallRates, LookupCalls, RefreshSchedule))
    s = RefreshSchedule(max_gap=8)
    steps_taken(s, lambda i: 2.0, 12)
    old = {k: v for k, v in s.checkpoint_state().items() if k != "waited"}
    old["wait"] = s.gap - s.waited
    assert RefreshSchedule.from_checkpoint(old) == s
