"""GGUF tensors taken as stored: the engine's dequantized weights equal GGUF's own dequantization
bit for bit, the query/key rows come back in transformers' order, and a checkpoint with a GGUF
serves it under quantization: auto."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from handler.engine.quant.gguf import GGUFWeights, _unpermute
from handler.engine.quant.layout import QuantizationError
from handler.engine.quant.ops import dequantize

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType


def _write(path: Path, tensors: dict[str, tuple[np.ndarray, object]]) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    for name, (data, kind) in tensors.items():
        if kind == T.F32:
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1"])
def test_dequantized_exactly_as_gguf_does(tmp_path, kind):
    rng = np.random.default_rng(0)
    data = (rng.standard_normal((48, 160)) * 0.1).astype(np.float32)
    path = _write(tmp_path / "m.gguf", {"blk.0.attn_output.weight": (data, T[kind])})
    stored = gguf.GGUFReader(str(path)).tensors[0]
    reference = torch.from_numpy(gguf.quants.dequantize(stored.data, stored.tensor_type).copy()).view(48, 160)
    ours = GGUFWeights(path)._take("blk.0.attn_output.weight")
    assert ours.bits == (8 if kind == "Q8_0" else 4)
    assert torch.equal(dequantize(ours), reference)


def test_other_types_are_refused_with_the_way_out(tmp_path):
    path = _write(tmp_path / "m.gguf", {"blk.0.attn_output.weight": (np.ones((4, 64), np.float32), T.F32)})
    with pytest.raises(QuantizationError, match="F32.*quantization to none, int8 or int4"):
        GGUFWeights(path)._take("blk.0.attn_output.weight")


def test_query_rows_come_back_in_transformers_order():
    heads, head_dim = 3, 8
    hf = torch.arange(heads * head_dim)
    # llama.cpp's converter: reshape(heads, 2, head_dim // 2, ...).swapaxes(1, 2)
    as_gguf = hf.reshape(heads, 2, head_dim // 2).swapaxes(1, 2).reshape(-1)
    assert torch.equal(as_gguf[_unpermute(heads, head_dim)], hf)
