"""A GGUF file's tensors by the engine's names, exactly as stored: Q8_0, Q4_0 and Q4_1 blocks of 32
become int8 / int4 QuantizedWeights with the file's own float16 scales (no requantization); F32,
F16 and BF16 tensors are read as they are.

    Q8_0  34 bytes: d (f16), 32 x int8                 w = d * q
    Q4_0  18 bytes: d (f16), 16 bytes of nibbles       w = d * (q - 8)  (int4 without m)
    Q4_1  20 bytes: d (f16), m (f16), 16 bytes         w = d * q + m

Any other type (k-quants, IQ*, ...) is refused with the tensor's name, never approximated.
llama.cpp's converter permutes the rows of the query and key projections of `llama`-architecture
files (Llama, Mistral: its rotary layout pairs adjacent dimensions, transformers' pairs the two
halves of a head); the rows are put back, which moves whole rows and changes no value."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from handler.engine.model import ModelArgs
from handler.engine.quant.gguf_file import BLOCK_BYTES, FLOAT_TYPES, TensorInfo, read_directory, read_float, read_rows
from handler.engine.quant.layout import QuantizationError, QuantizedWeight, cat_rows
from handler.engine.quant.ops import dequantize

TYPES = tuple(BLOCK_BYTES)  # taken as stored by the quantized kernels
SERVED_TYPES = TYPES + tuple(FLOAT_TYPES)
PERMUTED_ARCHITECTURES = ("llama",)  # query/key rows in llama.cpp's rotary order

Projection = QuantizedWeight | Tensor  # a float tensor where the file stores the projection in floats


class GGUFWeights:
    """The tensors of one GGUF file, by the engine's module names."""

    def __init__(self, path: Path):
        self.path = path
        directory = read_directory(path)
        self._tensors = directory.tensors
        self.architecture = str(directory.metadata.get("general.architecture", ""))

    def unserved(self) -> list[TensorInfo]:
        """The tensors whose type the engine cannot take as stored."""
        return [t for t in self._tensors.values() if t.kind not in SERVED_TYPES]

    def projection(self, module: str, args: ModelArgs) -> Projection:
        """`module` is the engine's Linear: layers.<i>.attention.wqkv / .wo, layers.<i>.feed_forward.w13 /
        .w2, or output. Quantized where every part is, else float32."""
        if module == "output":  # tied models have no output.weight: the head is the embedding
            return self._take("output.weight" if "output.weight" in self._tensors else "token_embd.weight")
        _, layer, name = module.split(".", 2)
        blk = f"blk.{layer}."
        if name == "attention.wqkv":
            q = self._rows(self._take(blk + "attn_q.weight"), args.n_heads, args.head_dim)
            k = self._rows(self._take(blk + "attn_k.weight"), args.n_kv_heads, args.head_dim)
            return _cat([q, k, self._take(blk + "attn_v.weight")])
        if name == "feed_forward.w13":
            return _cat([self._take(blk + "ffn_gate.weight"), self._take(blk + "ffn_up.weight")])
        return self._take(blk + {"attention.wo": "attn_output.weight", "feed_forward.w2": "ffn_down.weight"}[name])

    def has(self, name: str) -> bool:
        return name in self._tensors

    def floats(self, name: str) -> Tensor:
        """A tensor in float32 (dequantized if it is stored quantized): norms, biases, embeddings."""
        t = self._take(name)
        return dequantize(t) if isinstance(t, QuantizedWeight) else t.float()

    def bias(self, module: str, args: ModelArgs) -> Tensor:
        """The fused query/key/value bias of layers.<i>.attention.wqkv (Qwen2), float32."""
        blk = f"blk.{module.split('.')[1]}."
        q = self._rows(self.floats(blk + "attn_q.bias"), args.n_heads, args.head_dim)
        k = self._rows(self.floats(blk + "attn_k.bias"), args.n_kv_heads, args.head_dim)
        return torch.cat([q, k, self.floats(blk + "attn_v.bias")])

    def _rows(self, t: Projection, heads: int, head_dim: int) -> Projection:
        if self.architecture not in PERMUTED_ARCHITECTURES:
            return t
        order = _unpermute(heads, head_dim)
        return t.rows(order) if isinstance(t, QuantizedWeight) else t[order]

    def _take(self, name: str) -> QuantizedWeight | Tensor:
        t = self._tensors.get(name)
        if t is None:
            raise QuantizationError(f"{self.path.name} has no tensor {name}")
        if t.kind in FLOAT_TYPES:
            return read_float(self.path, t)
        if t.kind not in TYPES:
            raise QuantizationError(f"{self.path.name}: {name} is {t.kind}; the engine serves {', '.join(SERVED_TYPES)} "
                                    "tensors as stored")
        if len(t.shape) != 2:
            raise QuantizationError(f"{self.path.name}: {name} is {t.shape}, not a matrix")
        raw = read_rows(self.path, t)  # [N, K/32 * block bytes]
        n = raw.shape[0]
        blocks = raw.view(n, -1, BLOCK_BYTES[t.kind])
        d = blocks[..., 0:2].contiguous().view(torch.float16).view(n, -1)
        if t.kind == "Q8_0":
            return QuantizedWeight(blocks[..., 2:].contiguous().view(torch.int8).view(n, -1), d).check()
        if t.kind == "Q4_0":
            return QuantizedWeight(blocks[..., 2:].reshape(n, -1).contiguous(), d).check()
        m = blocks[..., 2:4].contiguous().view(torch.float16).view(n, -1)
        return QuantizedWeight(blocks[..., 4:].reshape(n, -1).contiguous(), d, m).check()


def _cat(parts: list[QuantizedWeight | Tensor]) -> Projection:
    """Rows stacked: quantized when every part is, else float32 (a float part stays exact)."""
    if all(isinstance(p, QuantizedWeight) for p in parts):
        return cat_rows(parts)
    return torch.cat([dequantize(p) if isinstance(p, QuantizedWeight) else p.float() for p in parts])


def _unpermute(heads: int, head_dim: int) -> Tensor:
    """Row index that turns llama.cpp's query/key row order back into transformers': row
    (head h, half s, pair j) is GGUF row h * head_dim + 2 j + s."""
    h = torch.arange(heads)[:, None, None] * head_dim
    s = torch.arange(2)[None, :, None]
    j = torch.arange(head_dim // 2)[None, None, :]
    return (h + 2 * j + s).flatten()
