"""Quantized projections read from a GGUF file exactly as stored: Q8_0, Q4_0 and Q4_1 blocks of 32
become int8 / int4 QuantizedWeights with the file's own float16 scales (no requantization).

    Q8_0  34 bytes: d (f16), 32 x int8                 w = d * q
    Q4_0  18 bytes: d (f16), 16 bytes of nibbles       w = d * (q - 8)  (int4 without m)
    Q4_1  20 bytes: d (f16), m (f16), 16 bytes         w = d * q + m

llama.cpp's converter permutes the rows of the query and key projections of Llama-family models
(its rotary layout pairs adjacent dimensions, transformers' pairs the two halves of a head);
the rows are put back, which moves whole quantized rows and changes no value."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from handler.engine.model import ModelArgs
from handler.engine.quant.gguf_file import BLOCK_BYTES, read_rows, read_tensor_infos
from handler.engine.quant.layout import QuantizationError, QuantizedWeight, cat_rows

TYPES = ("Q8_0", "Q4_0", "Q4_1")


class GGUFWeights:
    """The quantized projections of one GGUF file, by the engine's module names."""

    def __init__(self, path: Path):
        self.path = path
        self._tensors = read_tensor_infos(path)

    def projection(self, module: str, args: ModelArgs) -> QuantizedWeight:
        """`module` is the engine's Linear: layers.<i>.attention.wqkv / .wo, layers.<i>.feed_forward.w13 /
        .w2, or output."""
        if module == "output":  # tied models have no output.weight: the head is the embedding
            return self._take("output.weight" if "output.weight" in self._tensors else "token_embd.weight")
        _, layer, name = module.split(".", 2)
        blk = f"blk.{layer}."
        if name == "attention.wqkv":
            q = self._take(blk + "attn_q.weight").rows(_unpermute(args.n_heads, args.head_dim))
            k = self._take(blk + "attn_k.weight").rows(_unpermute(args.n_kv_heads, args.head_dim))
            return cat_rows([q, k, self._take(blk + "attn_v.weight")])
        if name == "feed_forward.w13":
            return cat_rows([self._take(blk + "ffn_gate.weight"), self._take(blk + "ffn_up.weight")])
        return self._take(blk + {"attention.wo": "attn_output.weight", "feed_forward.w2": "ffn_down.weight"}[name])

    def embedding(self) -> QuantizedWeight:
        return self._take("token_embd.weight")

    def _take(self, name: str) -> QuantizedWeight:
        t = self._tensors.get(name)
        if t is None:
            raise QuantizationError(f"{self.path.name} has no tensor {name}")
        kind = t.kind
        if kind not in TYPES:
            raise QuantizationError(f"{self.path.name}: {name} is {kind}; only {', '.join(TYPES)} are taken as "
                                    "stored (set quantization to none, int8 or int4 to use the float checkpoint)")
        if len(t.shape) != 2:
            raise QuantizationError(f"{self.path.name}: {name} is {t.shape}, not a matrix")
        raw = read_rows(self.path, t)  # [N, K/32 * block bytes]
        n = raw.shape[0]
        blocks = raw.view(n, -1, BLOCK_BYTES[kind])
        d = blocks[..., 0:2].contiguous().view(torch.float16).view(n, -1)
        if kind == "Q8_0":
            return QuantizedWeight(blocks[..., 2:].contiguous().view(torch.int8).view(n, -1), d).check()
        if kind == "Q4_0":
            return QuantizedWeight(blocks[..., 2:].reshape(n, -1).contiguous(), d).check()
        m = blocks[..., 2:4].contiguous().view(torch.float16).view(n, -1)
        return QuantizedWeight(blocks[..., 4:].reshape(n, -1).contiguous(), d, m).check()


def _unpermute(heads: int, head_dim: int) -> Tensor:
    """Row index that turns llama.cpp's query/key row order back into transformers': row
    (head h, half s, pair j) is GGUF row h * head_dim + 2 j + s."""
    h = torch.arange(heads)[:, None, None] * head_dim
    s = torch.arange(2)[None, :, None]
    j = torch.arange(head_dim // 2)[None, None, :]
    return (h + 2 * j + s).flatten()

