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
