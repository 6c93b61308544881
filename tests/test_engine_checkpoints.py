"""The engine state beside tunix's actor checkpoints (``dominotree_jax.rollout.checkpoints``,
``state_file``): file format, refusal of files that are not ours, atomic writes, pruning, the
hook, restore of the restored step, and errors. Fake tunix pieces only (a checkpoint manager
whose ``save`` says whether it saved, an engine with ``checkpoint_state`` /
``restore_checkpoint_state``): the tunix learner run is
``experiments/grpo/tests/test_grpo_example.py``."""

from __future__ import annotations

import copy
import io
import json
import os
import types
import zipfile

import numpy as np
import pytest

from dominotree_jax.rollout.checkpoints import (EngineCheckpoints, attach_engine_checkpoints,
                                                engine_state_path, finish_checkpoint_writes,
                                                read_engine_state, restore_engine_state,
                                                saved_engine_steps, write_engine_state)
from dominotree_jax.rollout.state_file import StateFileError


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
    assert path == engine_state_path(str(tmp_path / "engine"), 4) == str(tmp_path / "engine/4.npz")
    with zipfile.ZipFile(path) as z:   # JSON plus .npy members, nothing executable
        header = json.loads(z.read("state.json"))
        assert sorted(z.namelist()) == ["a0.npy", "state.json"]
    assert header["format"] == "dominotree-state" and header["version"] == 1
    assert header["meta"] == {"kind": "engine", "step": 4}
    assert header["state"]["v"]["rollouts"] == 3
    with np.load(path) as npz:   # also a plain .npz
        np.testing.assert_array_equal(npz["a0"], [3, 4, 5, 6])
    assert os.listdir(tmp_path / "engine") == ["4.npz"]   # no .tmp left behind
    saved = read_engine_state(str(tmp_path / "engine"), 4)
    assert saved["rollouts"] == 3 and saved["key"].dtype == np.uint32

    class Unwritable(FakeEngine):
        def checkpoint_state(self):
            return {"rollouts": 9, "f": lambda: 0}
    with pytest.raises(StateFileError, match=r"state\.f: cannot write a function"):
        write_engine_state(str(tmp_path / "engine"), 4, Unwritable())
    assert read_engine_state(str(tmp_path / "engine"), 4)["rollouts"] == 3   # old file intact


def test_files_that_are_not_ours_are_refused_by_content(tmp_path):
    d = tmp_path / "engine"
    d.mkdir()
    for step in (9, 10, 2):
        write_engine_state(str(d), step, FakeEngine())
    (d / "12.npz.tmp").write_bytes(b"half")
    (d / "notes.txt").write_text("x")
    (d / "3.pkl").write_bytes(b"\x80\x04old")   # an older version's file: never opened
    assert saved_engine_steps(str(d)) == [2, 9, 10]   # numeric order, only <n>.npz
    assert saved_engine_steps(str(tmp_path / "absent")) == []
    with pytest.raises(FileNotFoundError, match=r"train step 4 .*4\.npz.*\[2, 9, 10\]"):
        read_engine_state(str(d), 4)
    with pytest.raises(StateFileError, match=r"3\.pkl is an engine state of an older version"):
        read_engine_state(str(d), 3)
    os.replace(d / "9.npz", d / "5.npz")
    with pytest.raises(StateFileError, match="step 9, not 5"):
        read_engine_state(str(d), 5)
    cases = {  # what the file holds -> what the refusal says
        b"\x80\x04\x95junk": "not a zip archive .*runs code when opened",
        b"plain text": "not a zip archive",
        _zip({"other.json": "{}"}): "it has no state.json",
        _zip({"state.json": "{oops"}): "malformed state.json",
        _zip({"state.json": json.dumps({"format": "something-else"})}): "format 'something-else'",
        _zip({"state.json": json.dumps({"format": "dominotree-state", "version": 99, "meta": {},
                                        "state": None})}): "version 99",
        _zip({"state.json": json.dumps({"format": "dominotree-state", "version": 1,
                                        "meta": {"kind": "engine", "step": 7},
                                        "state": {"t": "array", "v": "a0"}})}): "a0.npy is missing",
        _zip({"state.json": json.dumps({"format": "dominotree-state", "version": 1,
                                        "meta": {"kind": "engine", "step": 7},
                                        "state": {"t": "record", "type": "os.system",
                                                  "v": {}}})}): "unknown record type 'os.system'",
        _zip({"state.json": json.dumps({"format": "dominotree-state", "version": 1,
                                        "meta": {"kind": "trainer", "step": 7},
                                        "state": {"t": "dict", "v": {}}})}): "kind 'trainer'",
    }
    for content, message in cases.items():
        (d / "7.npz").write_bytes(content)
        with pytest.raises(StateFileError, match=message) as e:
            read_engine_state(str(d), 7)
        assert str(d / "7.npz") in str(e.value)


def _zip(members: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in members.items():
            z.writestr(name, text)
    return buf.getvalue()


def test_a_real_engine_state_round_trips_into_the_live_structure(tmp_path):
    """The state ``DominoTreeRollout.checkpoint_state()`` holds: ``(DecodeConfig, rows)`` keys,
    ``AutoState``s, the refresher's leaves and its optax state (restored into the live
    optimizer's structure, its leaves checked), scalars and ``None``s."""
    import jax
    import optax

    from dominotree_jax.decoding.auto_size import initial_state
    from dominotree_jax.decoding.config import DecodeConfig
    from spec_fixtures import tiny_pair

    tcfg, dcfg, _ = tiny_pair()
    config = DecodeConfig(target=tcfg, drafter=dcfg, method="dflash", budget="auto",
                          max_new_tokens=8, lookup=2, precision="float32")
    flat = {"w": np.ones((3, 2), np.float32), "b": np.zeros((2,), np.float32)}
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    opt_state = jax.tree.map(np.asarray, opt.init(flat))
    state = {"key": np.arange(2, dtype=np.uint32), "last_temperature": 0.7,
             "refresher": {"flat": flat, "opt_state": opt_state, "num_steps": 3},
             "refresh_schedule": {"ema": None, "gap": 2},
             "auto_states": {(config, 4): jax.tree.map(np.asarray, initial_state(config, 4))},
             "probed_tau": -1.0, "lookup_calls": {(config, 4): {"gain": 1.2, "gap": 1}}}

    class Engine(FakeEngine):
        def checkpoint_state(self):
            return state
    write_engine_state(str(tmp_path), 5, Engine())
    with pytest.raises(StateFileError, match="needs the live object"):
        read_engine_state(str(tmp_path), 5)
    back = read_engine_state(str(tmp_path), 5, like=state)
    assert set(back) == set(state) and back["last_temperature"] == 0.7
    (key,) = back["auto_states"]
    assert key == (config, 4) and hash(key) == hash((config, 4))   # finds the carried state
    assert type(back["auto_states"][key]) is type(state["auto_states"][(config, 4)])
    assert jax.tree.structure(back["refresher"]["opt_state"]) == jax.tree.structure(opt_state)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(state)):
        np.testing.assert_array_equal(a, b)
    other = {**state, "refresher": {**state["refresher"],
                                    "opt_state": opt.init({"w": np.ones((4, 2), np.float32),
                                                           "b": np.zeros((2,), np.float32)})}}
    with pytest.raises(StateFileError, match=r"refresher\.opt_state: leaf \d+ is saved as "
                                             r"float32\[2\], the live structure holds "
                                             r"float32\[4, 2\]|float32\[3, 2\], the live"):
        read_engine_state(str(tmp_path), 5, like=other)


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
    with pytest.raises(FileNotFoundError, match=r"tunix restored train step 3, .*3\.npz"):
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
