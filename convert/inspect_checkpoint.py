"""``python -m convert inspect``: which layout a checkpoint is, what was inferred, and what it
costs — all without allocating a parameter.

Shapes come from ``jax.eval_shape`` over the model constructors and the decode caches, so the
released 4B/8B configurations can be checked from their ``config.json`` alone. When tensor
files are present their names and shapes (read from the headers, memory-mapped) are checked
against the model too.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from convert.drafter import OLD_HEAD_PREFIX, drafter_config, frozen_copies, rename_head
from convert.files import checkpoint_names, read_checkpoint_tensors, read_config
from convert.gguf import gguf_target_config, read_gguf
from convert.hf import hf_target_config
from convert.orbax_io import is_orbax_dir, read_saved_kind, saved_config
from convert.params import check_shapes
from dominotree_jax.config import (PROJECTOR_ALIASES, DrafterConfig, TargetConfig, check_pair,
                                   default_tap_layers)
from dominotree_jax.model.cache import KVCache
from dominotree_jax.model.drafter import DrafterContext, drafter_graphdef
from dominotree_jax.model.state import flat_names
from dominotree_jax.model.target import target_graphdef

GiB = 1024 ** 3


def is_drafter_config(hf: dict) -> bool:
    """A drafter ``config.json``: a ``dflash_config``, a ``block_size`` or a draft architecture."""
    archs = hf.get("architectures") or []
    return ("dflash_config" in hf or "block_size" in hf
            or any(str(a).endswith("DraftModel") for a in archs))


def _where(hf: dict, name: str) -> str:
    dflash = hf.get("dflash_config") or {}
    if dflash.get(name) is not None:
        return "dflash_config"
    return "top level" if hf.get(name) is not None else "absent"


def drafter_layout(hf: dict, cfg: DrafterConfig) -> list[str]:
    """What a drafter ``config.json`` was recognised as and where each setting came from."""
    archs = hf.get("architectures") or ["(none)"]
    raw_projector = (hf.get("dflash_config") or {}).get("projector_type",
                                                        hf.get("projector_type"))
    kind = "Domino" if cfg.is_domino else "DSpark" if cfg.is_dspark else "DFlash"
    alias = (f" (projector_type {raw_projector!r}, an alias of 'domino')"
             if raw_projector in PROJECTOR_ALIASES else "")
    block_at = _where(hf, "block_size")
    lines = [f"layout: {kind} drafter, architecture {archs[0]}{alias}; block_size in "
             f"{block_at} ({'newer' if block_at == 'dflash_config' else 'older'} layout)"
             if not cfg.is_dspark else
             f"layout: DSpark drafter, architecture {archs[0]} (DeepSpec's: fields at the top "
             "level; slot 0, the anchor's, predicts the first draft depth)"]
    taps_at = _where(hf, "target_layer_ids")
    if taps_at == "absent":
        rule = default_tap_layers(cfg.num_target_layers, cfg.num_hidden_layers)
        lines.append(f"taps: {list(cfg.target_layer_ids)} inferred from num_target_layers="
                     f"{cfg.num_target_layers} (target_layer_ids absent; rule gives "
                     f"{list(rule)})")
    else:
        lines.append(f"taps: {list(cfg.target_layer_ids)} (target_layer_ids in {taps_at})")
    lines.append(f"block size: {cfg.block_size}; draft depths per block: "
                 f"{cfg.num_draft_positions} (shift_label={cfg.shift_label})")
    lines.append(f"mask id: {cfg.mask_token_id} (mask_token_id in "
                 f"{_where(hf, 'mask_token_id')})")
    if cfg.is_domino:
        lines.append(f"Domino head: gru_hidden_dim={cfg.gru_hidden_dim}, emb_dim={cfg.emb_dim} "
                     f"(emb_dim in {_where(hf, 'emb_dim')}), pure_draft_prefix_len="
                     f"{cfg.pure_draft_prefix_len}")
    if cfg.is_dspark:
        lines.append(f"DSpark heads: Markov (markov_head_type 'vanilla', rank "
                     f"{cfg.markov_rank}); confidence head "
                     + (("with Markov features" if cfg.confidence_with_markov else "on z only")
                        if cfg.confidence_head else "absent"))
    lines.append(_rope_line(hf, cfg))
    lines.append(window_line(hf, cfg))
    return lines


def _rope_line(hf: dict, cfg) -> str:
    src = "rope_parameters" if hf.get("rope_parameters") else (
        "rope_theta/rope_scaling" if "rope_theta" in hf else "default")
    scaling = dict(cfg.rope_scaling) if cfg.rope_scaling else "none"
    return f"rope: theta={cfg.rope_theta:g}, scaling {scaling} (from {src})"


def window_line(hf: dict, cfg: DrafterConfig) -> str:
    types = hf.get("layer_types") or []
    if cfg.sliding_window is None:
        if "sliding_attention" in types:
            return ("window: none — layer_types mark sliding_attention but use_sliding_window "
                    "is not true, so (as in transformers) every layer sees the full context")
        return "window: none (every layer sees the full context)"
    layers = [i for i in range(cfg.num_hidden_layers) if cfg.layer_window(i)]
    return (f"window: the last {cfg.sliding_window} context rows on drafter layers {layers} "
            "(use_sliding_window, sliding_window, layer_types)")


def _tensor_lines(path: str, abstract, rename, drafter: DrafterConfig | None = None) -> list[str]:
    """Check the tensor files' names and shapes (headers only) against ``abstract`` (a DSpark
    ``drafter``'s copies of the target's tables apart: ``convert.drafter.frozen_copies``)."""
    if not any(os.path.isfile(os.path.join(path, f)) for f in
               ("model.safetensors", "model.safetensors.index.json")):
        return ["tensors: no tensor files (config only): shapes checked abstractly"]
    tensors = read_checkpoint_tensors(path)
    named = checkpoint_names(path, tensors, rename)
    copies = frozen_copies(drafter, named, path) if drafter is not None else {}
    check_shapes(flat_names(abstract), {n: a.shape for n, a in named.items()}, path)
    prefixes = sorted({p for p in ("model.", OLD_HEAD_PREFIX)
                       if any(n.startswith(p) or n.startswith("model." + p) for n in tensors)})
    note = f", name prefixes {prefixes} stripped" if prefixes else ""
    dtypes = sorted({a.dtype.name for a in tensors.values()})
    lines = [f"tensors: {len(named)} match the model by name and shape (stored {dtypes}{note})"]
    if copies:
        lines.append(f"tensors: {sorted(copies)}: copies of the target's tables (the drafter "
                     "reads the target's own; load_pair checks they are equal)")
    return lines


def _bytes(tree) -> int:
    return sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _param_lines(what: str, abstract) -> list[str]:
    n = sum(x.size for x in jax.tree.leaves(abstract))
    lines = [f"{what} parameters: {n / 1e6:.1f}M, {_bytes(abstract) / GiB:.2f} GiB"]
    lines += [f"  {name} {list(shape)}" for name, shape in flat_names(abstract).items()
              if ".layers." not in f".{name}" or name.startswith("layers.0.")]
    return lines


def decode_memory(target: TargetConfig | None, drafter: DrafterConfig | None, tokens: int,
                  batch: int, dtype: str, draft_window: int | None = None) -> dict[str, int]:
    """Bytes of the parameters and the caches a ``decode`` over ``tokens`` cache rows keeps,
    from ``jax.eval_shape`` (nothing allocated). ``draft_window``: a drafter context ring of
    that many rows (plus a block) instead of the full sequence."""
    dt = jnp.dtype(dtype)
    out = {}
    if target is not None:
        out["target parameters"] = _bytes(target_graphdef(target, dt.name)[1])
        cache = jax.eval_shape(lambda: KVCache.for_target(target, batch, tokens, dt))
        out["target KV cache"] = _bytes((cache.k, cache.v))
        if cache.recurrent:   # a hybrid's Gated DeltaNet states (float32, any length)
            out["target recurrent state"] = _bytes(cache.recurrent)
    if drafter is not None:
        rows = tokens if draft_window is None else min(tokens, draft_window + drafter.block_size)
        out["drafter parameters"] = _bytes(drafter_graphdef(drafter, dt.name)[1])
        out["drafter context"] = _bytes(jax.eval_shape(
            lambda: DrafterContext.zeros(drafter, batch, rows, dt)))
    return out


def memory_lines(target, drafter, tokens: int, batch: int, dtype: str) -> list[str]:
    mem = decode_memory(target, drafter, tokens, batch, dtype)
    lines = [f"decode of {tokens} tokens, batch {batch}, {dtype} (eval_shape, nothing "
             "allocated):"]
    lines += [f"  {k}: {v / GiB:.3f} GiB" for k, v in mem.items()]
    lines.append(f"  total: {sum(mem.values()) / GiB:.3f} GiB (parameters + caches; "
                 "activations of one round come on top)")
    if drafter is not None and drafter.sliding_window:
        win = decode_memory(None, drafter, tokens, batch, dtype, drafter.sliding_window)
        lines.append(f"  drafter context as a {drafter.sliding_window}-row ring: "
                     f"{win['drafter context'] / GiB:.3f} GiB")
    return lines


def _read_target(path: str) -> tuple[TargetConfig, list[str]]:
    if path.endswith(".gguf"):
        return gguf_target_config(read_gguf(path), path), ["layout: GGUF file (llama)"]
    hf = read_config(path)
    cfg = hf_target_config(path)
    return cfg, [f"layout: HF target, architecture {cfg.architecture}", _rope_line(hf, cfg)]


def inspect(path: str, *, target_path: str | None = None, tokens: int = 4096, batch: int = 1,
            dtype: str = "bfloat16") -> str:
    """The report ``python -m convert inspect`` prints (raises on any problem it finds)."""
    path = os.fspath(path)
    if os.path.isdir(path) and is_orbax_dir(path):
        kind = read_saved_kind(path)
        cfg, _ = saved_config(path, kind)
        lines = [f"layout: orbax directory holding a {kind}", str(cfg)]
        target = cfg if kind == "target" else None
        drafter = cfg if kind == "drafter" else None
    elif path.endswith(".gguf") or not is_drafter_config(read_config(path)):
        target, lines = _read_target(path)
        drafter = None
        lines.insert(1, str(target))
        abstract = target_graphdef(target, dtype)[1]
        if not path.endswith(".gguf"):
            lines += _tensor_lines(path, abstract, None)
        lines += _param_lines("target", abstract)
    else:
        hf = read_config(path)
        drafter = drafter_config(path)
        target = _read_target(target_path)[0] if target_path else None
        lines = drafter_layout(hf, drafter) + [str(drafter)]
        abstract = drafter_graphdef(drafter, dtype)[1]
        lines += _tensor_lines(path, abstract, rename_head, drafter)
        lines += _param_lines("drafter", abstract)
        if target is not None:
            check_pair(target, drafter)
            lines.append(f"fits the target {target_path}")
    lines += memory_lines(target, drafter, tokens, batch, dtype)
    return "\n".join(lines)
