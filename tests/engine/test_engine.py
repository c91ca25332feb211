"""Generation behaviour of the engine on the real default model (eager, fp32)."""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from handler.engine.grammar import schema_text
from handler.engine.sampling import SamplingParams
from tests.support.generate import generate

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "Water boils at",
]


def _greedy(n):
    return SamplingParams(max_new_tokens=n)


def test_greedy_tokens_equal_transformers_greedy(engine, reference):
    n = 24
    for prompt in PROMPTS:
        ids = engine.tokenizer.encode(prompt)
        ours = generate(engine, [ids], [_greedy(n)])[0]
        with torch.inference_mode():
            ref = reference.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)[0, len(ids):].tolist()
        ref = [t for t in ref if t not in engine.tokenizer.eos_ids][: len(ours)]
        assert ours == ref, prompt


def test_ragged_batch_equals_each_prompt_alone(engine):
    prompt_ids = [engine.tokenizer.encode(p) for p in PROMPTS]
    assert len({len(p) for p in prompt_ids}) > 1, "prompts must differ in length"
    together = generate(engine, prompt_ids, [_greedy(16)] * len(PROMPTS))
    alone = [generate(engine, [ids], [_greedy(16)])[0] for ids in prompt_ids]
    assert together == alone


def test_a_slot_freed_mid_batch_is_refilled_correctly(engine):
    """Continuous batching: a request joining while others decode gets the same tokens as alone."""
    a, b = (engine.tokenizer.encode(p) for p in PROMPTS[:2])
    alone = generate(engine, [b], [_greedy(12)])[0]
    engine.add("a", a, _greedy(30))
    for _ in range(5):
        engine.step()
    engine.add("b", b, _greedy(12))
    got: list[int] = []
    while engine.running:
        for out in engine.step():
            if out.request_id == "b":
                got += out.token_ids
    assert got == alone


def test_fixed_seed_gives_the_same_sample_twice(engine):
    ids = engine.tokenizer.encode(PROMPTS[2])
    p = SamplingParams(max_new_tokens=20, temperature=0.9, top_k=50, top_p=0.95, seed=1234)
    first, second = generate(engine, [ids, ids], [p, p])
    assert first == second
    other = generate(engine, [ids], [SamplingParams(max_new_tokens=20, temperature=0.9, top_k=50, top_p=0.95, seed=99)])[0]
    assert other != first, "a different seed should change a 20-token sample"


def test_max_new_tokens_ends_with_length(engine):
    engine.add("x", engine.tokenizer.encode(PROMPTS[0]), _greedy(3))
    outs = []
    while engine.running:
        outs += engine.step()
    assert [o.completion_tokens for o in outs] == [1, 2, 3]
    assert outs[-1].finish_reason == "length"


def test_stop_string_truncates_and_finishes(engine):
    ids = engine.tokenizer.encode("Count: 1, 2, 3, 4, 5,")
    full = engine.tokenizer.decode(generate(engine, [ids], [_greedy(20)])[0])
    stop = full.strip()[:2]  # a string the greedy continuation is known to contain
    engine.add("s", ids, SamplingParams(max_new_tokens=20, stop=(stop,)))
    text, last = "", None
    while engine.running:
        for out in engine.step():
            text += out.text
            last = out
    assert last.finish_reason == "stop"
    assert stop not in text
    assert full.startswith(text)


def test_chat_template_answers_a_question(engine):
    ids = engine.tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    text = engine.tokenizer.decode(generate(engine, [ids], [_greedy(20)])[0])
    assert "Paris" in text


def _step_logprobs(engine, ids, params):
    """Every generated token's TokenLogprob, stepping the engine as a server does."""
    engine.add("lp", ids, params)
    tokens, logprobs = [], []
    while engine.running:
        for out in engine.step():
            tokens += out.token_ids
            logprobs += out.logprobs
    return tokens, logprobs


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_equal_float32_reference_after_temperature(engine, reference, temperature):
    ids = engine.tokenizer.encode(PROMPTS[0])
    params = SamplingParams(max_new_tokens=6, temperature=temperature, seed=3, logprobs=5)
    tokens, logprobs = _step_logprobs(engine, ids, params)
    assert [lp.token_id for lp in logprobs] == tokens and len(tokens) == 6
    with torch.inference_mode():
        logits = reference(torch.tensor([ids + tokens])).logits[0, len(ids) - 1 : -1]  # the logits each token was drawn from
    ref = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    for row, lp in zip(ref, logprobs):
        assert abs(lp.logprob - float(row[lp.token_id])) < 1e-3
        top_ids = [i for i, _ in lp.top]
        assert top_ids == row.topk(5).indices.tolist()
        assert max(abs(v - float(row[i])) for i, v in lp.top) < 1e-3


def test_no_logprobs_unless_asked(engine):
    _, logprobs = _step_logprobs(engine, engine.tokenizer.encode(PROMPTS[1]), _greedy(3))
    assert logprobs == []


# ---- structured output: decoding constrained to a JSON schema ------------------------------

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]},
                                                    "maxItems": 3}},
          "required": ["name", "age", "pets"], "additionalProperties": False}


def _person(seed: int | None = None) -> SamplingParams:
    return SamplingParams(max_new_tokens=64, temperature=0.9 if seed is not None else 0.0, seed=seed,
                          json_schema=schema_text(PERSON))


def test_fifty_seeded_schema_requests_all_validate(engine):
    ids = engine.tokenizer.encode_chat([{"role": "user", "content": "Describe a person as JSON."}])
    outputs = generate(engine, [ids] * 50, [_person(seed) for seed in range(50)])
    texts = [engine.tokenizer.decode(out) for out in outputs]
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)
    assert len(set(texts)) > 10, "seeded samples should differ"


def test_constrained_and_free_requests_share_a_batch_as_if_alone(engine):
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
    params = [_person(), _greedy(12), _person(seed=3), SamplingParams(max_new_tokens=12, temperature=0.8, seed=1)]
    together = generate(engine, prompts, params)
    alone = [generate(engine, [ids], [p])[0] for ids, p in zip(prompts, params)]
    assert together == alone


@pytest.mark.parametrize("ignore_eos", [False, True])  # the grammar, not ignore_eos, says where the text ends
def test_a_grammar_ends_the_sequence_when_complete(engine, ignore_eos):
    ids = engine.tokenizer.encode("Is water wet? Answer:")
    params = SamplingParams(max_new_tokens=20, json_schema=schema_text({"enum": ["yes", "no"]}), ignore_eos=ignore_eos)
    engine.add("q", ids, params)
    outs = []
    while engine.running:
        outs += engine.step()
    assert outs[-1].finish_reason == "stop" and engine.tokenizer.decode([t for o in outs for t in o.token_ids]) in ('"yes"', '"no"')
