"""Minimal safetensors reader/writer over NumPy (bf16 via ml_dtypes), memory-mapped."""

from __future__ import annotations

import json
import os
import struct

import ml_dtypes
import numpy as np

from convert.errors import CheckpointError

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64,
           "I64": np.int64, "I32": np.int32}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """All tensors of one ``.safetensors`` file (zero-copy views of a memory map)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out, bad = {}, []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            bad.append(f"tensor {name}: unsupported dtype {info['dtype']}")
            continue
        lo, hi = info["data_offsets"]
        out[name] = data[lo:hi].view(_DTYPES[info["dtype"]]).reshape(info["shape"])
    if bad:
        raise CheckpointError(path, other=bad)
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
