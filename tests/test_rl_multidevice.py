"""RL rollouts on many devices and many processes, each in subprocesses (the device count and
``jax.distributed`` must be set before jax starts):

- ``rl_mesh_worker.py``: tunix's ``GRPOLearner`` through ``RLCluster`` with ``DominoTreeRollout``
  on an 8-device CPU mesh (2 x 4, parameters placed by ``dominotree_jax.sharding``);
- ``multihost_worker.py`` x 2: two processes joined by ``jax.distributed.initialize`` on
  127.0.0.1 (gloo collectives) run one sharded ``decode`` equal to the single-process one;
- ``rl_cluster_multiprocess_worker.py`` x 2: a whole ``RLCluster`` (``GRPOLearner``, engine,
  trainer) across the two processes trains the policy a single process trains.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys

import pytest

pytest.importorskip("tunix", reason="google-tunix is not installed (make test installs it)")

HERE = pathlib.Path(__file__).parent


def _env(devices: int) -> dict:
    return dict(os.environ, JAX_PLATFORMS="cpu",
                XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                           f" --xla_force_host_platform_device_count={devices}").strip(),
                PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))


def test_grpo_learner_on_an_8_device_mesh():
    proc = subprocess.run([sys.executable, str(HERE / "rl_mesh_worker.py")], env=_env(8),
                          capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert proc.stdout.count("ok ") == 4, proc.stdout


def _two_processes(worker: str, timeout: int = 300) -> list[str]:
    """Run ``worker PROCESS_ID PORT`` as processes 0 and 1 (2 host devices each) joined on a
    free local port; their stdouts, after checking both exited 0."""
    with socket.socket() as s:   # a free local port for the coordinator
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, str(HERE / worker), str(i), str(port)],
                              env=_env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(2)]
    outs = [p.communicate(timeout=timeout) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err[-4000:]
    return [out for out, _ in outs]


def test_two_process_sharded_decode_equals_single_process():
    for out in _two_processes("multihost_worker.py"):
        assert out.count("ok process") == 2, out


def test_two_process_rl_cluster_equals_single_process():
    """GRPOLearner, the engine and the trainer across two processes (what runs where:
    rl_cluster_multiprocess_worker.py) train the policy a single process trains."""
    first, second = _two_processes("rl_cluster_multiprocess_worker.py")
    assert "ok process 0: 2 GRPO steps of a 2-process MultiProcessRLCluster" in first, first
    assert "ok process 1: trained" in second, second
