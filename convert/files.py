"""Reading an HF-style checkpoint directory: ``config.json`` and its safetensors tensors.

Shared by target and drafter loading: every problem (missing path, unreadable JSON, missing or
truncated tensor files, unsupported dtypes) is a ``CheckpointError`` naming the file.
"""

from __future__ import annotations

import json
import os

from convert.errors import CheckpointError
from convert.safetensors_io import read_safetensors

from dominotree_jax.precision import PRECISIONS

SUPPORTED_DTYPES = PRECISIONS  # the precision policy's names (dominotree_jax/precision.py)
# integer tensors: id maps (a drafter's draft-to-target ``d2t``), loaded as they are
ID_DTYPES = ("int32", "int64")
# packed MXFP4 tensors (gpt-oss's experts as released), dequantised at load
PACKED_SUFFIXES = ("_blocks", "_scales")
# Buffers some exporters write that carry no parameters.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def check_exists(path: str) -> None:
    if not os.path.exists(path):
        raise CheckpointError(path, other=["the path does not exist"])


def read_json(path: str) -> dict:
    """A JSON object from ``path``; malformed JSON is reported with the file's name."""
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(path, other=[f"malformed JSON in {os.path.basename(path)}: "
                                           f"{e.msg} at line {e.lineno} column {e.colno}"])
    except UnicodeDecodeError as e:
        raise CheckpointError(path, other=[f"{os.path.basename(path)} is not UTF-8 text: {e}"])
    if not isinstance(data, dict):
        raise CheckpointError(path, other=[f"{os.path.basename(path)} holds a "
                                           f"{type(data).__name__}, not a JSON object"])
    return data


def read_config(path: str) -> dict:
    """The ``config.json`` of checkpoint directory ``path``."""
    check_exists(path)
    if not os.path.isdir(path):
        raise CheckpointError(path, other=["not a checkpoint directory (expected a directory "
                                           "with config.json, or a .gguf file)"])
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise CheckpointError(path, other=["no config.json in the checkpoint directory"])
    return read_json(cfg_path)


def read_checkpoint_tensors(path: str) -> dict:
    """All tensors of ``model.safetensors`` or of the shards named by the index file."""
    single = os.path.join(path, "model.safetensors")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(single):
        files = [single]
    elif os.path.isfile(index):
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(index, other=["the index has no weight_map object"])
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


def checkpoint_names(path: str, tensors: dict, rename=None) -> dict:
    """``tensors`` under the model's parameter names: parameter-free buffers dropped, a leading
    ``model.`` removed, then ``rename(name)`` (``None``: drop the tensor) applied. Tensors of an
    unsupported dtype are refused, all named in one error."""
    bad = [f"tensor {n}: unsupported dtype {a.dtype}" for n, a in tensors.items()
           if a.dtype.name not in SUPPORTED_DTYPES + ID_DTYPES
           and not (a.dtype.name == "uint8" and n.endswith(PACKED_SUFFIXES))]
    if bad:
        raise CheckpointError(path, other=bad)
    named = {}
    for name, a in tensors.items():
        if name.endswith(IGNORED_SUFFIXES):
            continue
        short = name[len("model."):] if name.startswith("model.") else name
        short = rename(short) if rename else short
        if short is not None:
            named[short] = a
    return named


def param_dtype(path: str, dtype: str | None, named: dict) -> str:
    """The parameter dtype to load into: ``dtype``, or the stored one when ``None``."""
    if dtype is None:
        floats = [a.dtype.name for a in named.values()
                  if a.dtype.name not in ID_DTYPES + ("uint8",)]
        dtype = floats[0] if floats else "float32"
    if dtype not in SUPPORTED_DTYPES:
        raise CheckpointError(path, other=[f"unsupported parameter dtype {dtype!r}; "
                                           f"supported: {SUPPORTED_DTYPES}"])
    return dtype
