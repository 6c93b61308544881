"""The GRPO arm runner's bookkeeping (``grpo_run``), without tunix: the per-step CSV row
from the engine's rollout calls, the rows kept on resume, when an arm is complete, the pinned
settings. The runs themselves: test_grpo_example.py."""

from __future__ import annotations

import csv
import dataclasses
import json

import pytest

from experiments.grpo import grpo_run
from experiments.grpo.grpo_report import read_arm_csv

SETTINGS = grpo_run.ArmSettings(model="tiny", steps=3, prompts=2, group=2, max_new=6,
                                temperature=0.9, lr=3e-5, beta=0.04, seed=0,
                                refresh=dict(lr=3e-4, anchors=4, rows=None), rollout_prompts=1)


class FakeEngine:
    """What ``StepLog`` reads of a ``LoggedRollout``."""
    num_compilations = 1

    def __init__(self, calls):
        self.calls = calls

    def take(self):
        calls, self.calls = self.calls, []
        return calls

    def tunix_metrics(self):
        return {"rollout/tau": (1.5, None)}


def _call(seconds, tokens, accepted, rounds, size, refresh=None, plain=False):
    return {"seconds": seconds, "tokens": tokens, "accepted": accepted, "rounds": rounds,
            "draft_size": size, "refresh": refresh or {}, "plain": plain}


def _write_rows(path, steps):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, grpo_run.ARM_CSV_FIELDS)
        w.writeheader()
        w.writerows({"arm": "auto", "step": s, "reward_mean": s / 10} for s in steps)


def test_step_log_sums_a_steps_rollout_calls_into_one_row(tmp_path):
    path = str(tmp_path / "auto+refresh.csv")
    refresh = [{"seconds": 0.5, "loss": 2.0, "chain_tau_before": 1.2, "temp_bytes": 100,
                "logits_bytes": 40},
               {"seconds": 0.25, "loss": 1.0, "chain_tau_before": 1.4, "temp_bytes": 300}]
    engine = FakeEngine([_call(2.0, 10, 12, 8, 4.0, refresh[0]),
                         _call(3.0, 20, 18, 12, 2.0, refresh[1])])
    log = grpo_run.StepLog(path, "auto+refresh", [engine])
    metrics = log(["p"] * 4, ["ab", "abcd", "", "abcdef"], [1.0, 0.0, 1.0, 1.0])
    assert metrics == engine.tunix_metrics() and log.step == 1
    engine.calls = [_call(1.0, 5, 5, 5, 0.0, plain=True)]   # no refresh: its cells stay empty
    log(["p"] * 2, ["a", "b"], [0.0, 0.0])
    with open(path) as f:
        assert next(csv.reader(f)) == list(grpo_run.ARM_CSV_FIELDS)
    first, second = read_arm_csv(path)
    assert {k: first[k] for k in ("arm", "step", "reward_mean", "rollout_s", "rollout_tokens",
                                  "tokens_per_s", "tau", "draft_size", "refresh_s",
                                  "refresh_loss", "refresh_chain_tau_before",
                                  "refresh_temp_bytes", "refresh_logits_bytes",
                                  "completion_len", "rollout_calls", "compiles")} == {
        "arm": "auto+refresh", "step": 0.0, "reward_mean": 0.75, "rollout_s": 5.0,
        "rollout_tokens": 30.0, "tokens_per_s": 6.0, "tau": 1.5, "draft_size": 3.0,
        "refresh_s": 0.75, "refresh_loss": 1.5, "refresh_chain_tau_before": pytest.approx(1.3),
        "refresh_temp_bytes": 300.0, "refresh_logits_bytes": 40.0, "completion_len": 3.0,
        "rollout_calls": 2.0, "compiles": 1.0}
    assert first["plain_calls"] == 0 and second["plain_calls"] == 1
    assert first["step_wall_s"] >= 0 and first["loadavg_1m"] >= 0 and first["time_utc"]
    assert second["step"] == 1 and second["tau"] == 1.0 and second["rollout_calls"] == 1
    assert all(second[k] == "" for k in ("refresh_s", "refresh_loss", "refresh_temp_bytes"))


def test_step_log_keeps_the_rows_before_a_restored_step(tmp_path):
    path = tmp_path / "auto.csv"
    _write_rows(path, [0, 1, 2, 3])   # steps 2-3: an interrupted attempt after checkpoint 2
    log = grpo_run.StepLog(str(path), "auto", [None], start=2)
    assert log.step == 2 and [r["step"] for r in read_arm_csv(str(path))] == [0, 1]
    grpo_run.StepLog(str(path), "auto", [None])   # start 0: a new CSV
    assert read_arm_csv(str(path)) == []
    _write_rows(path, [0, 2])
    with pytest.raises(ValueError, match="lacks rows"):
        grpo_run.StepLog(str(path), "auto", [None], start=3)
    assert [r["step"] for r in read_arm_csv(str(path))] == [0, 2]   # refused: left alone


def test_an_arm_is_complete_with_all_rows_and_no_update_left(tmp_path):
    out = str(tmp_path)
    assert grpo_run.latest_checkpoint(grpo_run.checkpoint_dir(out, "ar")) is None
    assert not grpo_run.arm_complete(out, "ar", 2)
    _write_rows(tmp_path / "ar.csv", [0, 1])
    assert grpo_run.completed_steps(grpo_run.arm_csv_path(out, "ar")) == 2
    assert grpo_run.arm_complete(out, "ar", 2) and not grpo_run.arm_complete(out, "ar", 3)
    actor = tmp_path / "checkpoints" / "ar" / "actor"
    for name in ("1", "tmp.orbax-checkpoint-tmp"):   # a checkpoint before the last update
        (actor / name).mkdir(parents=True)
    assert grpo_run.latest_checkpoint(grpo_run.checkpoint_dir(out, "ar")) == 1
    assert not grpo_run.arm_complete(out, "ar", 2)
    (actor / "2").mkdir()
    assert grpo_run.arm_complete(out, "ar", 2)


def test_settings_are_pinned_and_checked(tmp_path):
    out = str(tmp_path / "run")
    grpo_run.pin_settings(out, SETTINGS)
    with open(tmp_path / "run" / "settings.json") as f:
        saved = json.load(f)
    assert list(saved) == ["model", "steps", "prompts", "group", "max_new", "temperature", "lr",
                           "beta", "seed", "refresh", "rollout_prompts", "call_clock"]
    assert saved["refresh"] == {"lr": 3e-4, "anchors": 4, "rows": None}
    grpo_run.pin_settings(out, SETTINGS)   # the same: accepted
    with pytest.raises(ValueError, match="other settings"):
        grpo_run.pin_settings(out, dataclasses.replace(SETTINGS, steps=4))
    with pytest.raises(ValueError, match="must divide"):
        dataclasses.replace(SETTINGS, prompts=3, rollout_prompts=2)
    with pytest.raises(ValueError, match="at least 2"):
        dataclasses.replace(SETTINGS, group=1)
    log = grpo_run.StepLog(str(tmp_path / "a.csv"), "a", [None])
    grpo_run._same_step(log, 0)
    with pytest.raises(RuntimeError, match="CSV is at step 0"):
        grpo_run._same_step(log, 2)
