"""bench/random_gguf.py: the bodies' tensors in llama.cpp's names and shapes, rope_freqs as the
engine's llama3 scaling divides the frequencies, and a small body written and read back."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bench import random_gguf
from handler.engine.model.rope import _llama3_scale

gguf = pytest.importorskip("gguf")


def test_the_8b_body_has_llama_31_8b_shapes():
    shapes = dict(random_gguf.tensors("8b", vocab=49152))
    assert len(shapes) == 2 + 32 * 9 + 2  # rope_freqs, embedding; 9 a layer; final norm, untied head
    assert shapes["blk.31.attn_q.weight"] == (4096, 4096) and shapes["blk.0.attn_k.weight"] == (1024, 4096)
    assert shapes["blk.7.ffn_gate.weight"] == (14336, 4096) and shapes["blk.7.ffn_down.weight"] == (4096, 14336)
    assert shapes["output.weight"] == (49152, 4096) and shapes["rope_freqs.weight"] == (64,)


def test_the_3b_body_ties_its_head():
    assert "output.weight" not in dict(random_gguf.tensors("3b", vocab=100))


def test_rope_factors_divide_the_frequencies_as_llama3_scaling_does():
    rope = random_gguf.BODIES["8b"]["rope_parameters"]
    inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
    scaled = _llama3_scale(inv_freq, rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"],
                           rope["original_max_position_embeddings"])
    factors = torch.from_numpy(random_gguf.rope_factors(rope, 128)).double()
    assert torch.allclose(inv_freq / factors, scaled, rtol=1e-6)


def test_a_small_body_is_written_and_reads_back(tmp_path, monkeypatch):
    template = tmp_path / "template.gguf"
    writer = gguf.GGUFWriter(str(template), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(64)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    small = {**random_gguf.BODIES["8b"], "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    monkeypatch.setitem(random_gguf.BODIES, "small", small)
    out = random_gguf.write_bf16_gguf("small", template, tmp_path / "small.BF16.gguf")
    reader = gguf.GGUFReader(str(out))
    assert reader.fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert reader.fields["llama.block_count"].contents() == 2 and reader.fields["llama.attention.head_count_kv"].contents() == 2
    tensors = {t.name: t for t in reader.tensors}
    assert [t.name for t in reader.tensors] == [name for name, _ in random_gguf.tensors("small", 64)]
    q = tensors["blk.1.attn_q.weight"]
    assert q.tensor_type.name == "BF16" and tuple(q.shape.tolist()) == (64, 64)
    bits = np.asarray(q.data).view(np.uint16).astype(np.uint32) << 16
    values = bits.view(np.float32)
    assert 0.01 < values.std() < 0.03  # normal(0, STD) in bf16
    assert np.array_equal(np.asarray(tensors["output_norm.weight"].data), np.ones(64, dtype=np.float32))
    assert not (tmp_path / "small.BF16.partial").exists()
