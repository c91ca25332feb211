"""Which source a model's projections come from, and swapping them in (after the float load).

    none   the float weights as loaded
    int8   round-to-nearest, per output channel (rtn.py)
    int4   round-to-nearest, asymmetric, per group of group_size weights (rtn.py)
    gguf   the checkpoint's GGUF file as stored (gguf.py): projections and head in their own
           Q8_0 / Q4_x / Q5_x / k-quant blocks (a projection stored in floats stays float), the token
           embedding looked up from its quantized rows (a tied model's: the head's); norms come from
           the float checkpoint, which must be the same model (checked on one projection), or from
           the GGUF when it is the only one
"""
from __future__ import annotations

import logging
from typing import cast

import torch

from handler.engine.checkpoint import Checkpoint
from handler.engine.config import ACTIVATION_ROUNDS, EngineConfig
from handler.engine.kernels import build
from handler.engine.model.linear import QuantizedEmbedding, StoredWeight
from handler.engine.model.transformer import Transformer, projections
from handler.engine.quant.gguf import GGUFWeights, Projection, to_float
from handler.engine.quant.layout import QuantizationError
from handler.engine.quant.rtn import quantize_int4, quantize_int8

log = logging.getLogger(__name__)

MAX_SOURCE_MISMATCH = 0.25  # RMS(GGUF - float) / RMS(float) on one projection; a different model is ~1.4


def quantize_model(model: Transformer, ckpt: Checkpoint, cfg: EngineConfig) -> None:
    if cfg.quantization == "none":
        return
    gguf: GGUFWeights | None = None
    if cfg.quantization == "gguf":
        if ckpt.gguf is None:
            raise QuantizationError(f"quantization: gguf, but checkpoint {ckpt.path} has no *.gguf file")
        gguf = GGUFWeights(ckpt.gguf)
    for name, linear in projections(model):
        if gguf is not None:
            w = gguf.projection(name, model.args)
            if name == "layers.0.attention.wo" and not ckpt.gguf_only:
                _check_same_model(w, linear.weight, gguf)
            if isinstance(w, torch.Tensor):  # stored in floats: served as such
                linear.weight = torch.nn.Parameter(w.to(model.norm.weight.dtype), requires_grad=False)
                continue
        elif cfg.quantization == "int8":
            w = quantize_int8(linear.weight)
        else:
            w = quantize_int4(linear.weight, cfg.group_size)
        parts = w if isinstance(w, list) else [w]  # a fused projection whose parts differ in format
        shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])
        if shape != (linear.out_features, linear.in_features):
            raise QuantizationError(f"{name}: quantized weight is {shape}, the model expects "
                                    f"{(linear.out_features, linear.in_features)}")
        try:
            linear.quantize([p.pack() for p in parts], ACTIVATION_ROUNDS[cfg.activations])  # the CPU kernels' layout
        except QuantizationError as err:
            raise QuantizationError(f"{name}: {err}") from err
    if gguf is not None:
        model.tok_embeddings = _embedding(gguf, model)
    build.load()  # built now (~15 s the first time on a machine), not during the first request
    log.info("projections quantized: %s%s; activations %s", cfg.quantization, f" ({gguf.path.name})" if gguf else "",
             cfg.activations)


def _embedding(gguf: GGUFWeights, model: Transformer) -> torch.nn.Module:
    """The token embedding from the file: quantized as stored (shared with the head when the model
    ties them), or float where the file stores it in floats."""
    dtype = model.norm.weight.dtype
    stored = gguf.tensor("token_embd.weight")
    if isinstance(stored, torch.Tensor):
        return torch.nn.Embedding.from_pretrained(stored.to(dtype), freeze=True)
    head = model.output.stored if model.output.quantized is not None else None
    if not gguf.has("output.weight") and head is not None and len(head) == 1:  # tied: the head is this weight
        return QuantizedEmbedding(cast(StoredWeight, head[0]), dtype)  # ModuleList types its items as Module
    return QuantizedEmbedding(StoredWeight(stored.pack()), dtype)


def _check_same_model(w: Projection, float_weight: torch.Tensor, gguf: GGUFWeights) -> None:
    ref = float_weight.float()
    err = (to_float(w) - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-12)
    if err > MAX_SOURCE_MISMATCH:
        raise QuantizationError(f"{gguf.path.name} does not hold the same model as the float checkpoint beside it "
                                f"(layers.0.attention.wo differs by {err:.2f} RMS, relative); remove one of them")
