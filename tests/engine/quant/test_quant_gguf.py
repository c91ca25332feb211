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


def test_the_tensor_directory_matches_the_maintained_reader(tmp_path):
    """gguf_file reads the header itself (GGUFReader parses the whole vocabulary first): same
    names, types, shapes and bytes, with string-array metadata in front to skip."""
    from handler.engine.quant.gguf_file import read_rows, read_tensor_infos

    rng = np.random.default_rng(1)
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_token_list([f"tok{i}" for i in range(300)])
    writer.add_token_scores([0.5] * 300)
    writer.add_string("general.name", "test")
    kinds = {"blk.0.ffn_up.weight": T.Q4_1, "blk.0.ffn_down.weight": T.Q8_0, "output.weight": T.Q4_0}
    for name, kind in kinds.items():
        writer.add_tensor(name, gguf.quants.quantize(rng.standard_normal((40, 96)).astype(np.float32), kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours = read_tensor_infos(tmp_path / "m.gguf")
    for t in gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors:
        info = ours[t.name]
        assert info.kind == t.tensor_type.name and info.shape == (40, 96)
        assert torch.equal(read_rows(tmp_path / "m.gguf", info), torch.from_numpy(np.array(t.data, dtype=np.uint8)))
    assert set(ours) == set(kinds)


def test_a_file_that_is_not_gguf_is_refused_clearly(tmp_path):
    from handler.engine.quant.gguf_file import GGUFFormatError, read_tensor_infos

    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04" + bytes(40))
    with pytest.raises(GGUFFormatError, match="not a GGUF file"):
        read_tensor_infos(tmp_path / "x.gguf")
