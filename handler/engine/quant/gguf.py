"""A GGUF file's tensors by the engine's names, exactly as stored: Q8_0, Q4_0 and Q4_1 blocks of 32
become int8 / int4 QuantizedWeights with the file's own float16 scales (no requantization), the
k-quants (Q4_K, Q5_K, Q6_K) and 5-bit blocks (Q5_0, Q5_1) KQuantWeights (kquant.py); F32, F16 and
BF16 tensors are read as they are.

    Q8_0  34 bytes: d (f16), 32 x int8                 w = d * q
    Q4_0  18 bytes: d (f16), 16 bytes of nibbles       w = d * (q - 8)  (int4 without m)
    Q4_1  20 bytes: d (f16), m (f16), 16 bytes         w = d * q + m

Any other type (Q2_K, Q3_K, IQ*, TQ*, ...) is refused with the tensor's name, never approximated.
A fused projection (q, k, v; gate, up) whose parts the file stores in different formats (Q4_K_M
keeps some v in Q6_K) stays a list of parts, each computed as stored.
llama.cpp's converter permutes the rows of the query and key projections of `llama`-architecture
files (Llama, Mistral: its rotary layout pairs adjacent dimensions, transformers' pairs the two
halves of a head); the rows are put back, which moves whole rows and changes no value."""
from __future__ import annotations

from pathlib import Path
from typing import cast, overload

import torch
from torch import Tensor

from handler.engine.model.args import ModelArgs
from handler.engine.quant import kquant
from handler.engine.quant.gguf_file import BLOCKS, FLOAT_TYPES, TensorInfo, read_directory, read_float, read_rows
from handler.engine.quant.kquant import KQuantWeight
from handler.engine.quant.layout import QuantizationError, QuantizedWeight, cat_rows
from handler.engine.quant.ops import Stored, dequantize

TYPES = tuple(BLOCKS)  # taken as stored by the quantized kernels
SERVED_TYPES = TYPES + tuple(FLOAT_TYPES)
PERMUTED_ARCHITECTURES = ("llama",)  # query/key rows in llama.cpp's rotary order

# a float tensor where the file stores the projection in floats; a list: parts in different formats
Projection = Stored | list[Stored] | Tensor


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
            return self.tensor("output.weight" if "output.weight" in self._tensors else "token_embd.weight")
        _, layer, name = module.split(".", 2)
        blk = f"blk.{layer}."
        if name == "attention.wqkv":
            q = self._rows(self.tensor(blk + "attn_q.weight"), args.n_heads, args.head_dim)
            k = self._rows(self.tensor(blk + "attn_k.weight"), args.n_kv_heads, args.head_dim)
            return _cat([q, k, self.tensor(blk + "attn_v.weight")])
        if name == "feed_forward.w13":
            return _cat([self.tensor(blk + "ffn_gate.weight"), self.tensor(blk + "ffn_up.weight")])
        return self.tensor(blk + {"attention.wo": "attn_output.weight", "feed_forward.w2": "ffn_down.weight"}[name])

    def has(self, name: str) -> bool:
        return name in self._tensors

    def floats(self, name: str) -> Tensor:
        """A tensor in float32 (dequantized if it is stored quantized): norms, biases, embeddings."""
        t = self.tensor(name)
        return t.float() if isinstance(t, Tensor) else dequantize(t)

    def bias(self, module: str, args: ModelArgs) -> Tensor:
        """The fused query/key/value bias of layers.<i>.attention.wqkv (Qwen2), float32."""
        blk = f"blk.{module.split('.')[1]}."
        q = self._rows(self.floats(blk + "attn_q.bias"), args.n_heads, args.head_dim)
        k = self._rows(self.floats(blk + "attn_k.bias"), args.n_kv_heads, args.head_dim)
        return torch.cat([q, k, self.floats(blk + "attn_v.bias")])

    @overload
    def _rows(self, t: Tensor, heads: int, head_dim: int) -> Tensor: ...
    @overload
    def _rows(self, t: Stored | Tensor, heads: int, head_dim: int) -> Stored | Tensor: ...

    def _rows(self, t: Stored | Tensor, heads: int, head_dim: int) -> Stored | Tensor:
        if self.architecture not in PERMUTED_ARCHITECTURES:
            return t
        order = _unpermute(heads, head_dim)
        return t[order] if isinstance(t, Tensor) else t.rows(order)

    def tensor(self, name: str) -> Stored | Tensor:
        """One tensor as stored: a QuantizedWeight or KQuantWeight (unpacked), or a float tensor."""
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
        raw = read_rows(self.path, t)  # [N, K / block weights * block bytes]
        if t.kind in kquant.FORMATS:
            return kquant.from_blocks(t.kind, raw)
        n = raw.shape[0]
        blocks = raw.view(n, -1, BLOCKS[t.kind][0])
        d = blocks[..., 0:2].contiguous().view(torch.float16).view(n, -1)
        if t.kind == "Q8_0":
            return QuantizedWeight(blocks[..., 2:].contiguous().view(torch.int8).view(n, -1), d).check()
        if t.kind == "Q4_0":
            return QuantizedWeight(blocks[..., 2:].reshape(n, -1).contiguous(), d).check()
        m = blocks[..., 2:4].contiguous().view(torch.float16).view(n, -1)
        return QuantizedWeight(blocks[..., 4:].reshape(n, -1).contiguous(), d, m).check()


def to_float(p: Projection) -> Tensor:
    """A projection in float32: dequantized, its parts stacked."""
    if isinstance(p, Tensor):
        return p.float()
    return torch.cat([dequantize(part) for part in p]) if isinstance(p, list) else dequantize(p)


def _cat(parts: list[Stored | Tensor]) -> Projection:
    """Rows stacked: as one weight where the parts share a format, else the list of runs of one
    format; float32 where any part is stored in floats (a float part stays exact)."""
    stored = [p for p in parts if not isinstance(p, Tensor)]
    if len(stored) < len(parts):
        return torch.cat([p.float() if isinstance(p, Tensor) else dequantize(p) for p in parts])
    runs: list[list[Stored]] = []
    for p in stored:
        if runs and _same_format(runs[-1][0], p):
            runs[-1].append(p)
        else:
            runs.append([p])
    # A run's parts share one format (_same_format): its first part's type is every part's.
    fused = [cat_rows(cast("list[QuantizedWeight]", r)) if isinstance(r[0], QuantizedWeight)
             else kquant.cat_rows(cast("list[KQuantWeight]", r)) for r in runs]
    return fused[0] if len(fused) == 1 else fused


def _same_format(a: Stored, b: Stored) -> bool:
    if isinstance(a, KQuantWeight) and isinstance(b, KQuantWeight):
        return kquant.same_format(a, b)
    return isinstance(a, QuantizedWeight) and isinstance(b, QuantizedWeight) and a.shape[1] == b.shape[1] and (
        a.bits, a.group_size) == (b.bits, b.group_size)


def _unpermute(heads: int, head_dim: int) -> Tensor:
    """Row index that turns llama.cpp's query/key row order back into transformers': row
    (head h, half s, pair j) is GGUF row h * head_dim + 2 j + s."""
    h = torch.arange(heads)[:, None, None] * head_dim
    s = torch.arange(2)[None, :, None]
    j = torch.arange(head_dim // 2)[None, None, :]
    return (h + 2 * j + s).flatten()
