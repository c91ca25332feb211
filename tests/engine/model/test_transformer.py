"""The engine's decoder against transformers' reference implementation on the same weights."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file

from handler.engine.checkpoint import load_model, open_checkpoint
from handler.engine.kv.pages import own_pages, page_columns

FP32_ATOL = 2e-4  # max |logit difference| allowed in fp32 (logits are O(10))


def _reference(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _compare_prefill_and_decode(path, prompt_ids, chunk: int | None = None):
    """Our prefill (in chunks of `chunk` tokens, each attending to the cached ones) and one decode
    step against transformers' logits for the same tokens."""
    ours = load_model(open_checkpoint(path), torch.float32)
    ours.setup_cache(page_columns(64), 64)
    ref = _reference(path)
    ids = torch.tensor([prompt_ids])
    t = ids.shape[1]
    chunk = chunk or t
    with torch.inference_mode():
        ref_logits = ref(ids).logits[0]
        for start in range(0, t, chunk):
            piece = ids[:, start:start + chunk]
            got_prefill = ours.prefill(piece, own_pages(1, 64), torch.tensor([start]), torch.tensor([piece.shape[1] - 1]), 64)[0]
        nxt = int(ref_logits[-1].argmax())
        ref_next = ref(torch.cat([ids, torch.tensor([[nxt]])], 1)).logits[0, -1]
        got_next = ours.decode(torch.tensor([nxt]), own_pages(1, 64), torch.tensor([t]), t + 1)[0]
    assert (got_prefill - ref_logits[-1]).abs().max().item() < FP32_ATOL
    assert (got_next - ref_next).abs().max().item() < FP32_ATOL


def test_smollm2_logits_match_transformers(default_checkpoint):
    _compare_prefill_and_decode(default_checkpoint, [1, 504, 3458, 282, 4649, 314, 253, 30])


@pytest.fixture(scope="module")
def qwen2_random_checkpoint(tmp_path_factory):
    """A small random-weight Qwen2-style checkpoint: q/k/v biases, GQA, untied head."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                         rope_theta=10000.0, max_position_embeddings=256)
    model = Qwen2ForCausalLM(config)
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            torch.nn.init.normal_(p, std=0.5)  # nonzero biases, so a dropped bias shows
    path = tmp_path_factory.mktemp("qwen2")
    model.save_pretrained(path, safe_serialization=True)
    (path / "tokenizer.json").write_text(json.dumps({}))  # only presence is checked here
    return path


def test_qwen2_with_biases_matches_transformers(qwen2_random_checkpoint):
    _compare_prefill_and_decode(qwen2_random_checkpoint, [5, 17, 300, 42, 7, 99])


@pytest.fixture(scope="module")
def qwen3_random_checkpoint(tmp_path_factory):
    """A small random-weight Qwen3-style checkpoint: q/k RMSNorm, a head_dim that is not
    hidden / heads, GQA, tied head."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=48, tie_word_embeddings=True,
                         rope_theta=1000000.0, max_position_embeddings=256)
    model = Qwen3ForCausalLM(config)
    for name, p in model.named_parameters():
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            torch.nn.init.uniform_(p, 0.5, 1.5)  # not all ones, so a dropped norm weight shows
    path = tmp_path_factory.mktemp("qwen3")
    model.save_pretrained(path, safe_serialization=True)
    (path / "tokenizer.json").write_text(json.dumps({}))
    return path


def test_qwen3_with_query_key_norms_matches_transformers(qwen3_random_checkpoint):
    _compare_prefill_and_decode(qwen3_random_checkpoint, [5, 17, 300, 42, 7, 99])


def _gemma3_checkpoint(path, sliding_window: int, **config):
    """A small random-weight Gemma 3 text checkpoint in `path`: sandwich norms (1 + w), q/k norms,
    GeGLU, scaled embeddings, query_pre_attn_scalar, local and global RoPE bases, tied head."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=48, query_pre_attn_scalar=64,
                              sliding_window=sliding_window,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                              rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                              max_position_embeddings=256, **config)
    model = Gemma3ForCausalLM(config)
    for name, p in model.named_parameters():
        if "norm" in name:
            torch.nn.init.uniform_(p, -0.5, 0.5)  # Gemma norms start at 0 (a scale of 1): a dropped one shows
    model.save_pretrained(path, safe_serialization=True)
    (path / "tokenizer.json").write_text(json.dumps({}))
    return path


@pytest.fixture(scope="module")
def gemma3_random_checkpoint(tmp_path_factory):
    return _gemma3_checkpoint(tmp_path_factory.mktemp("gemma3"), sliding_window=64)


def test_gemma3_text_matches_transformers(gemma3_random_checkpoint):
    assert open_checkpoint(gemma3_random_checkpoint).args.local_layers == (0, 2)
    _compare_prefill_and_decode(gemma3_random_checkpoint, [5, 17, 300, 42, 7, 99])


# Prompts longer than a sliding window of 6, prefilled whole and in chunks of 4 (a chunk's
# tokens see cached ones that are partly out of their window).
LONG_PROMPT = [5, 17, 300, 42, 7, 99, 3, 250, 61, 11, 480, 19, 77, 2, 140, 33]


@pytest.fixture(scope="module")
def mistral_window_checkpoint(tmp_path_factory):
    """A small random-weight Mistral checkpoint whose sliding window (6) is shorter than the prompt."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=6,
                           max_position_embeddings=256, attn_implementation="eager")
    path = tmp_path_factory.mktemp("mistral")
    MistralForCausalLM(config).save_pretrained(path, safe_serialization=True)
    (path / "tokenizer.json").write_text(json.dumps({}))
    return path


@pytest.mark.parametrize("chunk", [None, 4])
def test_mistral_beyond_its_sliding_window_matches_transformers(mistral_window_checkpoint, chunk):
    assert open_checkpoint(mistral_window_checkpoint).args.window_layers == (0, 1)
    _compare_prefill_and_decode(mistral_window_checkpoint, LONG_PROMPT, chunk)


def test_a_window_changes_what_is_computed(mistral_window_checkpoint):
    """The window is applied, not ignored: without it the same weights give other logits."""
    ckpt = open_checkpoint(mistral_window_checkpoint)
    windowed, full = (load_model(ckpt, torch.float32) for _ in range(2))
    full.args = dataclasses.replace(ckpt.args, window_layers=())
    outs = []
    with torch.inference_mode():
        for model in (windowed, full):
            model.setup_cache(page_columns(64), 64)
            ids = torch.tensor([LONG_PROMPT])
            outs.append(model.prefill(ids, own_pages(1, 64), torch.tensor([0]), torch.tensor([len(LONG_PROMPT) - 1]), 64)[0])
    assert (outs[0] - outs[1]).abs().max().item() > 100 * FP32_ATOL


@pytest.fixture(scope="module")
def gemma3_window_checkpoint(tmp_path_factory):
    """Gemma 3 text with a sliding window (6) shorter than the prompt on its local layers."""
    return _gemma3_checkpoint(tmp_path_factory.mktemp("gemma3-window"), sliding_window=6, attn_implementation="eager")


@pytest.mark.parametrize("chunk", [None, 4])
def test_gemma3_beyond_its_sliding_window_matches_transformers(gemma3_window_checkpoint, chunk):
    assert open_checkpoint(gemma3_window_checkpoint).args.window_layers == (0, 2)
    _compare_prefill_and_decode(gemma3_window_checkpoint, LONG_PROMPT, chunk)


def test_gemma3_with_its_vision_tower_is_refused_clearly(tmp_path):
    from handler.engine.checkpoint import CheckpointError, model_args_from_config

    with pytest.raises(CheckpointError, match=r"vision tower.*gemma3_text"):
        model_args_from_config({"model_type": "gemma3", "text_config": {}})


def test_unsupported_architecture_is_named(tmp_path):
    from handler.engine.checkpoint import CheckpointError

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    (tmp_path / "tokenizer.json").write_text("{}")
    save_file({"x": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="unsupported architecture model_type='gpt2'"):
        open_checkpoint(tmp_path)


def test_missing_tokenizer_is_named(tmp_path):
    from handler.engine.checkpoint import CheckpointError

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"missing tokenizer\.json"):
        open_checkpoint(tmp_path)


def test_pickle_only_checkpoint_is_refused(tmp_path):
    from handler.engine.checkpoint import CheckpointError

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match="pickle weights are not loaded"):
        open_checkpoint(tmp_path)

