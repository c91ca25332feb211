"""QuantizedWeight: the tensors one projection keeps instead of its float weight [N, K].

    int8: q int8 [N, K]                     w = d * q
    int4: q uint8 [N, K/2] (GGUF block order: byte j of each block of 32 holds weight j in its
          low nibble and weight j + 16 in its high nibble)   w = d * q + m, q in 0..15
    d (and m for int4): float16 [N, K/G], one per group of G consecutive weights of a row

float16 scales are what GGUF stores, so its tensors are taken bit for bit; a group is a whole
number of 32-weight blocks (the kernels' unit)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

BLOCK = 32


class QuantizationError(ValueError):
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
    def shape(self) -> tuple[int, int]:
        """[N, K] of the float weight this stands for."""
        n, width = self.q.shape
        return n, width * (8 // self.bits)

    @property
    def group_size(self) -> int:
        return self.shape[1] // self.d.shape[1]

    def check(self) -> "QuantizedWeight":
        n, k = self.shape
        groups = self.d.shape[1]
        if self.q.dtype not in (torch.int8, torch.uint8):
            raise QuantizationError(f"quantized weights are int8 or uint8 (packed int4), got {self.q.dtype}")
        if k % BLOCK or groups == 0 or k % groups or (k // groups) % BLOCK:
            raise QuantizationError(f"a [{n}, {k}] weight with {groups} groups per row: rows must be whole groups "
                                    f"of a multiple of {BLOCK} weights")
        if self.d.shape != (n, groups) or self.d.dtype != torch.float16:
            raise QuantizationError(f"scales must be float16 [{n}, {groups}], got {self.d.dtype} {tuple(self.d.shape)}")
        if (self.bits == 4) != (self.m is not None) or (self.m is not None and (self.m.shape != self.d.shape or self.m.dtype != torch.float16)):
            raise QuantizationError("int4 weights need float16 minimums shaped like their scales; int8 weights have none")
        return self

    def rows(self, index: Tensor) -> "QuantizedWeight":
        """The rows `index` (a permutation or selection of output features), still quantized."""
        return QuantizedWeight(self.q[index], self.d[index], None if self.m is None else self.m[index])


def cat_rows(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """Projections fused along the output features (q, k, v; gate, up): they must share bits and group size."""
    if len({(p.bits, p.group_size, p.shape[1]) for p in parts}) != 1:
        raise QuantizationError("projections fused into one matmul must share bits, group size and input width, got "
                                + ", ".join(f"int{p.bits}/g{p.group_size}/K{p.shape[1]}" for p in parts))
    m = None if parts[0].m is None else torch.cat([p.m for p in parts])
    return QuantizedWeight(torch.cat([p.q for p in parts]), torch.cat([p.d for p in parts]), m).check()
