"""Sharded decoding (``dominotree_jax.sharding``) equals single-device decoding.

The check runs in a subprocess (``sharding_worker.py``) that sees 8 host CPU devices; this
pytest process keeps its single device (the flag must be set before jax is imported).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from dominotree_jax.model.drafter import init_drafter_params
from dominotree_jax.model.target import init_target_params
from dominotree_jax.sharding import (LOGICAL_AXES, ShardingRules, declare, flat_param_specs,
                                     logical_axes, param_specs)
from spec_fixtures import tiny_pair

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


def _tiny_states():
    tcfg, dcfg, _ = tiny_pair()
    tcfg = dataclasses.replace(tcfg, num_attention_heads=8, num_key_value_heads=4)
    dcfg = dataclasses.replace(dcfg, num_attention_heads=8, num_key_value_heads=4)
    return {"target": init_target_params(tcfg, 0), "drafter": init_drafter_params(dcfg, 1)}


def test_every_weight_declares_its_logical_axes():
    params = _tiny_states()
    variables = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    assert variables
    for v in variables:
        axes = logical_axes(v)
        assert len(axes) == np.ndim(v.get_value()) and set(axes) <= set(LOGICAL_AXES), axes
    # the placement comes from the declarations, not from the modules' names
    specs = param_specs(params, 4)
    attn, mlp = specs["target"]["layers"][0]["self_attn"], specs["drafter"]["layers"][0]["mlp"]
    assert attn["q_proj"]["weight"] == P("model", None)
    assert attn["k_proj"]["weight"] == P("model", None)
    assert attn["o_proj"]["weight"] == P(None, "model")
    assert mlp["down_proj"]["weight"] == P(None, "model")
    assert specs["target"]["norm"]["weight"] == P()
    assert specs["drafter"]["fc"]["weight"] == P()
    assert specs["target"]["embed_tokens"]["weight"] == P()
    flat = flat_param_specs(params["drafter"], 4, ShardingRules(vocab=True))
    assert flat["embed_proj.2.weight"] == P("model", None)
    assert flat["embed_proj.0.weight"] == P()
    assert flat["layers.0.mlp.gate_proj.weight"] == P("model", None)


@pytest.mark.parametrize("axes,shape,spec", [
    (("heads", "embed"), (64, 32), ("model", None)),
    (("kv_heads",), (64,), ("model",)),
    (("embed", "mlp"), (32, 64), (None, "model")),
    (("kv_heads", "embed"), (6, 32), ()),          # 6 % 4 != 0: replicated
    (("vocab", "embed"), (64, 32), ()),            # vocabulary sharding is opt-in
    (("embed",), (32,), ()),
    (("embed", "taps"), (32, 64), ()),
])
def test_rules_map_logical_axes_to_the_model_axis(axes, shape, spec):
    assert tuple(ShardingRules().spec(axes, shape, 4)) == spec


def test_vocab_sharding_is_opt_in_and_rules_are_checked():
    assert tuple(ShardingRules(vocab=True).spec(("vocab", "embed"), (64, 8), 4)) == \
        ("model", None)
    assert tuple(ShardingRules(vocab=True).spec(("head_embed", "head_in"), (8, 48), 4)) == ()
    assert tuple(ShardingRules(model_axes=("taps",)).spec(("embed", "taps"), (8, 48), 4)) == \
        (None, "model")
    with pytest.raises(ValueError, match="unknown logical axes"):
        ShardingRules(model_axes=("head",))
    with pytest.raises(ValueError, match="do not match a weight of shape"):
        ShardingRules().spec(("heads",), (4, 4), 2)
    with pytest.raises(ValueError, match="unknown logical axes"):
        declare("heads", "hidden")


def test_plain_arrays_are_refused_by_name():
    tree = {"target": {"w": np.zeros((4, 4), np.float32)}}
    with pytest.raises(ValueError, match=r"\['target'\]\['w'\] declares no logical axes"):
        param_specs(tree, 2)
