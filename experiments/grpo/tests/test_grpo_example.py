"""The GRPO example's task, and its tunix GRPOLearner run (tiny model) through ``grpo_run`` with
per-step CSV rows and resume, its report (``grpo_report``) and its speed comparison
(``grpo_speed``)."""

from __future__ import annotations

import importlib.util
import pathlib
import random
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.grpo import grpo_run
from experiments.grpo.grpo_report import read_arm_csv, write_report


GRPO = pathlib.Path(__file__).parent.parent / "grpo_smollm2.py"


def _load_grpo():
    spec = importlib.util.spec_from_file_location("grpo_smollm2", GRPO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grpo_task_answers_and_rewards():
    grpo = _load_grpo()
    assert grpo.final_number("Mia has 12 apples. The answer is 1,204.") == 1204
    assert grpo.final_number(" 68.") == 68 and grpo.final_number("no number") is None
    assert grpo.rewards(prompts=["q"] * 4, completions=[" 68.", "6 8", "", "It is 68 apples"],
                        answer=[68, 68, 1, 68]) == [1.0, 0.0, 0.0, 1.0]
    rng = random.Random(3)
    for _ in range(200):   # every generated problem's answer follows from its own numbers
        text, ans = grpo.word_problem(rng)
        a, b = (int(x) for x in re.findall(r"\d+", text)[:2])
        assert ans == {"gets": a + b, "gives": a - b, "bags": a * b}[
            next(w for w in ("gets", "gives", "bags") if w in text)]
        assert ans >= 1
    # the same seed gives every arm the same problems
    one = [b["prompts"].tolist() for b in grpo.batches(5, 3, 4, str)]
    assert one == [b["prompts"].tolist() for b in grpo.batches(5, 3, 4, str)]
    assert one != [b["prompts"].tolist() for b in grpo.batches(6, 3, 4, str)]


NO_BUDGET = dict(lr=3e-4, anchors=4, rows=None, schedule={"every": True, "invest_share": None})


def test_grpo_example_runs_tunix_learner_and_resumes(tmp_path):
    """The example's auto+refresh arm on the tiny model: tunix's GRPOLearner through RLCluster
    with our engine, one CSV row per step with the refresh's time and memory; a rerun skips
    the complete arm, an incomplete CSV is rerun from step 0, other settings are refused; the
    report tables the arm's rows and plots them."""
    pytest.importorskip("tunix", reason="google-tunix is not installed (make test installs it)")
    grpo = _load_grpo()
    # (no refresh time budget: its wall-time decisions would differ between reruns)
    kw = dict(model="tiny", arms=("auto+refresh",), steps=2, prompts=2, group=2, max_new=6,
              refresh=NO_BUDGET,
              out=str(tmp_path))
    path = tmp_path / "auto+refresh.csv"
    path.write_text(",".join(grpo_run.ARM_CSV_FIELDS) + "\nauto+refresh,0\n")   # interrupted
    assert grpo.main(**kw) == {"auto+refresh": 2}                                  # rerun
    rows = read_arm_csv(str(path))
    assert [r["step"] for r in rows] == [0, 1] and all(r["arm"] == "auto+refresh" for r in rows)
    assert all(r["tau"] >= 1.0 and r["rollout_tokens"] > 0 and r["rollout_s"] > 0
               and r["refresh_s"] > 0 and r["refresh_temp_bytes"] > 0 for r in rows)
    assert all(0.0 <= r["reward_mean"] <= 1.0 and r["loadavg_1m"] >= 0
               and r["rollout_calls"] == 2 for r in rows)   # 2 prompts, 1 per call
    # the carried auto state does not recompile: one drafting program, and one plain (ar)
    # program once a call ran as a plain call
    plain = np.cumsum([r["plain_calls"] for r in rows]) > 0
    assert [r["compiles"] for r in rows] == [1 + int(p) for p in plain]
    assert grpo.main(**kw) == {"auto+refresh": 0}                     # complete: skipped
    assert len(read_arm_csv(str(path))) == 2
    with pytest.raises(ValueError, match="other settings"):
        grpo.main(**dict(kw, steps=3))
    table = write_report(str(tmp_path), grpo.ARMS)
    assert table.splitlines()[2].startswith("| auto+refresh | 2 | ")
    assert (tmp_path / "table.md").read_text() == table + "\n"
    assert (tmp_path / "grpo.png").stat().st_size > 0


def _dtypes(tree) -> set[str]:
    return {str(x.dtype) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)}


def test_a_bf16_arm_rolls_out_from_a_bf16_copy_while_training_stays_float32(tmp_path,
                                                                             monkeypatch):
    """``auto+refresh@bfloat16`` with ``beside_ar`` (tiny model, 2 GRPO steps): the engine and
    the ``ar`` engine beside it hold bf16 copies of the policy (tunix hands float32 updates,
    cast on the way in) and the drafter; the trainer's policy and the refresh's drafter stay
    float32, and the engine decodes with the refresh's drafter cast to bf16. The ``ar`` engine
    runs after the arm's and before it in turn. The report finds the arm's CSV by its name."""
    pytest.importorskip("tunix", reason="google-tunix is not installed (make test installs it)")
    grpo = _load_grpo()
    engines, handed = [], []
    generate, update = grpo_run.LoggedRollout.generate, grpo_run.LoggedRollout.update_params

    def record_generate(self, *a, **kw):
        engines.append(self)
        return generate(self, *a, **kw)

    def record_update(self, params, filter_types=None):
        handed.append(_dtypes(params))
        return update(self, params, filter_types)

    from dominotree_jax.rollout.tunix_engine import DominoTreeRollout
    order, decode = [], DominoTreeRollout.generate

    def record_order(self, *a, **kw):
        order.append("arm" if isinstance(self, grpo_run.LoggedRollout) else "ar")
        return decode(self, *a, **kw)

    monkeypatch.setattr(grpo_run.LoggedRollout, "generate", record_generate)
    monkeypatch.setattr(grpo_run.LoggedRollout, "update_params", record_update)
    monkeypatch.setattr(DominoTreeRollout, "generate", record_order)
    arm = "auto+refresh@bfloat16"
    assert grpo.main(model="tiny", arms=(arm,), steps=2, prompts=2, group=2, max_new=6,
                     refresh=NO_BUDGET, out=str(tmp_path), beside_ar=True) == {arm: 2}
    eng = engines[-1]
    assert all(e is eng for e in engines)
    assert handed and all(h == {"float32"} for h in handed)   # tunix's float32 policy
    # the ar engine runs after the arm's in a step's first call, before it in its second
    assert order == ["arm", "ar", "ar", "arm"] * 2
    assert _dtypes(eng.params["target"]) == _dtypes(eng.params["drafter"]) == {"bfloat16"}
    assert _dtypes(eng.beside.params["target"]) == {"bfloat16"}
    assert str(eng.precision) == str(eng.beside.precision) == "bfloat16"
    assert eng.refresher.num_steps == 4 and _dtypes(eng.refresher.flat) == {"float32"}
    for held, master in zip(jax.tree.leaves(eng.params["drafter"]),
                            jax.tree.leaves(eng.refresher.state)):
        np.testing.assert_array_equal(np.asarray(held), np.asarray(master.astype(held.dtype)))
    rows = read_arm_csv(str(tmp_path / f"{arm}.csv"))
    assert [r["step"] for r in rows] == [0, 1]
    assert all(r["beside_ar_tokens"] > 0 and r["refresh_s"] > 0 for r in rows)
    assert grpo.arms_in(str(tmp_path)) == [arm]
    assert write_report(str(tmp_path), [arm]).splitlines()[2].startswith(f"| {arm} | 2 | ")
    with pytest.raises(ValueError, match="unknown precision 'x'"):
        grpo.main(model="tiny", arms=("auto@x",), out=str(tmp_path))


def test_an_arm_in_another_precision_reads_that_precisions_calibrated_costs(tmp_path,
                                                                            monkeypatch):
    """``engine_options("auto@bfloat16")``: ``precision="bfloat16"`` and ``auto`` on the cost
    file's bf16 entry for the task's pair (the float32 entry for ``auto``)."""
    from dominotree_jax.decoding import costs
    grpo = _load_grpo()
    task = grpo.Task("tiny")
    path = str(tmp_path / "costs.json")
    monkeypatch.setenv(costs.COSTS_ENV, path)
    half = (costs.CostTable(batch=4, verify=((1, 1.0), (3, 1.5), (5, 1.75), (9, 2.0),
                                             (17, 2.5)),
                            draft=tuple((m, 0.7) for m, _ in costs.default_draft(4))),)
    costs.save_costs(task.tcfg, task.dcfg, half, path, precision="bfloat16")
    def tables(opts):
        return [(t.batch, t.verify, dict(t.draft)) for t in opts["auto_costs"]]

    opts = task.engine_options("auto@bfloat16", {})
    assert opts["precision"] == "bfloat16"
    assert tables(opts) == [(4, half[0].verify, dict(half[0].draft))]
    assert all(t.source == path for t in opts["auto_costs"])
    assert tables(task.engine_options("auto", {})) != tables(opts)
    assert "precision" not in task.engine_options("auto", {})
    assert task.engine_options("ar@bfloat16", {}) == {"method": "ar", "precision": "bfloat16"}


COMPARED = ("reward_mean", "rollout_tokens", "tau", "draft_size", "completion_len",
            "refresh_steps", "refresh_loss", "refresh_chain_tau_before", "rollout_calls")


def figures(row) -> dict:
    """``COMPARED`` of a CSV row, an empty cell (a step without a refresh step) as NaN."""
    return {k: float("nan") if row[k] == "" else row[k] for k in COMPARED}


def test_grpo_example_resumes_from_checkpoints(tmp_path, monkeypatch):
    """Step-level resume of the auto+refresh arm (tiny model, 3 steps, a checkpoint every 2):
    stopped after train step 1 (``stop_after``: tunix's final forced save), then crashed after
    writing the last step's row, before its update (checkpoint 2 is the newest; the CSV row of
    step 2 is dropped), then finished: the same CSV figures and final policy as one
    uninterrupted run (its ``--out`` a relative path) that also timed an ``ar`` engine beside
    the arm (``--beside-ar``: it must leave the arm's rollouts and training as they are)."""
    pytest.importorskip("tunix", reason="google-tunix is not installed (make test installs it)")
    grpo = _load_grpo()
    # (no refresh time budget, no call clock: their wall-time decisions would differ between
    # reruns)
    kw = dict(model="tiny", arms=("auto+refresh",), steps=3, prompts=2, group=2, max_new=6,
              refresh=NO_BUDGET, call_clock=False,
              ckpt_every=2, ckpt_keep=1)
    one, two = tmp_path / "one", tmp_path / "two"
    monkeypatch.chdir(tmp_path)   # a relative --out (orbax itself wants absolute paths)
    assert grpo.main(**kw, out="one", save_dir="one/pol", beside_ar=True) == {"auto+refresh": 3}
    assert grpo.main(**kw, out=str(two), stop_after=1) == {"auto+refresh": 1}

    class Crash(Exception):
        pass

    logged = grpo_run.StepLog.__call__

    def crash_in_step_2(self, *a, **k):
        out = logged(self, *a, **k)
        if self.step == 3:   # step 2's row is written
            raise Crash
        return out

    monkeypatch.setattr(grpo_run.StepLog, "__call__", crash_in_step_2)
    with pytest.raises(Crash):
        grpo.main(**kw, out=str(two))
    assert [r["step"] for r in read_arm_csv(str(two / "auto+refresh.csv"))] == [0, 1, 2]
    monkeypatch.undo()   # 3 rows, but checkpoint 2: not complete
    assert grpo.main(**kw, out=str(two), save_dir=str(two / "pol")) == {"auto+refresh": 3}
    a, b = (read_arm_csv(str(d / "auto+refresh.csv")) for d in (one, two))
    assert [r["step"] for r in b] == [0, 1, 2]
    for ra, rb in zip(a, b):
        assert figures(ra) == pytest.approx(figures(rb), rel=1e-5, abs=1e-6, nan_ok=True)
    assert len({r["reward_mean"] for r in a} | {r["tau"] for r in a}) > 1   # not constant
    assert all(r["beside_ar_tokens_per_s"] > 0 and r["beside_ar_tokens"] > 0 for r in a)
    assert all(r["beside_ar_tokens_per_s"] == "" for r in b)
    beside = write_report(str(one), grpo.ARMS).split("\n\n")[1].splitlines()
    assert beside[2].startswith("| auto+refresh | 1-2 | ") and len(beside) == 3
    for name in ("auto+refresh_policy.npz", "auto+refresh_drafter.npz"):
        with np.load(one / "pol" / name) as x, np.load(two / "pol" / name) as y:
            assert x.files == y.files
            for k in x.files:
                np.testing.assert_allclose(x[k], y[k], rtol=1e-5, atol=1e-6, err_msg=k)
    ckpts = two / "checkpoints" / "auto+refresh"
    assert sorted(p.name for p in (ckpts / "actor").iterdir() if p.name.isdigit()) == ["3"]
    assert sorted(p.name for p in (ckpts / "engine").iterdir()) == ["2.npz", "3.npz"]
    assert grpo.main(**kw, out=str(two)) == {"auto+refresh": 0}   # complete: skipped


def test_speed_times_ar_and_auto_per_policy_with_its_refreshed_drafter(tmp_path, monkeypatch):
    """``--speed``: ``ar`` and ``auto`` rows for the initial policy and each saved one, without
    recompiling; a policy saved with a refreshed drafter (``<arm>_drafter.npz``) makes ``auto``
    draft with that drafter, one saved alone with the initial drafter."""
    pytest.importorskip("tunix", reason="google-tunix is not installed (make test installs it)")
    from dominotree_jax.model.state import state_to_flat
    from dominotree_jax.rollout.tunix_engine import DominoTreeRollout
    grpo = _load_grpo()
    task = grpo.Task("tiny")
    flat = state_to_flat(task.tparams)
    np.savez(tmp_path / "plain_policy.npz", **flat)
    np.savez(tmp_path / "fresh_policy.npz", **flat)
    dflat = {k: np.asarray(v) * 0.5 for k, v in state_to_flat(task.dparams).items()}
    np.savez(tmp_path / "fresh_drafter.npz", **dflat)
    seen = []
    original = DominoTreeRollout.update_drafter_params

    def record(self, params):
        seen.append(sum(float(np.sum(np.abs(np.asarray(x)))) for x in jax.tree.leaves(params)))
        return original(self, params)

    monkeypatch.setattr(DominoTreeRollout, "update_drafter_params", record)
    rows = grpo.speed(str(tmp_path), model="tiny", reps=1, prompts=2, group=2, max_new=6,
                      policies=[("plain", str(tmp_path / "plain_policy.npz")),
                                ("fresh", str(tmp_path / "fresh_policy.npz"))])
    assert [(r["policy"], r["arm"]) for r in rows] == [
        (p, a) for p in ("initial", "plain", "fresh") for a in ("ar", "auto")]
    assert all(r["tokens"] > 0 and r["tau"] >= 1.0 for r in rows)
    # one program each (auto: its drafting one and, once a call ran plain, the plain one),
    # none more when a policy is loaded
    assert {r["compiles"] for r in rows if r["arm"] == "ar"} == {1}
    assert len({r["compiles"] for r in rows if r["arm"] == "auto"}) == 1
    assert rows[1]["compiles"] in (1, 2)
    assert all(r["first_used_sizes"] == "" for r in rows if r["arm"] == "ar")
    initial = sum(float(np.sum(np.abs(np.asarray(x)))) for x in jax.tree.leaves(task.dparams))
    assert seen == pytest.approx([initial, initial / 2], rel=1e-5)
    assert (tmp_path / "speed.csv").read_text().count("\n") == 7   # header + 6 rows


def test_speed_arms_in_another_precision_hold_their_weights_so(tmp_path, monkeypatch):
    """``--speed`` arm ``<arm>@bfloat16``: that arm's engine holds the policy (and each policy
    loaded later) cast to bf16, the plain arm the task's float32; unknown precisions are
    refused by name."""
    pytest.importorskip("tunix", reason="google-tunix is not installed (make test installs it)")
    from dominotree_jax.model.state import state_to_flat
    from experiments.grpo.grpo_speed import arm_precision
    from dominotree_jax.rollout.tunix_engine import DominoTreeRollout
    grpo = _load_grpo()
    task = grpo.Task("tiny")
    np.savez(tmp_path / "later_policy.npz", **state_to_flat(task.tparams))
    seen = []
    original = DominoTreeRollout.update_params

    def record(self, params):
        original(self, params)   # handed the float32 policy, holds it in its precision
        seen.append({str(x.dtype) for x in jax.tree.leaves(self.params["target"])})

    monkeypatch.setattr(DominoTreeRollout, "update_params", record)
    rows = grpo.speed(str(tmp_path), model="tiny", reps=1, prompts=2, group=2, max_new=6,
                      arms=("ar", "ar@bfloat16"),
                      policies=[("later", str(tmp_path / "later_policy.npz"))])
    assert [(r["policy"], r["arm"]) for r in rows] == [
        (p, a) for p in ("initial", "later") for a in ("ar", "ar@bfloat16")]
    assert all(r["compiles"] == 1 and r["tokens"] > 0 for r in rows)
    assert seen == [{"float32"}, {"bfloat16"}]
    assert arm_precision("auto") is None and arm_precision("auto@bfloat16") == "bfloat16"
    with pytest.raises(ValueError, match="unknown precision 'float8'"):
        arm_precision("auto@float8")
