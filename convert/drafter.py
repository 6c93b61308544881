"""Released DFlash / Domino / DSpark drafter directories ↔ drafter params.

A drafter directory holds ``config.json`` (Qwen3 fields, ``block_size``, ``num_target_layers``,
``dflash_config``) and ``model.safetensors`` (or shards) whose keys are the drafter's own names,
optionally prefixed with ``model.``; older Domino releases keep the head's tensors under
``logit_head.``. A DSpark release (DeepSpec's ``Qwen3DSparkModel``: its fields at the top
level, ``markov_head.*`` and ``confidence_head.*``) also stores frozen copies of the target's
``embed_tokens`` and ``lm_head``: the drafter reads the target's own, so the copies are checked
for shape and, given the target's parameters, against them. Loading checks every tensor name
and shape and, given the target's config, that the pair fits
(``dominotree_jax.config.check_pair``). An orbax directory written by ``python -m convert
drafter`` loads too.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from convert.files import checkpoint_names, param_dtype, read_checkpoint_tensors, read_config
from convert.orbax_io import is_orbax_dir, restore_saved_params, saved_config
from convert.params import check_layer_count, fill_state
from convert.safetensors_io import write_safetensors
from dominotree_jax.config import (ConfigError, DrafterConfig, TargetConfig, check_drafter,
                                   check_pair)
from convert.errors import CheckpointError
from dominotree_jax.model.drafter import check_draft_vocab, drafter_graphdef
from dominotree_jax.model.state import state_to_flat

_SAVE_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
OLD_HEAD_PREFIX = "logit_head."


def drafter_config(path: str) -> DrafterConfig:
    """The ``DrafterConfig`` of a drafter directory (config errors name the file)."""
    try:
        return DrafterConfig.from_hf_dict(read_config(path))
    except ConfigError as e:
        raise ConfigError(f"{path}/config.json: {e}") from None


def rename_head(name: str) -> str:
    """A checkpoint name without the older releases' ``logit_head.`` prefix."""
    return name[len(OLD_HEAD_PREFIX):] if name.startswith(OLD_HEAD_PREFIX) else name


def _check(cfg: DrafterConfig, target_cfg: TargetConfig | None) -> None:
    if target_cfg is None:
        check_drafter(cfg)
    else:
        check_pair(target_cfg, cfg)


def load_drafter(path: str, dtype: str | None = "float32",
                 target_cfg: TargetConfig | None = None, target_params=None):
    """(DrafterConfig, params) from a drafter checkpoint directory (or its orbax conversion).

    ``dtype``: parameter dtype (``None`` keeps the stored dtype). Raises ``ConfigError`` when
    the config is unusable (or does not fit ``target_cfg``) and ``CheckpointError`` listing all
    missing, unexpected and wrongly shaped tensors. ``target_params`` (with ``target_cfg``): a
    DSpark release's frozen copies of the target's tables must equal them.
    """
    path = os.fspath(path)
    if is_orbax_dir(path):
        cfg, _ = saved_config(path, "drafter")
        _check(cfg, target_cfg)
        params = restore_saved_params(path, cfg)
        _check_d2t(cfg, params, path)
        if dtype is not None:   # restored as saved, then in the precision asked for
            from dominotree_jax.precision import cast_params
            params = cast_params(params, dtype)
        return cfg, params
    cfg = drafter_config(path)
    _check(cfg, target_cfg)
    named = checkpoint_names(path, read_checkpoint_tensors(path), rename_head)
    copies = frozen_copies(cfg, named, path)
    if copies and target_params is not None and target_cfg is not None:
        check_frozen_copies(copies, target_cfg, target_params, path)
    check_layer_count(cfg.num_hidden_layers, named, path)
    dtype = param_dtype(path, dtype, named)
    _, abstract = drafter_graphdef(cfg, dtype)
    params = fill_state(abstract, named, path, jnp.dtype(dtype))
    _check_d2t(cfg, params, path)
    return cfg, params


FROZEN_COPIES = {"embed_tokens.weight": "embed", "lm_head.weight": "head"}


def frozen_copies(cfg: DrafterConfig, named: dict, path: str) -> dict:
    """A DSpark release's copies of the target's tables, taken out of ``named`` (``{name:
    array}``), each checked to be ``[V, H]``; other drafters keep them as unexpected tensors."""
    if not cfg.is_dspark:
        return {}
    copies = {n: named.pop(n) for n in FROZEN_COPIES if n in named}
    want = (cfg.vocab_size, cfg.hidden_size)
    bad = [(n, want, tuple(a.shape)) for n, a in copies.items() if tuple(a.shape) != want]
    if bad:
        raise CheckpointError(path, mismatched=bad)
    return copies


def check_frozen_copies(copies: dict, target_cfg: TargetConfig, target_params, path: str):
    """Refuse a DSpark drafter whose stored copies of the target's token embedding / LM head
    differ from the target's (compared in the narrower of the two dtypes): it was trained for
    another target (or the target is quantized: load the drafter alone to pair them anyway)."""
    from dominotree_jax.model.target import bind_target
    target = bind_target(target_cfg, target_params)
    tables = {"embed": target.embed_tokens.weight[...], "head": target.head_weight_VH}
    bad = []
    for name, copy in copies.items():
        mine = jnp.asarray(tables[FROZEN_COPIES[name]])
        common = min((mine.dtype, jnp.dtype(copy.dtype)), key=lambda d: jnp.dtype(d).itemsize)
        mine, theirs = np.asarray(mine.astype(common)), np.asarray(jnp.asarray(copy, common))
        if not np.array_equal(mine, theirs):
            diff = np.abs(mine.astype(np.float32) - theirs.astype(np.float32)).max()
            bad.append(f"tensor {name}: differs from the target's (max |difference| {diff:.3g})")
    if bad:
        raise CheckpointError(path, other=bad + [
            "this DSpark drafter was trained for another target (or the target is quantized)"])


def _check_d2t(cfg: DrafterConfig, params, source: str) -> None:
    """A stored draft-to-target map must be ``draft_vocab_size`` distinct, increasing ids of
    the target's vocabulary (``model.drafter.check_draft_vocab``)."""
    if cfg.draft_vocab_size is None:
        return
    d2t = np.asarray(params["d2t"][...])
    try:
        ok = check_draft_vocab(d2t, cfg.vocab_size, cfg.draft_vocab_size, f"{source}: d2t")
    except ConfigError as e:
        raise CheckpointError(source, other=[str(e)]) from None
    if not np.array_equal(ok, d2t):
        raise CheckpointError(source, other=[f"{source}: d2t must list its target ids in "
                                             "increasing order"])


def save_drafter(path: str, cfg: DrafterConfig, params, dtype: str = "bfloat16") -> None:
    """Write ``config.json`` and ``model.safetensors`` in the layout ``load_drafter`` reads."""
    if dtype not in _SAVE_DTYPES:
        raise ValueError(f"unsupported save dtype {dtype!r}; supported: {sorted(_SAVE_DTYPES)}")
    os.makedirs(path, exist_ok=True)
    hf = cfg.to_hf_dict()
    hf["torch_dtype"] = dtype
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
    flat = {n: (np.asarray(a, np.int32) if np.issubdtype(np.asarray(a).dtype, np.integer)
                else np.asarray(a).astype(np.float32).astype(_SAVE_DTYPES[dtype]))
            for n, a in state_to_flat(params).items()}
    write_safetensors(os.path.join(path, "model.safetensors"), flat, {"format": "pt"})
