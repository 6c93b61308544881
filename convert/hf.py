"""HF checkpoint directory (config.json + safetensors, single file or sharded) → target params."""

from __future__ import annotations

import json
import os

import jax.numpy as jnp

from convert.errors import CheckpointError
from convert.params import fill_state
from convert.safetensors_io import read_safetensors
from dominotree_jax.config import TargetConfig
from dominotree_jax.model.target import target_graphdef

# Buffers some exporters write that carry no parameters.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")


def read_config(path: str) -> dict:
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise CheckpointError(path, other=["no config.json in the checkpoint directory"])
    with open(cfg_path) as f:
        return json.load(f)


def read_checkpoint_tensors(path: str) -> dict:
    """All tensors of ``model.safetensors`` or of the shards named by the index file."""
    single = os.path.join(path, "model.safetensors")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(single):
        files = [single]
    elif os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = [os.path.join(path, s) for s in sorted(set(weight_map.values()))]
        absent = [f for f in files if not os.path.isfile(f)]
        if absent:
            raise CheckpointError(path, other=[f"shard listed in the index is missing: {a}"
                                               for a in absent])
    else:
        raise CheckpointError(path, other=["neither model.safetensors nor "
                                           "model.safetensors.index.json found"])
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(f))
    return tensors


def load_hf_target(path: str, dtype: str | None = "float32"):
    """(TargetConfig, params) from an HF checkpoint directory.

    ``dtype``: parameter dtype (``float32`` default; ``None`` keeps the stored dtype).
    """
    hf_cfg = read_config(path)
    cfg = TargetConfig.from_hf_dict(hf_cfg)
    tensors = read_checkpoint_tensors(path)
    bad = [f"tensor {n}: unsupported dtype {a.dtype}" for n, a in tensors.items()
           if a.dtype.name not in SUPPORTED_DTYPES]
    if bad:
        raise CheckpointError(path, other=bad)
    named = {}
    for name, a in tensors.items():
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        short = name[len("model."):] if name.startswith("model.") else name
        if short == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # tied head: the embedding is the head
        named[short] = a
    if dtype is None:
        dtype = next(iter(named.values())).dtype.name if named else "float32"
    if dtype not in SUPPORTED_DTYPES:
        raise CheckpointError(path, other=[f"unsupported parameter dtype {dtype!r}; "
                                           f"supported: {SUPPORTED_DTYPES}"])
    _, abstract = target_graphdef(cfg, dtype)
    return cfg, fill_state(abstract, named, path, jnp.dtype(dtype))
