"""HF checkpoint directory (config.json + safetensors, single file or sharded) → target params."""

from __future__ import annotations

import jax.numpy as jnp

from convert.errors import CheckpointError
from convert.files import checkpoint_names, param_dtype, read_checkpoint_tensors, read_config
from convert.params import check_layer_count, fill_state
from convert.target_layouts import adapt_target_tensors
from dominotree_jax.config import ConfigError, TargetConfig
from dominotree_jax.model.target import target_graphdef


def hf_target_config(path: str) -> TargetConfig:
    """The ``TargetConfig`` of an HF checkpoint directory (config errors name the file)."""
    try:
        return TargetConfig.from_hf_dict(read_config(path))
    except ConfigError as e:
        raise ConfigError(f"{path}/config.json: {e}") from None


# Parts of a released multimodal / hybrid checkpoint that a text decoder does not use: the
# vision tower and the multi-token-prediction head (dropped by name; anything else unexpected
# is refused).
UNUSED_PREFIXES = ("visual.", "mtp.")
# where a multimodal checkpoint keeps its text model (after the leading ``model.``)
TEXT_MODEL_PREFIX = "language_model."


def target_tensor_name(cfg, name: str) -> str | None:
    """A target checkpoint tensor's parameter name (its leading ``model.`` already removed),
    None for a tensor that is not loaded: a tied head's stored copy, a hybrid release's vision
    tower and MTP head."""
    if cfg.tie_word_embeddings and name == "lm_head.weight":
        return None   # a tied head: the embedding is the head
    if cfg.is_hybrid:
        if name.startswith(UNUSED_PREFIXES):
            return None
        if name.startswith(TEXT_MODEL_PREFIX):
            return name[len(TEXT_MODEL_PREFIX):]
    return name


def load_hf_target(path: str, dtype: str | None = "float32"):
    """(TargetConfig, params) from an HF checkpoint directory.

    ``dtype``: parameter dtype (``float32`` default; ``None`` keeps the stored dtype).
    """
    cfg = hf_target_config(path)
    named = checkpoint_names(path, read_checkpoint_tensors(path),
                             lambda n: target_tensor_name(cfg, n))
    try:
        named = adapt_target_tensors(cfg, named)
    except ValueError as e:   # experts missing or of unequal shapes
        raise CheckpointError(path, other=[str(e)]) from None
    check_layer_count(cfg.num_hidden_layers, named, path)
    dtype = param_dtype(path, dtype, named)
    _, abstract = target_graphdef(cfg, dtype)
    return cfg, fill_state(abstract, named, path, jnp.dtype(dtype))

