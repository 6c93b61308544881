"""Save and restore converted parameters with orbax (a directory with the config beside it).

Layout: ``<dir>/model_config.json`` (kind + config fields) and ``<dir>/params`` (orbax
StandardCheckpointer, the pure-dict parameter tree).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from convert.errors import CheckpointError
from convert.files import read_json
from convert.params import check_layer_count
from dominotree_jax.config import (ConfigError, DrafterConfig, LinearAttentionShape, MoeShape,
                                   TargetConfig)
from dominotree_jax.model.drafter import drafter_graphdef
from dominotree_jax.model.target import target_graphdef

CONFIG_FILE = "model_config.json"
_KINDS = {"target": TargetConfig, "drafter": DrafterConfig}
_TUPLE_FIELDS = ("target_layer_ids", "layer_types")


def _to_jsonable(cfg) -> dict:
    return {k: (list(map(list, v)) if k == "rope_scaling" and v else v)
            for k, v in dataclasses.asdict(cfg).items()}


def save_params(out_dir: str, kind: str, cfg, params, tokenizer_source: str | None = None):
    """Write ``params`` (an nnx.State) and ``cfg`` to ``out_dir`` (must not exist yet)."""
    out_dir = os.path.abspath(out_dir)
    if os.path.exists(out_dir):
        raise FileExistsError(f"{out_dir} already exists")
    os.makedirs(out_dir)
    with open(os.path.join(out_dir, CONFIG_FILE), "w") as f:
        json.dump({"kind": kind, "config": _to_jsonable(cfg),
                   "tokenizer_source": tokenizer_source}, f, indent=1)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(os.path.join(out_dir, "params"), nnx.to_pure_dict(params))


def is_orbax_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, CONFIG_FILE))


def read_saved_kind(path: str) -> str:
    """``"target"`` or ``"drafter"``: what an orbax directory holds."""
    kind = read_json(os.path.join(path, CONFIG_FILE)).get("kind")
    if kind not in _KINDS:
        raise CheckpointError(path, other=[f"unknown saved kind {kind!r}"])
    return kind


def saved_config(path: str, kind: str):
    """``(config, tokenizer_source)`` of an orbax directory holding a ``kind`` model."""
    cfg_file = os.path.join(path, CONFIG_FILE)
    saved = read_json(cfg_file)
    if saved.get("kind") != kind:
        raise CheckpointError(path, other=[f"holds a {saved.get('kind')!r}, not a {kind}"])
    fields = saved.get("config") or {}
    if not isinstance(fields, dict):
        raise CheckpointError(cfg_file, other=[f"'config' is a {type(fields).__name__}, "
                                               "not an object of fields"])
    fields = dict(fields)
    try:
        if fields.get("rope_scaling"):
            fields["rope_scaling"] = tuple(tuple(kv) for kv in fields["rope_scaling"])
        for name in _TUPLE_FIELDS:
            if fields.get(name) is not None:
                fields[name] = tuple(fields[name])
        # the nested shapes of hybrid and mixture-of-experts targets
        if isinstance(fields.get("linear_attention"), dict):
            fields["linear_attention"] = LinearAttentionShape(**fields["linear_attention"])
        if isinstance(fields.get("moe"), dict):
            moe = dict(fields["moe"])
            fields["moe"] = MoeShape(**{**moe, "layers": tuple(moe.get("layers") or ())})
        cfg = _KINDS[kind](**fields)
    except (TypeError, ConfigError) as e:
        raise CheckpointError(cfg_file, other=[f"unusable {kind} config: {e}"]) from None
    return cfg, saved.get("tokenizer_source")


def restore_saved_params(path: str, cfg, mesh=None, rules=None):
    """The parameters of an orbax directory, restored into the model structure of ``cfg`` and
    placed as ``restore_params`` says."""
    graphdef = drafter_graphdef if isinstance(cfg, DrafterConfig) else target_graphdef
    saved = _saved_metadata(path)
    if isinstance(saved, dict) and isinstance(saved.get("layers"), dict):
        # refused before the model is built (a huge count would take forever to build)
        check_layer_count(cfg.num_hidden_layers, {f"layers.{i}.": None for i in saved["layers"]},
                          os.path.join(path, CONFIG_FILE))
    _, abstract = graphdef(cfg, _saved_dtype(path))
    return restore_params(path, abstract, mesh, rules)


def _saved_metadata(path: str):
    params_dir = os.path.join(os.path.abspath(path), "params")
    if not os.path.isdir(params_dir):
        raise CheckpointError(path, other=[f"no params directory ({params_dir})"])
    try:
        with ocp.StandardCheckpointer() as ckptr:
            meta = ckptr.metadata(params_dir)
    except Exception as e:  # orbax raises many types for damaged metadata
        raise CheckpointError(params_dir, other=[f"damaged orbax metadata: "
                                                 f"{type(e).__name__}: {e}"]) from None
    tree = getattr(meta, "item_metadata", meta)
    tree = getattr(tree, "tree", tree)
    if not jax.tree.leaves(tree):  # orbax only warns when _METADATA cannot be read
        raise CheckpointError(params_dir, other=["damaged orbax metadata: no arrays listed"])
    return tree


def _saved_dtype(path: str) -> str:
    # jnp.issubdtype: numpy does not count ml_dtypes' bfloat16 as floating (a bf16 directory
    # once restored as float32)
    floats = [np.dtype(x.dtype) for x in jax.tree.leaves(_saved_metadata(path))
              if jnp.issubdtype(np.dtype(x.dtype), jnp.floating)]
    return floats[0].name if floats else "float32"   # not an id map (a drafter's ``d2t``)


# what tensorstore says when array files are missing, cut or corrupt (not when orbax cannot
# lay the arrays out on this run's devices)
_DATA_ERRORS = ("DATA_LOSS", "OUT_OF_RANGE", "NOT_FOUND", "corrupt", "truncated",
                "rror reading")


def restore_params(path: str, abstract_state, mesh=None, rules=None):
    """Restore into the structure of ``abstract_state``; shape mismatches are refused.

    Each array is restored onto ``mesh`` by the logical axes its parameter declares and
    ``rules`` (``sharding.ShardingRules``, default the decoding rules); without a mesh,
    replicated over every device of every process when the run has several
    (``jax.distributed``: each process holds a full copy), else on the default device. Never
    the layout it was saved with: that names the saving run's devices."""
    path = os.path.abspath(path)
    pure = nnx.to_pure_dict(abstract_state)
    shardings = _restore_shardings(abstract_state, pure, mesh, rules)
    target = jax.tree_util.tree_map_with_path(
        lambda p, x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=shardings[_name(p)]), pure)
    _check_structure(path, target, _saved_metadata(path))
    failure = None
    try:
        with ocp.StandardCheckpointer() as ckptr:
            restored = ckptr.restore(os.path.join(path, "params"), target)
    except Exception as e:  # truncated or missing array files, or a layout orbax refused
        said = " <- ".join(f"{type(x).__name__}: {str(x)[:300]}" for x in _chain(e))
        failure = (f"damaged orbax array data: {said}" if any(m in said for m in _DATA_ERRORS)
                   else f"orbax could not restore the arrays onto {_placement(mesh)}: {said}")
    if failure is not None:
        _finalize_abandoned_reads()
        raise CheckpointError(os.path.join(path, "params"), other=[failure])
    state = jax.tree.map(lambda x: x, abstract_state)
    nnx.replace_by_pure_dict(state, restored)
    return state


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and the exceptions it was raised from (tensorstore's reason is the cause)."""
    out = [e]
    while (nxt := out[-1].__cause__ or out[-1].__context__) is not None and nxt not in out:
        out.append(nxt)
    return out


def _name(path) -> str:
    return ".".join(str(getattr(k, "key", k)) for k in path)


def _placement(mesh) -> str:
    if mesh is not None:
        return f"the mesh {dict(mesh.shape)}"
    if jax.process_count() > 1:
        return f"all {jax.device_count()} devices of {jax.process_count()} processes"
    return f"device {jax.local_devices()[0]}"


def _restore_shardings(abstract_state, pure, mesh, rules) -> dict:
    """``{dotted name: Sharding}`` of every array of ``pure`` (``restore_params``)."""
    from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

    from dominotree_jax.sharding import MODEL, ShardingRules, flat_param_specs
    names = [_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(pure)[0]]
    if mesh is not None:
        specs = flat_param_specs(abstract_state, mesh.shape.get(MODEL, 1),
                                 ShardingRules() if rules is None else rules)
        return {n: NamedSharding(mesh, specs[n]) for n in names}
    if jax.process_count() > 1:
        every = jax.sharding.Mesh(np.array(jax.devices()), ("devices",))
        one = NamedSharding(every, PartitionSpec())
    else:
        one = SingleDeviceSharding(jax.local_devices()[0])
    return dict.fromkeys(names, one)


def _finalize_abandoned_reads(wait_s: float = 5.0, quiet_s: float = 0.3):
    """Let a failed orbax restore wind down here, quietly, before we report the failure.

    After one array fails, orbax abandons a coroutine per remaining array and its event loop
    closes while tensorstore may still finish reads (their callbacks then find the loop
    closed). Left alone, each of these would report an "exception ignored" later, at whatever
    code runs then (on CPython 3.11 even inside ``compile``, where the re-entry raises
    ``SystemError``). So: collect the abandoned coroutines and swallow such reports until none
    is left and none has arrived for ``quiet_s`` (at most ``wait_s``). Reports of other threads
    in that window are swallowed too; this only runs on the way to raising CheckpointError.
    """
    hook = sys.unraisablehook
    last = [time.monotonic()]
    sys.unraisablehook = lambda _: last.__setitem__(0, time.monotonic())
    try:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            gc.collect()
            if not _live_orbax_coroutines() and time.monotonic() - last[0] > quiet_s:
                return
            time.sleep(0.02)
    finally:
        sys.unraisablehook = hook


def _live_orbax_coroutines() -> int:
    return sum(1 for o in gc.get_objects() if type(o).__name__ == "coroutine"
               and "orbax" in getattr(getattr(o, "cr_code", None), "co_filename", ""))


def _check_structure(path, expected, found):
    def flat(t):
        out = {}
        for p, leaf in jax.tree_util.tree_flatten_with_path(t)[0]:
            out[".".join(str(getattr(k, "key", k)) for k in p)] = tuple(
                getattr(leaf, "shape", np.shape(leaf)))
        return out
    e, f = flat(expected), flat(found)
    err = CheckpointError(path, [n for n in e if n not in f], [n for n in f if n not in e],
                          [(n, e[n], f[n]) for n in e if n in f and e[n] != f[n]])
    if err.problems:
        raise err
