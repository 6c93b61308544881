"""Released DFlash / Domino drafter directories ↔ drafter params (SPEC §2–3 layout).

A drafter directory holds ``config.json`` (Qwen3 fields, ``block_size``, ``num_target_layers``,
``dflash_config``) and ``model.safetensors`` (or shards) whose keys are the drafter's own names,
optionally prefixed with ``model.``. Loading checks every tensor name and shape and, given the
target's config, that the pair fits (``check_pair``).
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from convert.errors import CheckpointError
from convert.hf import SUPPORTED_DTYPES, read_checkpoint_tensors, read_config
from convert.params import fill_state, state_to_flat
from convert.safetensors_io import write_safetensors
from dominotree_jax.config import DrafterConfig, TargetConfig
from dominotree_jax.model.drafter import check_drafter, check_pair, drafter_graphdef

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_SAVE_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def load_drafter(path: str, dtype: str | None = "float32",
                 target_cfg: TargetConfig | None = None):
    """(DrafterConfig, params) from a drafter checkpoint directory.

    ``dtype``: parameter dtype (``None`` keeps the stored dtype). Raises ``ConfigError`` when
    the config is unusable (or does not fit ``target_cfg``) and ``CheckpointError`` listing all
    missing, unexpected and wrongly shaped tensors.
    """
    cfg = DrafterConfig.from_hf_dict(read_config(path))
    if target_cfg is None:
        check_drafter(cfg)
    else:
        check_pair(target_cfg, cfg)
    tensors = read_checkpoint_tensors(path)
    bad = [f"tensor {n}: unsupported dtype {a.dtype}" for n, a in tensors.items()
           if a.dtype.name not in SUPPORTED_DTYPES]
    if bad:
        raise CheckpointError(path, other=bad)
    named = {}
    for name, a in tensors.items():
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        named[name[len("model."):] if name.startswith("model.") else name] = a
    if dtype is None:
        dtype = next(iter(named.values())).dtype.name if named else "float32"
    if dtype not in SUPPORTED_DTYPES:
        raise CheckpointError(path, other=[f"unsupported parameter dtype {dtype!r}; "
                                           f"supported: {SUPPORTED_DTYPES}"])
    _, abstract = drafter_graphdef(cfg, dtype)
    return cfg, fill_state(abstract, named, path, jnp.dtype(dtype))


def save_drafter(path: str, cfg: DrafterConfig, params, dtype: str = "bfloat16") -> None:
    """Write ``config.json`` and ``model.safetensors`` in the layout ``load_drafter`` reads."""
    if dtype not in _SAVE_DTYPES:
        raise ValueError(f"unsupported save dtype {dtype!r}; supported: {sorted(_SAVE_DTYPES)}")
    os.makedirs(path, exist_ok=True)
    hf = cfg.to_hf_dict()
    hf["torch_dtype"] = dtype
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
    flat = {n: np.asarray(a).astype(np.float32).astype(_SAVE_DTYPES[dtype])
            for n, a in state_to_flat(params).items()}
    write_safetensors(os.path.join(path, "model.safetensors"), flat, {"format": "pt"})
