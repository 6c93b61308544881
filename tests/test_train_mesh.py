"""The drafter trainer on a device mesh (issue 44): in a subprocess that sees 8 host CPU
devices (the flag must be set before jax is imported), 8 devices and 1 compute the same losses
and parameters, and a run checkpointed on 8 resumes on 1 as the unbroken run
(``train_mesh_worker.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def test_trainer_on_8_devices_equals_1_and_resumes_across_device_counts():
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                          " --xla_force_host_platform_device_count=8").strip(),
               PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent),
                                           os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(HERE / "train_mesh_worker.py")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert proc.stdout.count("ok ") == 4, proc.stdout


def test_two_processes_train_as_one_device_and_share_a_checkpoint(tmp_path):
    import socket
    with socket.socket() as s:   # a free local port for the coordinator
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent),
                                           os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, str(HERE / "train_multiprocess_worker.py"),
                               str(i), str(port), str(tmp_path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err[-4000:]
        assert out.count("ok process") == 1, out
    # the same run on this process's one device
    import numpy as np

    from dominotree_jax.train.dataset import SequenceDataset
    from dominotree_jax.train.features import FeatureCache
    from dominotree_jax.train.trainer import Trainer
    from train_fixtures import DCFG, TAPS, TCFG, tiny_target_and_answers
    from train_multiprocess_worker import TC
    target, store, _ = tiny_target_and_answers(str(tmp_path / "data"))
    ds = SequenceDataset(store, FeatureCache(str(tmp_path / "f"), TCFG, target.params, TAPS), 40)
    one = Trainer(DCFG, TCFG, target.params, ds, ds.split(10)[0], TC, str(tmp_path / "one"),
                  progress=False)
    losses = [r["loss"] for r in one.fit()]
    got = np.load(tmp_path / "two_processes.npz")
    np.testing.assert_allclose(got["losses"], losses, rtol=2e-4)
    for k, v in one.flat.items():
        np.testing.assert_allclose(got[f"p/{k}"], np.asarray(v), rtol=2e-4, atol=2e-5,
                                   err_msg=k)
    one.close()


def test_two_processes_load_an_orbax_target_train_from_the_command_line_and_write_one_log(
        tmp_path):
    """Issue 64 §7: ``python -m dominotree_jax.train --coordinator ...`` in two processes loads
    a target saved by convert's orbax save (each restoring it onto all devices of both), trains
    4 steps on the 2-device mesh, and the run's logs hold one row per step, written once."""
    import csv
    import socket

    from convert.orbax_io import save_params
    from train_fixtures import TCFG, tiny_target_and_answers
    target, _, _ = tiny_target_and_answers(str(tmp_path / "data"))
    save_params(str(tmp_path / "target"), "target", TCFG, target.params)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "run"
    argv = ["--stage", "train", "--target", str(tmp_path / "target"),
            "--data", str(tmp_path / "data"), "--out", str(out),
            "--features", str(tmp_path / "features"), "--steps", "4", "--batch", "8",
            "--anchors", "4", "--seq-len", "40", "--heldout-pct", "10", "--layers", "1",
            "--intermediate", "96", "--taps", "0,1", "--block-size", "4", "--gru", "16",
            "--emb", "16", "--mask-token-id", "127", "--warmup", "2", "--ckpt-minutes", "1e6",
            "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2"]
    procs = [subprocess.Popen([sys.executable, "-m", "dominotree_jax.train", *argv,
                               "--process-id", str(i)], env=env, cwd=str(HERE.parent),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, o + e[-4000:]
    with open(out / "train_log.csv") as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [1, 2, 3, 4]
    lines = (out / "log.txt").read_text().splitlines()
    assert sum("sequences from shards" in line for line in lines) == 1, lines
    assert "sequences from shards" in outs[0][0] and "shards" not in outs[1][0], outs[1][0]


def test_an_orbax_target_is_restored_onto_the_callers_mesh(tmp_path):
    """``restore_saved_params(..., mesh=)``: each array on the mesh by its declared axes (here
    a 1 x 1 mesh), the values those saved; without a mesh, on the default device."""
    import jax
    import numpy as np
    from flax import nnx
    from jax.sharding import NamedSharding

    from convert.orbax_io import restore_saved_params, save_params
    from dominotree_jax.model.target import init_target_params
    from dominotree_jax.sharding import make_mesh
    from train_fixtures import TCFG
    params = init_target_params(TCFG, seed=1)
    save_params(str(tmp_path / "t"), "target", TCFG, params)
    mesh = make_mesh(1, 1)
    on_mesh = restore_saved_params(str(tmp_path / "t"), TCFG, mesh=mesh)
    plain = restore_saved_params(str(tmp_path / "t"), TCFG)
    want = jax.tree.leaves(nnx.to_pure_dict(params))
    for got, default, w in zip(jax.tree.leaves(nnx.to_pure_dict(on_mesh)),
                               jax.tree.leaves(nnx.to_pure_dict(plain)), want):
        assert isinstance(got.sharding, NamedSharding) and got.sharding.mesh == mesh
        assert default.sharding.device_set == {jax.local_devices()[0]}
        np.testing.assert_array_equal(np.asarray(got), np.asarray(w))
