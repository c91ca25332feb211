"""Round-to-nearest quantization of float weights (no calibration data).

int8: symmetric, one scale per output channel (group = the whole row): d = max|w| / 127.
int4: asymmetric, one scale and minimum per group of G weights: d = (max - min) / 15, m = min,
q = round((w - m) / d) in 0..15, packed two to a byte in GGUF's block order (layout.py).
Scales and minimums are rounded to float16 first and q is computed from the rounded values, so
the stored triple is the best one its own storage allows."""
from __future__ import annotations

import torch
from torch import Tensor

from handler.engine.quant.layout import BLOCK, QuantizationError, QuantizedWeight, int4_bytes


def quantize_int8(w: Tensor) -> QuantizedWeight:
    """w: float [N, K] -> int8 per output channel."""
    wf = w.float()
    d = (wf.abs().amax(dim=1, keepdim=True) / 127).half()
    q = torch.round(wf / _nonzero(d.float())).clamp(-127, 127).to(torch.int8)
    return QuantizedWeight(q, d).check()


def quantize_int4(w: Tensor, group_size: int) -> QuantizedWeight:
    """w: float [N, K] -> int4 with a scale and a minimum per group of `group_size` weights."""
    n, k = w.shape
    if group_size % BLOCK or k % group_size:
        raise QuantizationError(f"int4 group_size must be a multiple of {BLOCK} that divides the input width {k}, "
                                f"got {group_size}")
    groups = w.float().view(n, k // group_size, group_size)
    lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    d, m = ((hi - lo) / 15).half(), lo.half()
    q = torch.round((groups - m.float()) / _nonzero(d.float())).clamp(0, 15).to(torch.uint8).view(n, k)
    return QuantizedWeight(int4_bytes(q), d.view(n, -1), m.view(n, -1)).check()


def _nonzero(d: Tensor) -> Tensor:
    """Scales with zeros (an all-zero row or group) replaced by 1: its q are then 0 and exact."""
    return torch.where(d == 0, torch.ones_like(d), d)
