"""QuantizedWeight: the tensors one projection keeps instead of its float weight [N, K].

    int8: q int8 [N, K]                     w = d * q
    int4: q uint8 [N, K/2] (GGUF block order: byte j of each block of 32 holds weight j in its
          low nibble and weight j + 16 in its high nibble)   w = d * q + m, q in 0..15
          or, without m (GGUF's Q4_0), w = d * (q - 8): 4.5 bits a weight read instead of 5
    d (and m for int4 with minimums): float16 [N, K/G], one per group of G consecutive weights of a row

float16 scales are what GGUF stores, so its tensors are taken bit for bit; a group is a whole
number of 32-weight blocks (the kernels' unit).

pack() reorders the same bytes into the CPU kernels' layout (handler/engine/kernels/quantized.c: rows in groups of 8, the
8 rows of each 32-column block interleaved every 4 columns; q [N/8, K/32, 256 or 128], d and m
[N/8, K/G, 8]); unpack() reverses it. A packed weight is what a model keeps on CPU."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
from torch import Tensor

from handler.engine import EngineError
from handler.engine.kernels import build

BLOCK = 32
ROWS = 8  # rows per group of the packed layout


class QuantizationError(EngineError, ValueError):
    """Weights that cannot be quantized or taken as they are; the message says which and why."""


@dataclass(frozen=True)
class QuantizedWeight:
    q: Tensor
    d: Tensor
    m: Tensor | None = None

    @property
    def bits(self) -> int:
        return 8 if self.q.dtype == torch.int8 else 4

    @property
    def packed(self) -> bool:
        return self.q.dim() == 3

    @property
    def shape(self) -> tuple[int, int]:
        """[N, K] of the float weight this stands for."""
        if self.packed:
            return self.q.shape[0] * ROWS, self.q.shape[1] * BLOCK
        n, width = self.q.shape
        return n, width * (8 // self.bits)

    @property
    def group_size(self) -> int:
        return self.shape[1] // self.d.shape[1]

    def check(self) -> QuantizedWeight:
        n, k = self.shape
        groups = self.d.shape[1]
        if self.q.dtype not in (torch.int8, torch.uint8):
            raise QuantizationError(f"quantized weights are int8 or uint8 (packed int4), got {self.q.dtype}")
        if k % BLOCK or groups == 0 or k % groups or (k // groups) % BLOCK:
            raise QuantizationError(f"a [{n}, {k}] weight with {groups} groups per row: rows must be whole groups "
                                    f"of a multiple of {BLOCK} weights")
        if self.d.shape != (n, groups) or self.d.dtype != torch.float16:
            raise QuantizationError(f"scales must be float16 [{n}, {groups}], got {self.d.dtype} {tuple(self.d.shape)}")
        if self.m is not None and (self.bits == 8 or self.m.shape != self.d.shape or self.m.dtype != torch.float16):
            raise QuantizationError("int4 minimums are float16 shaped like their scales; int8 weights have none")
        return self

    @property
    def centred(self) -> bool:
        """int4 without minimums: w = d * (q - 8)."""
        return self.bits == 4 and self.m is None

    def with_minimums(self) -> QuantizedWeight:
        """The same values with explicit minimums (m = -8 d is exact in float16), for fusing with
        weights that have them."""
        return QuantizedWeight(self.q, self.d, -8 * self.d) if self.centred else self

    def rows(self, index: Tensor) -> QuantizedWeight:
        """The rows `index` (a permutation or selection of output features), still quantized."""
        assert not self.packed, "select rows before packing"
        return QuantizedWeight(self.q[index], self.d[index], None if self.m is None else self.m[index])

    def pack(self) -> QuantizedWeight:
        """The same values in the CPU kernels' layout (module docstring)."""
        if self.packed:
            return self
        n, k = check_row_groups(self.shape)
        if self.bits == 8:  # byte 32 c + 4 r + i of block b: column 4 c + i of row r
            q = self.q.view(n // ROWS, ROWS, k // BLOCK, 8, 4).permute(0, 2, 3, 1, 4).reshape(n // ROWS, k // BLOCK, -1)
        else:
            q = pack_int4_bytes(self.q, n, k)
        return QuantizedWeight(q.contiguous(), pack_groups(self.d), None if self.m is None else pack_groups(self.m))

    def unpack(self) -> QuantizedWeight:
        """The row-major layout back from pack()'s."""
        if not self.packed:
            return self
        n, k = self.shape
        if self.bits == 8:
            q = self.q.view(n // ROWS, k // BLOCK, 8, ROWS, 4).permute(0, 3, 1, 2, 4).reshape(n, k)
        else:
            q = int4_bytes(unpack_nibbles(self.q))
        return QuantizedWeight(q.contiguous(), unpack_groups(self.d), None if self.m is None else unpack_groups(self.m))


def int4_values(q: Tensor, n: int, k: int) -> Tensor:
    """Row-major int4 bytes [N, K/2] -> values [N, K] in 0..15, in column order."""
    blocks = q.view(n, k // BLOCK, BLOCK // 2)
    return torch.cat([blocks & 0x0F, blocks >> 4], dim=-1).view(n, k)


def int4_bytes(values: Tensor) -> Tensor:
    """Values [N, K] in 0..15 -> row-major int4 bytes [N, K/2]: byte j of a block holds weight j
    (low nibble) and weight j + 16 (high)."""
    n, k = values.shape
    blocks = values.reshape(n, k // BLOCK, BLOCK)
    return (blocks[..., : BLOCK // 2] | (blocks[..., BLOCK // 2:] << 4)).reshape(n, k // 2)


def check_row_groups(shape: tuple[int, int]) -> tuple[int, int]:
    """[N, K] of a weight about to be packed: N must be whole groups of ROWS."""
    n, k = shape
    if n % ROWS:
        raise QuantizationError(f"a quantized weight needs a multiple of {ROWS} output features, this one has {n}")
    return n, k


def pack_nibbles(values: Tensor) -> Tensor:
    """Values [N, K] (their low 4 bits) -> the kernels' int4 bytes [N/8, K/32, 128]: byte 32 c + 4 r + i
    of block b holds column 8 c + i of row r in its low nibble and column 8 c + 4 + i in its high one."""
    n, k = values.shape
    v = values.view(n // ROWS, ROWS, k // BLOCK, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)  # [g, b, c, r, i, nibble]
    return ((v[..., 0] & 0x0F) | ((v[..., 1] & 0x0F) << 4)).reshape(n // ROWS, k // BLOCK, 128)


def pack_int4_bytes(q: Tensor, n: int, k: int) -> Tensor:
    """Row-major int4 bytes [N, K/2] -> pack_nibbles' bytes [N/8, K/32, 128], by the CPU kernels'
    loop (quantized.c: ts_llm_pack_int4): going through values with torch's permutes took most of
    an 8B model's load (docs/benchmarks.md, "Engine choices")."""
    src = q.contiguous()
    out = torch.empty(n // ROWS, k // BLOCK, 128, dtype=torch.uint8)
    build.load().ts_llm_pack_int4(ctypes.c_void_p(src.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                                  ctypes.c_int64(n), ctypes.c_int64(k))
    return out


def unpack_nibbles(q: Tensor) -> Tensor:
    """pack_nibbles' bytes [N/8, K/32, 128] -> values [N, K] in 0..15."""
    g, b = q.shape[:2]
    v = q.view(g, b, 4, ROWS, 4)
    return torch.stack([v & 0x0F, v >> 4], dim=-1).permute(0, 3, 1, 2, 5, 4).reshape(g * ROWS, b * BLOCK)


def pack_groups(s: Tensor) -> Tensor:  # [N, groups] -> [N/8, groups, 8]
    n, groups = s.shape
    return s.view(n // ROWS, ROWS, groups).transpose(1, 2).contiguous()


def unpack_groups(s: Tensor) -> Tensor:  # [N/8, groups, 8] -> [N, groups]
    return s.transpose(1, 2).reshape(-1, s.shape[1]).contiguous()


def cat_rows(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """Projections fused along the output features (q, k, v; gate, up): they must share bits and group size."""
    if len({(p.bits, p.group_size, p.shape[1]) for p in parts}) != 1:
        raise QuantizationError("projections fused into one matmul must share bits, group size and input width, got "
                                + ", ".join(f"int{p.bits}/g{p.group_size}/K{p.shape[1]}" for p in parts))
    if len({p.centred for p in parts}) > 1:
        parts = [p.with_minimums() for p in parts]
    ms = [p.m for p in parts if p.m is not None]  # every part's or none (centred ones were given theirs)
    m = torch.cat(ms) if len(ms) == len(parts) else None
    return QuantizedWeight(torch.cat([p.q for p in parts]), torch.cat([p.d for p in parts]), m).check()
