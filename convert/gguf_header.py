"""A bounds-checked walk over a GGUF file's header, run before ``gguf.GGUFReader``.

The reader slices every tensor eagerly and fails with numpy's reshape message on a cut file;
this walk names what is wrong instead: a header that ends early, or a tensor whose bytes the
header places beyond the end of the file. Layout (GGUF v2/v3, little-endian): magic, version
u32, tensor count u64, metadata count u64, metadata (key string, type u32, value), tensor infos
(name string, n_dims u32, dims u64[n], type u32, offset u64), padding to ``general.alignment``,
tensor data.
"""

from __future__ import annotations

import struct

from convert.errors import CheckpointError

GGUF_MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Cursor:
    def __init__(self, path: str, data: bytes):
        self.path, self.data, self.pos = path, data, 0

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.data):
            raise CheckpointError(self.path, other=[
                f"GGUF header ends early: {what} needs bytes {self.pos}..{self.pos + n} but "
                f"the file holds {len(self.data)} (truncated file?)"])
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        return self.take(self.unpack("<Q", what), what).decode("utf-8", "replace")

    def value(self, vtype: int, what: str):
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            itype, count = self.unpack("<I", what), self.unpack("<Q", what)
            return [self.value(itype, what) for _ in range(count)]
        raise CheckpointError(self.path, other=[f"GGUF metadata {what}: unknown value type "
                                                f"{vtype}"])


def check_gguf_layout(path: str, data: bytes) -> None:
    """Raise ``CheckpointError`` naming the first header problem or every tensor cut off."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    c = _Cursor(path, data)
    magic = c.take(4, "the magic")
    if magic != GGUF_MAGIC:
        raise CheckpointError(path, other=[f"not a GGUF file: it starts with {magic!r}, "
                                           f"not {GGUF_MAGIC!r}"])
    version = c.unpack("<I", "the version")
    if version not in (2, 3):
        raise CheckpointError(path, other=[f"unsupported GGUF version {version}"])
    n_tensors, n_kv = c.unpack("<Q", "the tensor count"), c.unpack("<Q", "the metadata count")
    alignment = 32
    for i in range(n_kv):
        key = c.string(f"metadata key {i}")
        val = c.value(c.unpack("<I", f"metadata {key}"), f"metadata {key}")
        if key == "general.alignment":
            alignment = int(val)
    infos = []
    for i in range(n_tensors):
        name = c.string(f"tensor info {i}")
        dims = [c.unpack("<Q", f"tensor {name}") for _ in range(c.unpack("<I", f"tensor {name}"))]
        ttype, offset = c.unpack("<I", f"tensor {name}"), c.unpack("<Q", f"tensor {name}")
        infos.append((name, dims, ttype, offset))
    start = -(-c.pos // alignment) * alignment
    short = []
    for name, dims, ttype, offset in infos:
        try:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (ValueError, KeyError):
            short.append(f"tensor {name}: unknown GGML type {ttype}")
            continue
        n = 1
        for d in dims:
            n *= d
        end = start + offset + n * size // block
        if end > len(data):
            short.append(f"tensor {name}: the header places it at bytes {start + offset}..{end} "
                         f"but the file holds {len(data)} bytes (truncated file?)")
    if short:
        raise CheckpointError(path, other=short)
