"""The model a step is compiled for and called with, from a checkpoint and a resolved config."""
from __future__ import annotations

import torch

from handler.engine.checkpoint import Checkpoint, load_model
from handler.engine.config import DTYPES, EngineConfig
from handler.engine.kernels import build, matvec
from handler.engine.kv.pages import pages_for
from handler.engine.model.transformer import Transformer
from handler.engine.quant.apply import quantize_model


def prepare_model(ckpt: Checkpoint, cfg: EngineConfig) -> Transformer:
    """The model as the steps are compiled for it and called with: weights in the resolved
    dtype, projections quantized if chosen, packed copies if chosen (the graphs call packed_linear then),
    bf16 single rows (and decode batches over a float32 copy) through our matrix-vector kernel
    where compiling (Inductor's C++ toolchain is there then), KV cache allocated."""
    as_stored = ckpt.gguf_only and cfg.quantization == "gguf"  # projections read once, from the file
    model = load_model(ckpt, cfg.torch_dtype, "cpu" if as_stored else cfg.device, projections=not as_stored)
    quantize_model(model, ckpt, cfg)
    if as_stored:
        model.to(cfg.device)
    if cfg.packed_weights != "off":
        model.pack_weights(DTYPES[cfg.packed_weights])
    if cfg.compile == "inductor" and cfg.torch_dtype == torch.bfloat16 and torch.device(cfg.device).type == "cpu":
        build.load()  # built now (seconds, the first time on a machine), not in the first request
        # decode batches too where oneDNN would read a float32 copy (twice bf16's bytes; AVX2)
        model.use_matvec(batches=cfg.max_batch_size <= matvec.MAX_BATCH)
    model.setup_cache(pages_for(cfg.kv_budget), cfg.max_seq_len)
    if build.loaded():
        build.check_in_force()  # the kernels the steps will run are still ours (KernelMismatchError)
    return model
