"""HF checkpoint directory (config.json + safetensors, single file or sharded) → target params."""

from __future__ import annotations

import jax.numpy as jnp

from convert.files import checkpoint_names, param_dtype, read_checkpoint_tensors, read_config
from convert.params import fill_state
from dominotree_jax.config import ConfigError, TargetConfig
from dominotree_jax.model.target import target_graphdef


def hf_target_config(path: str) -> TargetConfig:
    """The ``TargetConfig`` of an HF checkpoint directory (config errors name the file)."""
    try:
        return TargetConfig.from_hf_dict(read_config(path))
    except ConfigError as e:
        raise ConfigError(f"{path}/config.json: {e}") from None


def load_hf_target(path: str, dtype: str | None = "float32"):
    """(TargetConfig, params) from an HF checkpoint directory.

    ``dtype``: parameter dtype (``float32`` default; ``None`` keeps the stored dtype).
    """
    cfg = hf_target_config(path)
    # a tied head: the embedding is the head, a stored lm_head copy is dropped
    tied = cfg.tie_word_embeddings
    named = checkpoint_names(path, read_checkpoint_tensors(path),
                             lambda n: None if tied and n == "lm_head.weight" else n)
    dtype = param_dtype(path, dtype, named)
    _, abstract = target_graphdef(cfg, dtype)
    return cfg, fill_state(abstract, named, path, jnp.dtype(dtype))

