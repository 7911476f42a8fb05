"""A GGUF header reader that parses in milliseconds, with the tensor views gguf-py gives.

Why not gguf-py's GGUFReader: it builds a numpy view per string of every metadata array, so
a file whose metadata holds a 49k-word vocabulary and its merges takes seconds to open
(several seconds on a 2-core machine, paid on every start). This reader walks the same
header with `struct` over one memory map: scalars and strings become Python values, numeric
arrays one `np.frombuffer` each, and the tensor data stays in the map. The tensors keep
gguf-py's shapes and dtypes (`ReaderTensor`), so `gguf.quants.dequantize` reads them as it
reads GGUFReader's. The layout follows llama.cpp's `gguf.cpp` (format version 2 and 3,
little-endian).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
# GGUF value type -> (struct format, numpy dtype) for the fixed-size types
SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"), 1: ("<b", "<i1"), 2: ("<H", "<u2"), 3: ("<h", "<i2"), 4: ("<I", "<u4"),
    5: ("<i", "<i4"), 6: ("<f", "<f4"), 7: ("<?", "?"), 10: ("<Q", "<u8"), 11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}
# Tensor types stored as plain numbers; every other type is blocks of bytes.
PLAIN = {GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F32: np.float32,
         GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
         GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
         GGMLQuantizationType.I64: np.int64}


@dataclass(frozen=True)
class ReaderTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # as GGUF lists them, fastest dimension first
    data: np.ndarray  # numbers in reversed(shape), or uint8 blocks: rows x bytes per row


class GGUFHeader:
    """`fields` (key -> Python value) and `tensors` of one GGUF file."""

    def __init__(self, path: Path) -> None:
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._pos = 0
        self.fields: dict[str, Any] = {}
        self.tensors: list[ReaderTensor] = []
        self._read(path)

    def _read(self, path: Path) -> None:
        if self._map[:4] != MAGIC:
            raise ValueError(f"{path} is not a GGUF file (no GGUF magic)")
        self._pos = 4
        version = self._scalar(4)
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} is not supported (2 and 3 are; "
                             "a big-endian file reads as a huge version)")
        num_tensors, num_fields = self._scalar(10), self._scalar(10)
        for _ in range(num_fields):
            key = self._string()
            self.fields[key] = self._value(self._scalar(4))
        infos = [self._tensor_info() for _ in range(num_tensors)]
        alignment = int(self.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-self._pos // alignment) * alignment
        buffer = np.frombuffer(self._map, dtype=np.uint8)
        self.tensors = [tensor(buffer, start, *info) for info in infos]

    def _scalar(self, kind: int) -> Any:
        fmt = SCALARS[kind][0]
        (value,) = struct.unpack_from(fmt, self._map, self._pos)
        self._pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        (n,) = struct.unpack_from("<Q", self._map, self._pos)
        start = self._pos + 8
        self._pos = start + n
        return self._map[start:self._pos].decode("utf-8", errors="replace")

    def _value(self, kind: int) -> Any:
        if kind == STRING:
            return self._string()
        if kind != ARRAY:
            return self._scalar(kind)
        item_kind, count = self._scalar(4), self._scalar(10)
        if item_kind == STRING:
            return [self._string() for _ in range(count)]
        if item_kind == ARRAY:
            return [self._value(ARRAY) for _ in range(count)]
        dtype = np.dtype(SCALARS[item_kind][1])
        values = np.frombuffer(self._map, dtype=dtype, count=count, offset=self._pos)
        self._pos += dtype.itemsize * count
        return values.tolist()

    def _tensor_info(self) -> tuple[str, GGMLQuantizationType, tuple[int, ...], int]:
        name = self._string()
        dims = tuple(self._scalar(10) for _ in range(self._scalar(4)))
        return name, GGMLQuantizationType(self._scalar(4)), dims, self._scalar(10)


def tensor(buffer: np.ndarray, start: int, name: str, kind: GGMLQuantizationType,
           dims: tuple[int, ...], offset: int) -> ReaderTensor:
    """A view of one tensor's bytes in the map, shaped as gguf-py's reader shapes it."""
    count = int(np.prod(dims))
    block_size, type_size = GGML_QUANT_SIZES[kind]
    num_bytes = count * type_size // block_size
    raw = buffer[start + offset:start + offset + num_bytes]
    shape = tuple(reversed(dims))
    if kind in PLAIN:
        data = raw.view(PLAIN[kind]).reshape(shape)
    else:
        data = raw.reshape(quant_shape_to_byte_shape(shape, kind))
    return ReaderTensor(name, kind, dims, data)
