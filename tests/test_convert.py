"""Converters refuse bad checkpoints by name, never half-load, and round-trip through orbax."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dominotree_jax as dj
from convert.errors import CheckpointError
from convert.safetensors_io import read_safetensors, write_safetensors
from hf_models import build_and_save


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3")
    build_and_save("qwen3_gqa_headdim", str(d))
    return str(d)


def _copy(ckpt, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(ckpt, d)
    return str(d)


def test_every_problem_is_listed(ckpt, tmp_path):
    d = _copy(ckpt, tmp_path)
    t = dict(read_safetensors(os.path.join(d, "model.safetensors")))
    del t["model.layers.0.mlp.up_proj.weight"]
    del t["model.norm.weight"]
    t["model.layers.0.extra.weight"] = np.zeros((2, 2), np.float32)
    t["model.layers.1.self_attn.q_proj.weight"] = np.zeros((5, 64), np.float32)
    write_safetensors(os.path.join(d, "model.safetensors"), {k: np.array(v) for k, v in t.items()})
    with pytest.raises(CheckpointError) as e:
        dj.load_target(d)
    msg = str(e.value)
    assert "missing tensor: layers.0.mlp.up_proj.weight" in msg
    assert "missing tensor: norm.weight" in msg
    assert "unexpected tensor: layers.0.extra.weight" in msg
    assert ("shape mismatch: layers.1.self_attn.q_proj.weight: expected (96, 64), "
            "found (5, 64)") in msg


def test_unsupported_architecture_is_refused_by_name(ckpt, tmp_path):
    d = _copy(ckpt, tmp_path)
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["architectures"] = ["GPT2LMHeadModel"]
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'"):
        dj.load_target(d)


def test_unsupported_dtypes_are_refused(ckpt, tmp_path):
    d = _copy(ckpt, tmp_path)
    with pytest.raises(CheckpointError, match="unsupported parameter dtype 'int8'"):
        from convert.hf import load_hf_target
        load_hf_target(d, dtype="int8")
    t = {k: np.array(v) for k, v in read_safetensors(os.path.join(d, "model.safetensors")).items()}
    t["model.norm.weight"] = t["model.norm.weight"].astype(np.int32)
    write_safetensors(os.path.join(d, "model.safetensors"), t)
    with pytest.raises(CheckpointError,
                       match="norm.weight: floating-point weights expected, the file holds int32"):
        dj.load_target(d)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        dj.load_target(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(CheckpointError, match="neither model.safetensors"):
        from convert.hf import read_checkpoint_tensors
        read_checkpoint_tensors(str(tmp_path))


def test_bf16_load_keeps_dtype_when_asked(tmp_path):
    build_and_save("qwen2_bias_bf16", str(tmp_path / "m"))
    t = dj.load_target(str(tmp_path / "m"), dtype=None, tokenizer=False)
    assert {x.dtype.name for x in jax.tree.leaves(t.params)} == {"bfloat16"}


def test_orbax_round_trip_through_the_command_line(ckpt, tmp_path):
    from convert.__main__ import main
    out = str(tmp_path / "orbax")
    assert main(["target", ckpt, out]) == 0
    a = dj.load_target(ckpt, tokenizer=False)
    b = dj.load_target(out, tokenizer=False)
    assert a.config == b.config
    assert jax.tree.all(jax.tree.map(lambda x, y: bool((x == y).all()), a.params, b.params))
    assert main(["target", ckpt, out]) == 2  # refuses to overwrite
    # an orbax directory honours the precision asked for (it once returned the stored one)
    c = dj.load_target(out, dtype="bfloat16", tokenizer=False)
    assert {x.dtype for x in jax.tree.leaves(c.params)} == {jnp.dtype("bfloat16")}
    assert {x.dtype for x in jax.tree.leaves(dj.load_target(out, dtype=None, tokenizer=False)
                                             .params)} == {jnp.dtype("float32")}
    with pytest.raises(ValueError, match="unknown target dtype 'int8'"):
        dj.load_target(out, dtype="int8", tokenizer=False)
    assert main(["inspect", ckpt]) == 0
