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
        if kind in (T.F32, T.F16):
            writer.add_tensor(name, data.astype(np.float16) if kind == T.F16 else data)
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
    ours = GGUFWeights(path).tensor("blk.0.attn_output.weight")
    assert ours.bits == (8 if kind == "Q8_0" else 4)
    assert torch.equal(dequantize(ours), reference)


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16"])
def test_float_tensors_are_read_as_stored(tmp_path, kind):
    data = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    path = _write(tmp_path / "m.gguf", {"blk.0.attn_output.weight": (data, T[kind])})
    stored = gguf.GGUFReader(str(path)).tensors[0]
    reference = torch.from_numpy(gguf.quants.dequantize(stored.data, stored.tensor_type).copy()).view(4, 64)
    assert torch.equal(GGUFWeights(path).floats("blk.0.attn_output.weight"), reference)


def test_other_types_are_refused_with_the_tensors_name(tmp_path):
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.attn_output.weight", np.zeros((4, 110), np.uint8), raw_dtype=T.Q3_K)  # 4 x 256 weights
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(QuantizationError, match=r"blk\.0\.attn_output\.weight is Q3_K; the engine serves Q8_0"):
        GGUFWeights(path).floats("blk.0.attn_output.weight")


def test_query_rows_are_reordered_only_where_the_converter_permuted_them(tmp_path):
    """llama.cpp permutes query/key rows for `llama` files (Llama, Mistral), not for qwen2 and later."""
    from handler.engine.model.args import ModelArgs

    args = ModelArgs(vocab_size=8, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, intermediate_size=64,
                     norm_eps=1e-6, rope_theta=1e4)
    rows = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)  # q 32 rows, k 16, v 16
    for arch, permuted in (("llama", True), ("qwen2", False)):
        writer = gguf.GGUFWriter(str(tmp_path / f"{arch}.gguf"), arch)
        for name, part in (("attn_q", rows[:32]), ("attn_k", rows[32:48]), ("attn_v", rows[48:])):
            writer.add_tensor(f"blk.0.{name}.weight", part)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        wqkv = GGUFWeights(tmp_path / f"{arch}.gguf").projection("layers.0.attention.wqkv", args)
        expected = torch.from_numpy(rows)
        if permuted:
            expected = torch.cat([expected[:32][_unpermute(2, 16)], expected[32:48][_unpermute(1, 16)], expected[48:]])
        assert torch.equal(wqkv, expected)


def test_query_rows_come_back_in_transformers_order():
    heads, head_dim = 3, 8
    hf = torch.arange(heads * head_dim)
    # llama.cpp's converter: reshape(heads, 2, head_dim // 2, ...).swapaxes(1, 2)
    as_gguf = hf.reshape(heads, 2, head_dim // 2).swapaxes(1, 2).reshape(-1)
    assert torch.equal(as_gguf[_unpermute(heads, head_dim)], hf)


def test_the_tensor_directory_matches_the_maintained_reader(tmp_path):
    """gguf_file reads the header itself (GGUFReader parses the whole vocabulary first): same
    names, types, shapes and bytes, with string-array metadata in front to skip."""
    from handler.engine.quant.gguf_file import read_directory, read_rows, read_tensor_infos

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
    metadata = read_directory(tmp_path / "m.gguf").metadata
    assert (metadata["general.architecture"], metadata["general.name"]) == ("llama", "test")
    assert "tokenizer.ggml.tokens" not in metadata  # arrays are skipped


def test_a_file_that_is_not_gguf_is_refused_clearly(tmp_path):
    from handler.engine.quant.gguf_file import GGUFFormatError, read_tensor_infos

    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04" + bytes(40))
    with pytest.raises(GGUFFormatError, match="not a GGUF file"):
        read_tensor_infos(tmp_path / "x.gguf")
