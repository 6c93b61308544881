"""A state file: a nested Python value written as JSON plus ``.npy`` arrays in one zip archive,
read back without running anything the file says.

Layout (a valid ``.npz``): ``state.json`` = ``{"format": FORMAT, "version": VERSION, "meta":
{...}, "state": node}`` and one ``<name>.npy`` member per array (arrays of Python objects are
refused both ways). A node is a JSON scalar (None, bool, int, float, str) or a tagged object:

- ``{"t": "dict", "v": {str: node}}``, ``{"t": "map", "v": [[node, node], ...]}`` (other keys),
  ``{"t": "list" | "tuple", "v": [node, ...]}``;
- ``{"t": "array", "v": name, "scalar": bool}``: a NumPy / JAX array (or NumPy scalar);
- ``{"t": "record", "type": name, "v": {field: node}}``: one of the package's own frozen
  dataclasses or NamedTuples listed in ``record_types()`` (configs, cost tables, ``AutoState``),
  rebuilt by calling that class with the fields (its own checks run);
- ``{"t": "pytree", "v": [node, ...]}``: any other JAX pytree (optax optimizer states) as its
  leaves; reading it needs a template (``like``): the live object of the same place, whose
  structure the leaves are put back into after their count, shapes and dtypes are checked.

Anything else (a function, an object of another class) is refused when writing, naming where
it sits. A file that is not one of these (a .pkl file, another zip, a newer version) is refused by
its content, naming the file and what is wrong.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile
from typing import Any

import jax
import numpy as np

FORMAT = "dominotree-state"
VERSION = 1
HEADER = "state.json"


class StateFileError(ValueError):
    """A state file cannot be read (or a value cannot be written): names the file and why."""


def record_types() -> dict[str, type]:
    """The classes a ``record`` node may rebuild: the package's own static values."""
    from dominotree_jax.config import (DrafterConfig, LinearAttentionShape, MoeShape,
                                       TargetConfig)
    from dominotree_jax.decoding.auto_size import AutoState
    from dominotree_jax.decoding.config import DecodeConfig
    from dominotree_jax.decoding.costs import CostTable
    from dominotree_jax.precision import Precision
    return {c.__name__: c for c in (DecodeConfig, TargetConfig, DrafterConfig, MoeShape,
                                    LinearAttentionShape, CostTable, Precision, AutoState)}


# --------------------------------------------------------------------------- writing

class _Encoder:
    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}
        self.records = record_types()

    def array(self, value, scalar: bool) -> dict:
        a = np.asarray(value)
        if a.dtype.hasobject:
            raise TypeError("an array of Python objects")
        name = f"a{len(self.arrays)}"
        self.arrays[name] = a
        return {"t": "array", "v": name, "scalar": scalar}

    def node(self, value, where: str):
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, np.generic):
            return self.array(value, True)
        if isinstance(value, (np.ndarray, jax.Array)):
            return self.array(value, False)
        if type(value).__name__ in self.records and type(value) is self.records[
                type(value).__name__]:
            return self.record(value, where)
        if isinstance(value, dict):
            if all(isinstance(k, str) for k in value):
                return {"t": "dict", "v": {k: self.node(v, f"{where}.{k}")
                                           for k, v in value.items()}}
            return {"t": "map", "v": [[self.node(k, f"{where}[key]"),
                                       self.node(v, f"{where}[{k!r}]")]
                                      for k, v in value.items()]}
        if type(value) in (list, tuple):
            return {"t": type(value).__name__,
                    "v": [self.node(v, f"{where}[{i}]") for i, v in enumerate(value)]}
        leaves, _ = jax.tree.flatten(value)
        if leaves != [value]:   # a registered pytree node (an optax state, a NamedTuple)
            return {"t": "pytree", "v": [self.node(v, f"{where}<leaf {i}>")
                                         for i, v in enumerate(leaves)]}
        raise TypeError(f"{where}: cannot write a {type(value).__name__} (only JSON values, "
                        f"arrays, containers, pytrees and {sorted(self.records)})")

    def record(self, value, where: str) -> dict:
        if dataclasses.is_dataclass(value):
            names = [f.name for f in dataclasses.fields(value) if f.init]
        else:   # a NamedTuple
            names = list(value._fields)
        return {"t": "record", "type": type(value).__name__,
                "v": {n: self.node(getattr(value, n), f"{where}.{n}") for n in names}}


def write_state_file(path: str, state, meta: dict | None = None) -> str:
    """Write ``state`` (and the JSON object ``meta``) to ``path`` atomically: a ``.tmp`` file,
    then a rename, so a crash leaves the old file or the new one. Returns ``path``."""
    enc = _Encoder()
    try:
        header = {"format": FORMAT, "version": VERSION, "meta": dict(meta or {}),
                  "state": enc.node(state, "state")}
        text = json.dumps(header)
    except (TypeError, ValueError) as e:
        raise StateFileError(f"cannot write {path}: {e}") from None
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        z.writestr(HEADER, text)
        for name, a in enc.arrays.items():
            with z.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, a)   # (never an object array)
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------- reading

class _Decoder:
    def __init__(self, path: str, archive: zipfile.ZipFile):
        self.path, self.archive = path, archive
        self.records = record_types()

    def fail(self, where: str, why: str):
        raise StateFileError(f"{self.path}: {where}: {why}")

    def array(self, node: dict, where: str):
        member = f"{node.get('v')}.npy"
        if member not in self.archive.namelist():
            self.fail(where, f"its array member {member} is missing")
        try:
            with self.archive.open(member) as f:
                a = np.lib.format.read_array(f)   # (refuses object arrays)
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
            self.fail(where, f"damaged array member {member}: {e}")
        return a[()] if node.get("scalar") else a

    def node(self, node, where: str, like: Any = None):
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if not isinstance(node, dict) or "t" not in node:
            self.fail(where, f"not a state node: {str(node)[:80]}")
        kind, v = node["t"], node.get("v")
        if kind == "array":
            return self.array(node, where)
        if kind == "dict" and isinstance(v, dict):
            return {k: self.node(x, f"{where}.{k}", _get(like, k)) for k, x in v.items()}
        if kind == "map" and isinstance(v, list) and all(
                isinstance(kv, list) and len(kv) == 2 for kv in v):
            out = {}
            for k, x in v:
                key = self.node(k, f"{where}[key]")
                out[key] = self.node(x, f"{where}[{key!r}]", _get(like, key))
            return out
        if kind in ("list", "tuple") and isinstance(v, list):
            items = [self.node(x, f"{where}[{i}]", _get(like, i)) for i, x in enumerate(v)]
            return items if kind == "list" else tuple(items)
        if kind == "record" and isinstance(v, dict):
            return self.record(node.get("type"), v, where)
        if kind == "pytree" and isinstance(v, list):
            return self.pytree(v, where, like)
        self.fail(where, f"unknown or malformed node of kind {kind!r}")

    def record(self, name, fields: dict, where: str):
        cls = self.records.get(name) if isinstance(name, str) else None
        if cls is None:
            self.fail(where, f"unknown record type {name!r} (known: {sorted(self.records)})")
        values = {k: self.node(x, f"{where}.{k}") for k, x in fields.items()}
        try:
            return cls(**values)
        except (TypeError, ValueError) as e:
            self.fail(where, f"cannot rebuild {name}: {e}")

    def pytree(self, leaves: list, where: str, like):
        if like is None:
            self.fail(where, "a pytree (e.g. an optimizer state) needs the live object of "
                             "this place as its template; none was given")
        template, treedef = jax.tree.flatten(like)
        if len(template) != len(leaves):
            self.fail(where, f"{len(leaves)} saved leaves, but the live structure has "
                             f"{len(template)}")
        out = []
        for i, (node, want) in enumerate(zip(leaves, template)):
            got = self.node(node, f"{where}<leaf {i}>")
            if isinstance(want, (np.ndarray, np.generic, jax.Array)):
                shape, dtype = np.shape(got), getattr(got, "dtype", None)
                if shape != tuple(want.shape) or dtype != np.dtype(want.dtype):
                    self.fail(where, f"leaf {i} is saved as {dtype}{list(shape)}, the live "
                                     f"structure holds {np.dtype(want.dtype)}"
                                     f"{list(want.shape)}")
            out.append(got)
        return jax.tree.unflatten(treedef, out)


def _get(like, key):
    """The template's entry at ``key`` (None where it has none)."""
    try:
        return like[key]
    except (KeyError, IndexError, TypeError):
        return None


def read_state_file(path: str, like: Any = None) -> tuple[dict, Any]:
    """``(meta, state)`` of a file ``write_state_file`` wrote. ``like``: the live value of the
    same structure, the template of every ``pytree`` node (module docstring). Anything that is
    not such a file is refused with a ``StateFileError`` naming it and why."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        with open(path, "rb") as f:
            start = f.read(2)
        serialized = " (it looks like Python's own serialization, which runs code when opened " \
            "and is not read)" if start[:1] == b"\x80" else ""
        raise StateFileError(f"{path} is not a state file: not a zip archive{serialized}") \
            from None
    with archive:
        if HEADER not in archive.namelist():
            raise StateFileError(f"{path} is not a state file: it has no {HEADER}")
        try:
            header = json.loads(archive.read(HEADER))
        except (ValueError, UnicodeDecodeError) as e:
            raise StateFileError(f"{path}: malformed {HEADER}: {e}") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            found = header.get("format") if isinstance(header, dict) else type(header).__name__
            raise StateFileError(f"{path} is not a state file: format {found!r}, not "
                                 f"{FORMAT!r}")
        if header.get("version") != VERSION:
            raise StateFileError(f"{path}: state file version {header.get('version')!r}; this "
                                 f"package reads version {VERSION}")
        meta = header.get("meta")
        if not isinstance(meta, dict) or "state" not in header:
            raise StateFileError(f"{path}: {HEADER} lacks its meta object or state")
        return meta, _Decoder(path, archive).node(header["state"], "state", like)
