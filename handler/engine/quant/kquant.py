"""KQuantWeight: a projection in GGUF's super-block formats (k-quants) or 5-bit blocks, as the file
stores it (kernels/kquant.c computes with it):

    Q4_K  144 bytes / 256 weights: d, dmin (f16), 12 bytes of 6-bit sc and mn (one each per 32),
          128 bytes of nibbles                               w = d * sc * q - dmin * mn, q 0..15
    Q5_K  176 bytes / 256: as Q4_K plus 32 bytes of bit 4                         q 0..31
    Q6_K  210 bytes / 256: 128 bytes of low nibbles, 64 of bits 4-5, 16 int8 sc (one per 16), d
                                                             w = d * sc * (q - 32), q 0..63
    Q5_0  22 bytes / 32: d, 4 bytes of bit 4, 16 of nibbles  w = d * (q - 16) = d * q - (16 d)
    Q5_1  24 bytes / 32: d, m, 4 bytes, 16 bytes             w = d * q + m = d * q - (-m)

so every one is d * sc * q - dmin * mn per super-block of S weights (256, or 32 for Q5_x, which
have no sc or mn) except Q6_K's centred form. Unpacked, rows can be selected (llama's q/k order):
    q uint8 [N, K] (0..63); sc uint8 [N, K/32] or int8 [N, K/16] (Q6_K); mn uint8 [N, K/32];
    d, dmin float16 [N, K/S]
pack() puts them in kquant.c's layout (its header); unpack() reverses it."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor

from handler.engine.quant.gguf_file import BLOCKS
from handler.engine.quant.layout import (
    BLOCK,
    ROWS,
    QuantizationError,
    check_row_groups,
    pack_groups,
    pack_nibbles,
    unpack_groups,
    unpack_nibbles,
)

FORMATS = {kind: BLOCKS[kind] for kind in ("Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1")}


@dataclass(frozen=True)
class KQuantWeight:
    bits: int  # 4, 5 or 6 (6: the centred form)
    q: Tensor
    d: Tensor
    dmin: Tensor | None = None
    sc: Tensor | None = None
    mn: Tensor | None = None
    h: Tensor | None = None  # packed only: bits 4 and up of q

    @property
    def packed(self) -> bool:
        return self.q.dim() == 3

    @property
    def shape(self) -> tuple[int, int]:
        return (self.q.shape[0] * ROWS, self.q.shape[1] * BLOCK) if self.packed else (self.q.shape[0], self.q.shape[1])

    @property
    def super_block(self) -> int:
        return self.shape[1] // self.d.shape[1]

    def tensors(self) -> dict[str, Tensor | None]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "bits"}

    def rows(self, index: Tensor) -> KQuantWeight:
        assert not self.packed, "select rows before packing"
        picked: dict[str, Any] = {k: None if t is None else t[index] for k, t in self.tensors().items()}
        return replace(self, **picked)

    def pack(self) -> KQuantWeight:
        if self.packed:
            return self
        n, k = check_row_groups(self.shape)
        g, b = n // ROWS, k // BLOCK
        high = None
        if self.bits == 5:  # bit j of byte 4r + i: bit 4 of column 4j + i
            top = ((self.q >> 4) & 1).view(g, ROWS, b, 8, 4).permute(0, 2, 1, 4, 3).to(torch.int32)
            high = (top << torch.arange(8, dtype=torch.int32)).sum(-1).to(torch.uint8).reshape(g, b, 32)
        elif self.bits == 6:  # byte 32 (j / 4) + 4r + i, bits 2 (j % 4): bits 4-5 of column 4j + i
            top = ((self.q >> 4) & 3).view(g, ROWS, b, 2, 4, 4).permute(0, 2, 3, 1, 5, 4).to(torch.int32)
            high = (top << (2 * torch.arange(4, dtype=torch.int32))).sum(-1).to(torch.uint8).reshape(g, b, 64)
        sc = None if self.sc is None else _pack_scales(self.sc, g, b)
        mn = None if self.mn is None else _pack_scales(self.mn, g, b)
        return KQuantWeight(self.bits, pack_nibbles(self.q).contiguous(), pack_groups(self.d),
                            _maybe(pack_groups, self.dmin), sc, mn, high)

    def unpack(self) -> KQuantWeight:
        if not self.packed:
            return self
        n, k = self.shape
        g, b = n // ROWS, k // BLOCK
        q = unpack_nibbles(self.q)
        if self.bits == 5:
            assert self.h is not None, "packed 5-bit weights carry bit 4 in h"
            bits = (self.h.view(g, b, ROWS, 4, 1) >> torch.arange(8, dtype=torch.uint8)) & 1  # [g, b, r, i, j]
            q = q | (bits.permute(0, 2, 1, 4, 3).reshape(n, k) << 4)
        elif self.bits == 6:
            assert self.h is not None, "packed 6-bit weights carry bits 4-5 in h"
            pairs = (self.h.view(g, b, 2, ROWS, 4, 1) >> (2 * torch.arange(4, dtype=torch.uint8))) & 3  # [g,b,hh,r,i,t]
            q = q | (pairs.permute(0, 3, 1, 2, 5, 4).reshape(n, k) << 4)
        return KQuantWeight(self.bits, q.contiguous(), unpack_groups(self.d), _maybe(unpack_groups, self.dmin),
                            _maybe(_unpack_scales, self.sc), _maybe(_unpack_scales, self.mn))

    def check(self) -> KQuantWeight:
        n, k = self.shape
        s = self.super_block
        if k % s or s % BLOCK or self.d.dtype != torch.float16:
            raise QuantizationError(f"a [{n}, {k}] weight needs float16 scales per super-block of a multiple of {BLOCK}")
        if (self.bits == 6) != (self.dmin is None):
            raise QuantizationError("6-bit weights are centred (no dmin); 4- and 5-bit ones have a dmin")
        return self


def dequantize(w: KQuantWeight) -> Tensor:
    """The float32 weight [N, K], computed as the gguf package's dequantization does (d * sc first,
    then times q, minus dmin * mn): the same float32 values."""
    w = w.unpack()
    n, k = w.shape
    sub = 16 if w.bits == 6 else BLOCK
    d = w.d.float().repeat_interleave(w.super_block // sub, dim=1)  # [N, K/sub]
    scale = d if w.sc is None else d * w.sc.float()
    q = w.q.view(n, k // sub, sub).float()
    if w.bits == 6:
        return (scale[..., None] * (q - 32)).view(n, k)
    assert w.dmin is not None, "4- and 5-bit weights have a dmin (check())"
    dmin = w.dmin.float().repeat_interleave(w.super_block // sub, dim=1)
    offset = dmin if w.mn is None else dmin * w.mn.float()
    return (scale[..., None] * q - offset[..., None]).view(n, k)


def from_blocks(kind: str, raw: Tensor) -> KQuantWeight:
    """A GGUF tensor's bytes, uint8 [N, K / S * block bytes], as an unpacked KQuantWeight."""
    size, _ = FORMATS[kind]
    n = raw.shape[0]
    blk = raw.view(n, -1, size)

    def f16(lo: int) -> Tensor:
        return blk[..., lo:lo + 2].contiguous().view(torch.float16).view(n, -1)

    if kind == "Q6_K":
        low = (blk[..., :128].reshape(n, -1, 2, 1, 64) >> torch.tensor([0, 4], dtype=torch.uint8)[:, None]) & 15
        top = (blk[..., 128:192].reshape(n, -1, 2, 1, 32) >> (2 * torch.arange(4, dtype=torch.uint8))[:, None]) & 3
        q = low.reshape(n, -1, 2, 128) | (top.reshape(n, -1, 2, 128) << 4)
        sc = blk[..., 192:208].contiguous().view(torch.int8).reshape(n, -1)
        return KQuantWeight(6, q.reshape(n, -1), f16(208), sc=sc).check()
    if kind in ("Q5_0", "Q5_1"):
        at = 2 if kind == "Q5_0" else 4
        bits = blk[..., at:at + 4].contiguous().view(torch.int32)  # [N, blocks, 1], bit i: weight i
        top = (bits >> torch.arange(32, dtype=torch.int32)) & 1
        nib = blk[..., at + 4:at + 20]
        q = torch.cat([nib & 15, nib >> 4], -1) | (top.to(torch.uint8) << 4)
        d = f16(0)
        dmin = _exact_times(d, 16) if kind == "Q5_0" else -f16(2)
        return KQuantWeight(5, q.reshape(n, -1), d, dmin).check()
    sc, mn = _scales_and_mins(blk[..., 4:16])
    nib = blk[..., -128:].reshape(n, -1, 4, 1, 32) >> torch.tensor([0, 4], dtype=torch.uint8)[:, None]
    q = (nib & 15).reshape(n, -1, 256)  # chunk c: its low nibbles are weights 64c..64c+31, its high ones the next 32
    if kind == "Q5_K":
        top = (blk[..., 16:48].reshape(n, -1, 1, 32) >> torch.arange(8, dtype=torch.uint8)[:, None]) & 1
        q = q | (top.reshape(n, -1, 256) << 4)
    return KQuantWeight(4 if kind == "Q4_K" else 5, q.reshape(n, -1), f16(0), f16(2), sc, mn).check()


def _scales_and_mins(packed: Tensor) -> tuple[Tensor, Tensor]:
    """12 bytes per super-block -> 8 six-bit scales and 8 six-bit mins ([N, blocks, 12] -> 2 x [N, blocks * 8]):
    bytes 0-3 hold scales 0-3 (and bits 4-5 of scales 4-7 on top), 4-7 mins 0-3 (and of mins 4-7),
    8-11 the low 4 bits of scales 4-7 (low nibble) and mins 4-7 (high nibble)."""
    n = packed.shape[0]
    d, m, md = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = torch.cat([d & 63, (md & 15) | ((d >> 2) & 48)], -1)
    mn = torch.cat([m & 63, (md >> 4) | ((m >> 2) & 48)], -1)
    return sc.reshape(n, -1), mn.reshape(n, -1)


def _exact_times(d: Tensor, factor: int) -> Tensor:
    out = d * factor
    if not torch.isfinite(out).all():
        raise QuantizationError(f"a Q5_0 scale times {factor} overflows float16")
    return out


def cat_rows(parts: list[KQuantWeight]) -> KQuantWeight:
    """Fused projections of one format (same bits, super-block and scale kinds)."""
    first = parts[0]
    if any(not same_format(p, first) for p in parts):
        raise QuantizationError("k-quant projections fused into one matmul must share their format")
    stacked: dict[str, Any] = {k: None if t is None else torch.cat([getattr(p, k) for p in parts])
                               for k, t in first.tensors().items()}
    return replace(first, **stacked).check()


def same_format(a: KQuantWeight, b: KQuantWeight) -> bool:
    return (a.bits, a.super_block, a.shape[1], a.sc is None) == (b.bits, b.super_block, b.shape[1], b.sc is None)


def _maybe(fn, t: Tensor | None) -> Tensor | None:
    return None if t is None else fn(t)


def _pack_scales(s: Tensor, g: int, b: int) -> Tensor:
    """[N, K/32] -> [N/8, K/32, 8]; Q6_K's [N, K/16] -> [N/8, K/32, 2, 8]."""
    per = s.shape[1] // b
    return s.view(g, ROWS, b, per).permute(0, 2, 3, 1).reshape(g, b, *([per] if per > 1 else []), ROWS).contiguous()


def _unpack_scales(s: Tensor) -> Tensor:
    g, b = s.shape[:2]
    return s.view(g, b, -1, ROWS).permute(0, 3, 1, 2).reshape(g * ROWS, -1).contiguous()
