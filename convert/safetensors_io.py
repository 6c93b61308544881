"""Minimal safetensors reader/writer over NumPy (bf16 via ml_dtypes), memory-mapped."""

from __future__ import annotations

import json
import os
import struct

import ml_dtypes
import numpy as np

from convert.errors import CheckpointError

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64,
           "I64": np.int64, "I32": np.int32, "U8": np.uint8}   # U8: packed MXFP4
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


_ITEM_BYTES = {k: np.dtype(v).itemsize for k, v in _DTYPES.items()}


def _read_header(path: str) -> tuple[dict, int]:
    """``(header, data start)`` of a safetensors file; a cut or garbled header is named."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(path, other=[f"truncated safetensors file: {size} bytes, "
                                               "shorter than the 8-byte header length"])
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            raise CheckpointError(path, other=[f"truncated safetensors file: the header "
                                               f"claims {n} bytes but the file holds {size}"])
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(path, other=[f"malformed safetensors header: {e}"]) from None
    if not isinstance(header, dict):
        raise CheckpointError(path, other=["malformed safetensors header: not a JSON object"])
    return header, 8 + n


def _tensor_problem(name: str, info, data_size: int) -> str | None:
    """Why the header entry ``info`` of tensor ``name`` cannot be read, or None."""
    try:
        lo, hi = (int(x) for x in info["data_offsets"])
        shape = [int(d) for d in info["shape"]]
        dtype = info["dtype"]
    except (KeyError, TypeError, ValueError):
        return f"tensor {name}: malformed header entry {info!r}"
    if dtype not in _DTYPES:
        return f"tensor {name}: unsupported dtype {dtype}"
    want = int(np.prod(shape, dtype=np.int64)) * _ITEM_BYTES[dtype]
    if hi - lo != want or lo < 0:
        return (f"tensor {name}: header offsets [{lo}, {hi}) hold {hi - lo} bytes, but shape "
                f"{shape} of {dtype} needs {want}")
    if hi > data_size:
        return (f"tensor {name}: its data ends at byte {hi} of the data section but the file "
                f"holds only {data_size} (truncated file)")
    return None


def _checked_entries(path: str, header: dict, data_size: int) -> dict:
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    bad = [p for p in (_tensor_problem(k, v, data_size) for k, v in entries.items()) if p]
    if bad:
        raise CheckpointError(path, other=bad)
    return entries


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """All tensors of one ``.safetensors`` file (zero-copy views of a memory map).

    The header is checked against the file before any array is touched: a truncated file,
    offsets that disagree with a shape, or unsupported dtypes are all named in one error.
    """
    header, start = _read_header(path)
    entries = _checked_entries(path, header, os.path.getsize(path) - start)
    if not entries:
        return {}
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=start)
    out = {}
    for name, info in entries.items():
        lo, hi = info["data_offsets"]
        out[name] = data[lo:hi].view(_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def write_safetensors(path: str, tensors: dict[str, np.ndarray], metadata: dict | None = None):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        if a.dtype not in _NAMES:
            raise ValueError(f"cannot write {name}: dtype {a.dtype} is not supported")
        b = a.tobytes()
        header[name] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
