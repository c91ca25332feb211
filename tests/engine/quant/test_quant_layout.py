"""The int4 layout: the kernels' C packing loop gives the bytes torch's reference reordering gives."""
from __future__ import annotations

import torch

from handler.engine.quant.layout import int4_values, pack_int4_bytes, pack_nibbles


def test_the_c_packing_equals_the_reference_reordering():
    n, k = 24, 96
    q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    assert torch.equal(pack_int4_bytes(q, n, k), pack_nibbles(int4_values(q, n, k)))
