"""A GGUF file alone as a checkpoint (handler.packing.gguf_checkpoint): staged with the config and
tokenizer converted from it, loaded with every weight from the file, and refused with the
tensor's name where a type is not served."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from handler.engine.checkpoint import CheckpointError, open_checkpoint
from handler.engine.config import EngineConfig
from handler.engine.factory import build_engine
from handler.engine.quant.apply import projections
from handler.engine.sampling import SamplingParams
from handler.engine.tokenizer import Tokenizer
from handler.packing.gguf_checkpoint import check_served, gguf_source, stage_gguf

gguf = pytest.importorskip("gguf")


def _gguf_of(checkpoint: Path) -> Path:
    (found,) = checkpoint.glob("*.gguf")
    return found


@pytest.fixture(scope="module")
def staged(default_checkpoint, tmp_path_factory) -> Path:
    return stage_gguf(_gguf_of(default_checkpoint), tmp_path_factory.mktemp("gguf-alone") / "checkpoint")


def test_a_gguf_file_names_itself_and_a_folder_its_only_gguf(default_checkpoint, tmp_path):
    file = _gguf_of(default_checkpoint)
    assert gguf_source(file) == file
    assert gguf_source(default_checkpoint) is None  # config.json beside it: a checkpoint directory
    shutil.copy(file, tmp_path / file.name)
    assert gguf_source(tmp_path) == tmp_path / file.name
    shutil.copy(file, tmp_path / "second.gguf")
    with pytest.raises(CheckpointError, match="2 GGUF files"):
        gguf_source(tmp_path)


def test_staged_from_the_file_alone_it_is_the_same_model(staged, default_checkpoint):
    alone, beside = open_checkpoint(staged), open_checkpoint(default_checkpoint)
    assert alone.gguf_only and not alone.weight_files
    assert alone.args == beside.args
    ours, theirs = Tokenizer.from_dir(staged), Tokenizer.from_dir(default_checkpoint)
    assert ours.chat_template == theirs.chat_template and ours.eos_ids == theirs.eos_ids
    text = "Hello  world\n\n\tcafé 東京 <|im_start|>user\n🙂"
    assert ours.encode(text) == theirs.encode(text)


def test_tokens_equal_llama_cpps_for_the_same_file(staged):
    """tests/fixtures/llamacpp_tokens_default.json: llama-server's /tokenize, recorded by
    bench/gguf_tokens.py (special tokens, whitespace runs, non-ASCII text, code)."""
    fixture = json.loads((Path(__file__).parents[1] / "fixtures" / "llamacpp_tokens_default.json").read_text())
    assert fixture["gguf"] == _gguf_of(staged).name
    ours = Tokenizer.from_dir(staged)
    assert {text: ours.encode(text, add_special_tokens=False) for text in fixture["tokens"]} == fixture["tokens"]


def _generate(checkpoint: Path, quantization: str) -> tuple[object, list]:
    loaded = build_engine(EngineConfig(checkpoint, dtype="bfloat16", compile="eager", quantization=quantization,
                                       max_batch_size=2, max_seq_len=64))
    ids = loaded.engine.tokenizer.encode("The capital of France is")
    params = SamplingParams(max_new_tokens=8, ignore_eos=True, logprobs=2)
    loaded.engine.add("a", ids, params)
    outputs = []
    while loaded.engine.running:
        outputs += loaded.engine.step()
    return loaded.model, outputs


@pytest.mark.parametrize("quantization", ["gguf", "none"])
def test_the_file_alone_generates_what_the_checkpoint_beside_it_does(staged, default_checkpoint, quantization):
    model, alone = _generate(staged, quantization)
    _, beside = _generate(default_checkpoint, quantization)
    assert [o.token_ids for o in alone] == [o.token_ids for o in beside]
    for a, b in zip(alone, beside):
        assert [x.logprob for x in a.logprobs] == pytest.approx([x.logprob for x in b.logprobs], abs=1e-4)
    if quantization == "gguf":  # as stored: every projection quantized, none dequantized
        assert all(linear.quantized is not None and "weight" not in linear._parameters for _, linear in projections(model))
        # and the tied embedding is the head's quantized weight, looked up as stored
        assert model.tok_embeddings.stored is model.output.stored[0]


def test_a_tensor_type_the_engine_does_not_serve_is_refused_with_its_name(tmp_path):
    path = tmp_path / "k.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    q3_k = gguf.GGMLQuantizationType.Q3_K  # 110 bytes a block of 256
    writer.add_tensor("blk.0.ffn_down.weight", np.zeros((4, 110), np.uint8), raw_dtype=q3_k)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(CheckpointError, match=r"blk\.0\.ffn_down\.weight \(Q3_K\).*served: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K"):
        check_served(path)
