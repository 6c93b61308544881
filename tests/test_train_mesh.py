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
    assert proc.stdout.count("ok ") == 3, proc.stdout
