"""Any supported target checkpoint → ``(TargetConfig, params, tokenizer source)``.

Accepts an HF checkpoint directory, a Llama-architecture ``.gguf`` file, or an orbax directory
written by ``python -m convert target``. The tokenizer source is the path whose tokenizer
files belong to the model (``None``: none known); loading the tokenizer is the caller's job.
"""

from __future__ import annotations

import os

from dominotree_jax.precision import cast_params

from convert.files import check_exists
from convert.gguf import load_gguf_target
from convert.hf import load_hf_target
from convert.orbax_io import is_orbax_dir, restore_saved_params, saved_config


def load_target_checkpoint(path: str, dtype: str | None = "float32"):
    """``(TargetConfig, params, tokenizer_source)`` in precision ``dtype`` (None: as stored),
    whatever the checkpoint kind: an orbax directory restores its saved dtype, then is cast."""
    path = os.fspath(path)
    check_exists(path)
    if os.path.isdir(path) and is_orbax_dir(path):
        cfg, tokenizer_source = saved_config(path, "target")
        params = restore_saved_params(path, cfg)
        if dtype is not None:
            params = cast_params(params, dtype)
        return cfg, params, tokenizer_source
    if path.endswith(".gguf"):
        cfg, params = load_gguf_target(path, dtype=dtype or "float32")
    else:
        cfg, params = load_hf_target(path, dtype=dtype)
    return cfg, params, path
