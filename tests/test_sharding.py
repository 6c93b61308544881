"""Sharded decoding (``dominotree_jax.sharding``) equals single-device decoding.

The check runs in a subprocess (``sharding_worker.py``) that sees 8 host CPU devices; this
pytest process keeps its single device (the flag must be set before jax is imported).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from dominotree_jax.sharding import param_spec

HERE = pathlib.Path(__file__).parent


def test_sharded_decode_equals_single_device_in_a_subprocess():
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                          " --xla_force_host_platform_device_count=8").strip(),
               PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(HERE / "sharding_worker.py")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert proc.stdout.count("ok ") == 6, proc.stdout


@pytest.mark.parametrize("names,shape,spec", [
    (("target", "layers", "0", "self_attn", "q_proj", "weight"), (64, 32), ("model", None)),
    (("target", "layers", "0", "self_attn", "q_proj", "bias"), (64,), ("model",)),
    (("drafter", "layers", "0", "mlp", "down_proj", "weight"), (32, 64), (None, "model")),
    (("target", "layers", "0", "self_attn", "k_proj", "weight"), (6, 32), ()),  # 6 % 4 != 0
    (("target", "embed_tokens", "weight"), (64, 32), ()),
    (("target", "norm", "weight"), (32,), ()),
    (("drafter", "fc", "weight"), (32, 64), ()),
])
def test_param_spec_rules(names, shape, spec):
    assert tuple(param_spec(names, shape, 4)) == spec


def test_vocab_sharding_is_opt_in():
    for names in [("target", "lm_head", "weight"), ("target", "embed_tokens", "weight"),
                  ("drafter", "embed_proj", "2", "weight")]:
        assert tuple(param_spec(names, (64, 8), 4, shard_vocab=True)) == ("model", None)
    assert tuple(param_spec(("drafter", "embed_proj", "0", "weight"), (8, 48), 4, True)) == ()
