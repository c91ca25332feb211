"""The projections' layer: one nn.Linear whose calls take the fastest route for their shape and
weights (quantized kernels, our bf16 matrix-vector kernel, Inductor's reduction, oneDNN's packed
copies, aten)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._inductor import inductor_prims  # noqa: F401  (registers prims.inductor_force_stride_order)
from torch.fx.experimental.symbolic_shapes import guard_or_false

from handler.engine.kernels import matvec
from handler.engine.model import packed
from handler.engine.quant import ops as quant_ops
from handler.engine.quant.layout import ROWS
from handler.engine.quant.ops import Stored


class Linear(nn.Linear):
    """nn.Linear whose single rows (decode at batch 1) stream the weight once. After
    use_matvec() (CPU bf16 weights) they call ts_llm::bf16_linear (handler.engine.kernels.matvec),
    compiled or not; after pack(float32) and use_matvec(batches=True) so do rows one per sequence
    (x [B, 1, K] or [B, K]: a decode batch, the output head). Otherwise, when compiled, single
    rows are written as a matrix-vector product Inductor generates itself: a vectorized reduction
    parallel over output features, which streams the weight about twice as fast as aten's mm (its
    GEMM setup is sized for many rows). Eager calls do not use the reduction form: it would
    materialize [N, K] there.

    After pack() every other call goes through oneDNN's packed copy of the weight
    (handler.engine.model.packed: faster from 2 to 128 rows on CPU).

    After quantize() the float weight is gone: `stored` holds the quantized weight (QuantizedWeight or
    KQuantWeight, as StoredWeight buffers), or its parts where a fused projection's parts are stored
    in different formats; every call is ts_llm::quantized_linear or kquant_linear
    (handler.engine.quant.ops), which read the quantized bytes at any row count, and pack() keeps
    no copy."""

    packed_dtype: torch.dtype | None = None  # set by pack(): the dtype of the packed copy
    matvec: bool = False  # set by use_matvec(): single rows call ts_llm::bf16_linear
    matvec_batches: bool = False  # set by use_matvec(batches=True) over a wider copy: so do rows one per sequence
    rounds: int = 1  # set by quantize(): how often the quantized kernels round x (EngineConfig.activations)

    def quantize(self, w: Stored | list[Stored], rounds: int = 1) -> None:
        """From now on compute from `w`: one quantized weight, or parts stacked along the output features;
        x rounded to int8 `rounds` times (2: its rounding error too)."""
        del self.weight
        self.stored = nn.ModuleList(StoredWeight(p) for p in (w if isinstance(w, list) else [w]))
        self.rounds = rounds

    @property
    def quantized(self) -> list[Stored] | None:
        """The quantized weight's parts (one unless formats differ), or None."""
        # The ModuleList quantize() made; _modules types its values as Module.
        stored = cast("Iterable[StoredWeight] | None", self._modules.get("stored"))
        return None if stored is None else [part.weight for part in stored]

    def pack(self, dtype: torch.dtype) -> None:
        if self.quantized is None:
            packed.pack(self.weight, dtype)
            self.packed_dtype = dtype

    def use_matvec(self, batches: bool = False) -> None:
        """Single rows through our kernel; with `batches`, rows one per sequence too where the
        packed copy is wider than the weights (call after pack())."""
        if self.quantized is None and self.weight.dtype == torch.bfloat16 and self.weight.device.type == "cpu":
            self.matvec = True
            self.matvec_batches = batches and self._packed_wider

    @property
    def _packed_wider(self) -> bool:
        """The packed copy reads more bytes than the weights (float32 of bf16 weights: AVX2)."""
        return self.packed_dtype is not None and self.packed_dtype.itemsize > self.weight.element_size()

    def forward(self, x: Tensor) -> Tensor:
        parts = self.quantized
        if parts is not None:
            if len(parts) == 1:
                return quant_ops.quantized_linear(x, parts[0], self.bias, self.rounds)
            y = torch.cat([quant_ops.quantized_linear(x, p, rounds=self.rounds) for p in parts], dim=-1)
            return y if self.bias is None else y + self.bias.to(y.dtype)
        # guard_or_false: an unbacked batch (the batch>=2 graphs) is never one row; no guard added.
        one_row = guard_or_false(x.shape[:-1].numel() == 1)
        if self.matvec and (one_row or (self.matvec_batches and _one_row_per_sequence(x))):
            return matvec.bf16_linear(x, self.weight, self.bias)
        if torch.compiler.is_compiling() and one_row:
            # x: [..., K] with one row; weight: [N, K]. fp32 accumulation, as mm's.
            y = (_materialized(x.reshape(1, -1).float()) * self.weight.float()).sum(-1)
            if self.bias is not None:
                y = y + self.bias.float()
            return y.to(x.dtype).reshape(*x.shape[:-1], -1)
        # A single row streams the weights: a copy in a wider dtype (float32 of bf16 weights, on
        # AVX2) would read twice the bytes, so eager single rows keep the plain weight.
        if self.packed_dtype is not None and not (self._packed_wider and one_row):
            return packed.packed_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


class StoredWeight(nn.Module):
    """One quantized weight's tensors as buffers (so that .to(), the graphs and the state see them)."""

    def __init__(self, w: Stored):
        super().__init__()
        self.kind: Callable[..., Stored] = type(w)  # built again from its fields by name
        self.fixed: dict[str, object] = {}  # fields that are not tensors (KQuantWeight.bits)
        for f in dataclasses.fields(w):
            value = getattr(w, f.name)
            if value is None or isinstance(value, Tensor):
                self.register_buffer(f.name, value)
            else:
                self.fixed[f.name] = value

    @property
    def weight(self) -> Stored:
        return self.kind(**self.fixed, **self._buffers)

    def rows(self, index: Tensor) -> Tensor:
        """Rows `index` ([R]) of the packed weight in float32 [R, K]: their groups of 8 rows are
        gathered and dequantized, nothing else is read (an embedding's lookup)."""
        groups = {name: None if t is None else t.index_select(0, index // ROWS) for name, t in self._buffers.items()}
        picked = quant_ops.dequantize(self.kind(**self.fixed, **groups)).view(index.shape[0], ROWS, -1)
        return picked[torch.arange(index.shape[0], device=index.device), index % ROWS]


class QuantizedEmbedding(nn.Module):
    """nn.Embedding over a quantized weight as stored (a tied model's: its head's): a lookup
    dequantizes only the rows it reads, so the embedding holds no float copy."""

    def __init__(self, stored: StoredWeight, dtype: torch.dtype):
        super().__init__()
        self.stored = stored
        self.dtype = dtype

    def forward(self, tokens: Tensor) -> Tensor:
        return self.stored.rows(tokens.reshape(-1)).to(self.dtype).view(*tokens.shape, -1)


def _one_row_per_sequence(x: Tensor) -> bool:
    """x [B, 1, K] or [B, K]: the model's calls with one row per sequence (decode, the output
    head), so at most max_batch_size rows; a prefill chunk's [B, T, K] is not (T static or not)."""
    return all(guard_or_false(d == 1) for d in x.shape[1:-1])


def _materialized(x: Tensor) -> Tensor:
    """x, computed into a buffer of its own in a compiled graph. Inductor otherwise inlines the
    producer of a matrix-vector product's input (RMSNorm, the residual adds, the embedding
    gather) into the reduction's inner loop, recomputing it once per output feature: a batch-1
    decode step took much longer (docs/benchmarks.md, "Engine choices")."""
    return torch.ops.prims.inductor_force_stride_order(x, x.stride())
