"""Save and restore converted parameters with orbax (a directory with the config beside it).

Layout: ``<dir>/model_config.json`` (kind + config fields) and ``<dir>/params`` (orbax
StandardCheckpointer, the pure-dict parameter tree).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from convert.errors import CheckpointError

CONFIG_FILE = "model_config.json"


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


def read_saved_config(path: str) -> dict:
    with open(os.path.join(path, CONFIG_FILE)) as f:
        return json.load(f)


def restore_params(path: str, abstract_state):
    """Restore into the structure of ``abstract_state``; shape mismatches are refused."""
    path = os.path.abspath(path)
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                          nnx.to_pure_dict(abstract_state))
    with ocp.StandardCheckpointer() as ckptr:
        meta = ckptr.metadata(os.path.join(path, "params"))
        tree = getattr(meta, "item_metadata", meta)
        tree = getattr(tree, "tree", tree)
        _check_structure(path, target, tree)
        pure = ckptr.restore(os.path.join(path, "params"), target)
    state = jax.tree.map(lambda x: x, abstract_state)
    nnx.replace_by_pure_dict(state, pure)
    return state


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
