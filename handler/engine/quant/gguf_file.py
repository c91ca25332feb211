"""The tensor directory of a GGUF file (versions 2 and 3), read from its header, and one tensor's bytes.

Why not `gguf.GGUFReader`: it turns every metadata value into numpy views before it lists a
tensor; the default model's file carries its tokenizer (~49k tokens, ~48k merges) and took ~9 s
of every worker start that way. Here metadata arrays are skipped and only single values kept
(`general.architecture`, `general.alignment`, ...): ~0.1 s. The tests check this directory
against GGUFReader's.

Layout (little-endian): "GGUF", version u32, tensor count u64, metadata count u64; metadata
pairs (key string, value type u32, value); per tensor: name string, dims u32, dims x u64
(innermost first), ggml type u32, offset u64 from the data section; the data section starts
at the next multiple of the alignment (32 unless the metadata says).
"""
from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from handler.engine import EngineError

GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
              11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS",
              19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32",
              27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0"}
# bytes of one block, weights in it
BLOCKS = {"Q8_0": (34, 32), "Q4_0": (18, 32), "Q4_1": (20, 32), "Q5_0": (22, 32), "Q5_1": (24, 32),
          "Q4_K": (144, 256), "Q5_K": (176, 256), "Q6_K": (210, 256)}
FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_DEFAULT_ALIGNMENT = 32


class GGUFFormatError(EngineError, ValueError):
    """Not a GGUF file this reader understands; the message says what was found."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    kind: str  # "Q8_0", "Q4_1", ... ("type N" for a type this reader does not name)
    shape: tuple[int, ...]  # outermost first: [rows, columns] for a matrix
    offset: int  # from the start of the file

    def row_bytes(self) -> int:
        """Bytes of one row: of a block-quantized matrix, or of a float tensor's last dimension."""
        if self.kind in FLOAT_TYPES:
            return self.shape[-1] * FLOAT_TYPES[self.kind].itemsize
        size, weights = BLOCKS[self.kind]
        return self.shape[-1] // weights * size


@dataclass(frozen=True)
class Directory:
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str | int | float | bool]  # single values only (str, int, float, bool); arrays are skipped


def read_directory(path: Path) -> Directory:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return _Header(buf, path).directory()


def read_tensor_infos(path: Path) -> dict[str, TensorInfo]:
    return read_directory(path).tensors


def read_rows(path: Path, info: TensorInfo) -> torch.Tensor:
    """A tensor's bytes, uint8 [rows, row_bytes] (rows: every dimension but the last), copied
    out of the file."""
    rows = math.prod(info.shape[:-1])
    with open(path, "rb") as f:
        f.seek(info.offset)
        data = bytearray(f.read(rows * info.row_bytes()))
    if len(data) != rows * info.row_bytes():
        raise GGUFFormatError(f"{path.name}: {info.name} runs past the end of the file")
    return torch.frombuffer(data, dtype=torch.uint8).view(rows, info.row_bytes())


def read_float(path: Path, info: TensorInfo) -> torch.Tensor:
    """An F32 / F16 / BF16 tensor in its own dtype and shape."""
    return read_rows(path, info).view(FLOAT_TYPES[info.kind]).view(info.shape)


class _Header:
    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.pos = buf, path, 0

    def directory(self) -> Directory:
        if self.buf[:4] != b"GGUF":
            raise GGUFFormatError(f"{self.path.name} is not a GGUF file (starts with {bytes(self.buf[:4])!r})")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", self.buf, 4)
        if version not in (2, 3):
            raise GGUFFormatError(f"{self.path.name} is GGUF version {version}; versions 2 and 3 are read")
        self.pos = 24
        metadata: dict[str, str | int | float | bool] = {}
        for _ in range(n_kv):
            key = self._string()
            (vtype,) = self._unpack("<I")
            if vtype in _SCALARS:
                (metadata[key],) = self._unpack(_SCALARS[vtype])
            elif vtype == _STRING:
                metadata[key] = self._string()
            else:
                self._skip_value(vtype)
        alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
        raw = []
        for _ in range(n_tensors):
            name = self._string()
            (dims,) = self._unpack("<I")
            shape = self._unpack(f"<{dims}Q")
            kind, offset = self._unpack("<IQ")
            raw.append((name, GGML_TYPES.get(kind, f"type {kind}"), tuple(reversed(shape)), offset))
        data_start = -(-self.pos // alignment) * alignment
        tensors = {name: TensorInfo(name, kind, shape, data_start + offset) for name, kind, shape, offset in raw}
        return Directory(tensors, metadata)

    def _unpack(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def _string(self) -> str:
        (n,) = self._unpack("<Q")
        text = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def _skip_value(self, vtype: int) -> None:
        if vtype == _STRING:
            (n,) = self._unpack("<Q")
            self.pos += n
        elif vtype == _ARRAY:
            item_type, count = self._unpack("<IQ")
            if item_type in _SCALARS:
                self.pos += count * struct.calcsize(_SCALARS[item_type])
            else:
                for _ in range(count):
                    self._skip_value(item_type)
        elif vtype in _SCALARS:
            self.pos += struct.calcsize(_SCALARS[vtype])
        else:
            raise GGUFFormatError(f"{self.path.name}: unknown metadata value type {vtype} at byte {self.pos}")
