"""The engine state beside tunix's actor checkpoints (``dominotree_jax.rollout.checkpoints``):
file format, atomic writes, pruning, the hook, restore of the restored step, and errors. Fake
tunix pieces only (a checkpoint manager whose ``save`` says whether it saved, an engine with
``checkpoint_state`` / ``restore_checkpoint_state``): the tunix learner run is
``tests/test_rl_example.py``."""

from __future__ import annotations

import copy
import os
import pickle
import types

import numpy as np
import pytest

from dominotree_jax.rollout.checkpoints import (EngineCheckpoints, attach_engine_checkpoints,
                                                engine_state_path, finish_checkpoint_writes,
                                                read_engine_state, restore_engine_state,
                                                saved_engine_steps, write_engine_state)


class FakeEngine:
    """Its state: the number of rollouts made and a key array; records what was restored."""

    def __init__(self):
        self.rollouts, self.restored, self.params = 0, None, None

    def checkpoint_state(self):
        return {"rollouts": self.rollouts, "key": np.arange(4, dtype=np.uint32) + self.rollouts}

    def restore_checkpoint_state(self, state):
        self.restored = state

    def update_params(self, params):
        self.params = params


class FakeManager:
    """tunix's ``CheckpointManager`` surface: ``save`` saves every ``every``-th step (or when
    forced) and returns whether it did; records its calls."""

    def __init__(self, every=2):
        self.every, self.calls = every, []
        self._checkpoint_manager = types.SimpleNamespace(waits=0)
        self._checkpoint_manager.wait_until_finished = self._wait

    def _wait(self):
        self._checkpoint_manager.waits += 1

    def save(self, step, model, optimizer=None, save_only_lora_params=False, force=False,
             custom_metadata=None):
        self.calls.append(dict(step=step, force=force, custom_metadata=custom_metadata))
        return force or step % self.every == 0

    def latest_step(self):
        saved = [c["step"] for c in self.calls if c["force"] or c["step"] % self.every == 0]
        return max(saved, default=None)


def fake_cluster(train_steps=0, every=2):
    trainer = types.SimpleNamespace(checkpoint_manager=FakeManager(every),
                                    train_steps=train_steps, model=None)
    return types.SimpleNamespace(actor_trainer=trainer, rollout=FakeEngine())


def test_state_file_format_and_atomic_write(tmp_path):
    eng = FakeEngine()
    eng.rollouts = 3
    path = write_engine_state(str(tmp_path / "engine"), 4, eng)
    assert path == engine_state_path(str(tmp_path / "engine"), 4) == str(tmp_path / "engine/4.pkl")
    with open(path, "rb") as f:
        saved = pickle.load(f)
    assert set(saved) == {"step", "engine"} and saved["step"] == 4
    assert saved["engine"]["rollouts"] == 3
    np.testing.assert_array_equal(saved["engine"]["key"], [3, 4, 5, 6])
    assert os.listdir(tmp_path / "engine") == ["4.pkl"]   # no .tmp left behind

    class Unpicklable(FakeEngine):
        def checkpoint_state(self):
            return {"rollouts": 9, "f": lambda: 0}
    with pytest.raises((pickle.PicklingError, AttributeError)):
        write_engine_state(str(tmp_path / "engine"), 4, Unpicklable())
    assert read_engine_state(str(tmp_path / "engine"), 4)["rollouts"] == 3   # old file intact


def test_reads_the_examples_files_and_refuses_others(tmp_path):
    d = tmp_path / "engine"
    d.mkdir()
    for step in (9, 10, 2):   # written the way examples/grpo_smollm2.py always wrote them
        with open(d / f"{step}.pkl", "wb") as f:
            pickle.dump({"step": step, "engine": {"rollouts": step}}, f)
    (d / "12.pkl.tmp").write_bytes(b"half")
    (d / "notes.txt").write_text("x")
    assert saved_engine_steps(str(d)) == [2, 9, 10]   # numeric order, only <n>.pkl
    assert saved_engine_steps(str(tmp_path / "absent")) == []
    assert read_engine_state(str(d), 10) == {"rollouts": 10}
    with pytest.raises(FileNotFoundError, match=r"train step 4 .*4\.pkl.*\[2, 9, 10\]"):
        read_engine_state(str(d), 4)
    with open(d / "5.pkl", "wb") as f:
        pickle.dump({"step": 6, "engine": {}}, f)
    with pytest.raises(ValueError, match="step 6, not 5"):
        read_engine_state(str(d), 5)
    with open(d / "7.pkl", "wb") as f:
        pickle.dump([1, 2], f)
    with pytest.raises(ValueError, match="not an engine state file"):
        read_engine_state(str(d), 7)


def test_save_writes_beside_tunix_and_prunes_to_keep_plus_one(tmp_path):
    cluster = fake_cluster(every=2)
    inner = cluster.actor_trainer.checkpoint_manager
    hooked = []
    mgr = attach_engine_checkpoints(cluster, str(tmp_path / "e"), 2,
                                    before_engine_save=hooked.append)
    assert cluster.actor_trainer.checkpoint_manager is mgr and mgr.inner is inner
    for step in range(1, 10):   # tunix offers every step; the inner manager saves the even ones
        cluster.rollout.rollouts = 10 * step
        assert mgr.save(step, model=None, custom_metadata={"global_step": step + 1}) == (
            step % 2 == 0)
    assert hooked == [2, 4, 6, 8]
    assert saved_engine_steps(str(tmp_path / "e")) == [4, 6, 8]   # keep 2, + 1 still writing
    assert read_engine_state(str(tmp_path / "e"), 8)["rollouts"] == 80   # state at save time
    assert [c["custom_metadata"] for c in inner.calls] == [{"global_step": s + 1}
                                                           for s in range(1, 10)]
    cluster.rollout.rollouts = 99
    assert mgr.save(9, model=None, force=True)   # tunix's final forced save: no metadata
    assert inner.calls[-1]["custom_metadata"] == {"global_step": 9, "role": "actor"}
    assert saved_engine_steps(str(tmp_path / "e")) == [6, 8, 9]
    assert read_engine_state(str(tmp_path / "e"), 9)["rollouts"] == 99
    with pytest.raises(ValueError, match="already writes engine states"):
        attach_engine_checkpoints(cluster, str(tmp_path / "e"), 2)


def test_hook_refusal_writes_no_state_and_global_step_option(tmp_path):
    def refuse(step):
        raise RuntimeError(f"bookkeeping is not at step {step}")
    mgr = EngineCheckpoints(FakeManager(every=1), str(tmp_path), lambda: FakeEngine(), 1,
                            before_engine_save=refuse, train_steps_per_global_step=2)
    with pytest.raises(RuntimeError, match="not at step 6"):
        mgr.save(6, model=None, force=True)
    assert saved_engine_steps(str(tmp_path)) == []
    assert mgr.inner.calls[-1]["custom_metadata"] == {"global_step": 3, "role": "actor"}


def test_delegation_and_bad_arguments(tmp_path):
    mgr = EngineCheckpoints(FakeManager(every=3), str(tmp_path), lambda: FakeEngine(), 1)
    mgr.save(3, model=None)
    assert mgr.latest_step() == 3 and mgr.every == 3   # the inner manager's
    with pytest.raises(AttributeError):
        mgr.no_such_attribute
    assert copy.copy(mgr).inner is mgr.inner   # (no recursion before __init__ has run)
    with pytest.raises(ValueError, match="keep must be >= 1"):
        EngineCheckpoints(FakeManager(), str(tmp_path), lambda: FakeEngine(), 0)
    with pytest.raises(TypeError, match="function returning the engine"):
        EngineCheckpoints(FakeManager(), str(tmp_path), FakeEngine(), 1)
    with pytest.raises(ValueError, match="train_steps_per_global_step"):
        EngineCheckpoints(FakeManager(), str(tmp_path), lambda: FakeEngine(), 1,
                          train_steps_per_global_step=0)


def test_restore_puts_back_the_restored_step(tmp_path):
    d = str(tmp_path / "e")
    eng = FakeEngine()
    for step in (2, 4, 6):
        eng.rollouts = step
        write_engine_state(d, step, eng)
    cluster = fake_cluster(train_steps=4)
    assert restore_engine_state(cluster, d, sync_weights=False) == 4   # tunix's restored step
    assert cluster.rollout.restored["rollouts"] == 4 and cluster.rollout.params is None
    assert restore_engine_state(cluster, d, 6, sync_weights=False) == 6
    assert cluster.rollout.restored["rollouts"] == 6

    fresh = fake_cluster(train_steps=0)   # a fresh run: nothing to restore, no file needed
    assert restore_engine_state(fresh, str(tmp_path / "absent"), sync_weights=True) == 0
    assert fresh.rollout.restored is None and fresh.rollout.params is None
    with pytest.raises(FileNotFoundError, match=r"tunix restored train step 3, .*3\.pkl"):
        restore_engine_state(fake_cluster(train_steps=3), d, sync_weights=False)
    with pytest.raises(ValueError, match="step must be >= 0"):
        restore_engine_state(cluster, d, -1, sync_weights=False)


def test_restore_syncs_the_restored_policy_into_the_engine(tmp_path):
    from flax import nnx
    write_engine_state(str(tmp_path), 2, FakeEngine())
    cluster = fake_cluster(train_steps=2)
    cluster.actor_trainer.model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    restore_engine_state(cluster, str(tmp_path), sync_weights=True)
    params = cluster.rollout.params
    np.testing.assert_array_equal(np.asarray(params["kernel"][...]),
                                  np.asarray(cluster.actor_trainer.model.kernel[...]))


def test_finish_checkpoint_writes_waits_on_orbax(tmp_path):
    cluster = fake_cluster()
    orbax = cluster.actor_trainer.checkpoint_manager._checkpoint_manager
    finish_checkpoint_writes(cluster)   # tunix's own manager
    attach_engine_checkpoints(cluster, str(tmp_path), 1)
    finish_checkpoint_writes(cluster)   # wrapped
    assert orbax.waits == 2
    cluster.actor_trainer.checkpoint_manager.inner._checkpoint_manager = None   # no checkpoints
    finish_checkpoint_writes(cluster)
