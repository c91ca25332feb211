"""A cut stream's record: encode, then decode accepts exactly what encode writes (it comes from
a bucket), each field of its type and range."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from handler.engine.sampling import SamplingParams
from handler.resume.ids import new_key
from handler.resume.record import RecordedSample, RecordError, ResumeRecord, decode

VOCAB = 100


def _record(**changes) -> ResumeRecord:
    seeded = SamplingParams(max_new_tokens=16, temperature=0.8, top_p=0.9, seed=7, stop=("\n\n",),
                            logit_bias=((3, -2.0),), stop_token_ids=(5,))
    state = torch.Generator().manual_seed(7).get_state().numpy().tobytes()
    base = ResumeRecord(new_key(), "llm", "chat", 1_700_000_000.5, (1, 2, 3), (RecordedSample((4, 5), 9, state),),
                        seeded, True)
    return replace(base, **changes)


def _tampered(sample: dict | None = None, **fields) -> bytes:
    body = json.loads(_record().encode())
    body["samples"][0].update(sample or {})
    body.update(fields)
    return json.dumps(body).encode()


def test_a_seeded_record_round_trips_with_its_generator_state():
    record = _record()
    assert decode(record.encode(), VOCAB) == record


def test_a_greedy_record_needs_no_generator_state():
    record = _record(params=SamplingParams(max_new_tokens=4), samples=(RecordedSample((4, 5), 9),))
    assert decode(record.encode(), VOCAB) == record


def test_a_record_of_two_samples_and_tools_round_trips_with_one_finished():
    state = torch.Generator().manual_seed(8).get_state().numpy().tobytes()
    tools = {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}
    record = _record(samples=(RecordedSample((4, 5, 6), 13, finish_reason="tool_calls"), RecordedSample((7,), 2, state)),
                     tools=tools)
    assert decode(record.encode(), VOCAB) == record


@pytest.mark.parametrize("data, why", [
    (b"\xff not json", "not JSON"),
    (_tampered(extra=1), "fields"),
    (_tampered(version=1), "version"),
    (_tampered(prompt_ids=[1, VOCAB]), "prompt_ids"),
    (_tampered(prompt_ids=[]), "empty"),
    (_tampered(sample={"output_ids": [True]}), "output_ids"),
    (_tampered(sample={"sent": -1}), "sent"),
    (_tampered(sample={"extra": 1}), "a sample's fields"),
    (_tampered(sample={"finish_reason": "cut"}), "finish_reason"),
    (_tampered(sample={"finish_reason": "stop"}), "nothing was cut"),
    (_tampered(samples=[]), "samples"),
    (_tampered(tools={"tools": [], "functions": []}), "tools"),
    (_tampered(tools={"tools": []}, api="completions"), "tools on a route"),
    (_tampered(cut_at=float("nan")), "cut_at"),
    (_tampered(include_usage="yes"), "include_usage"),
    (_tampered(key="../../etc"), "key"),
    (_tampered(api="embeddings"), "api"),
    (_tampered(sample={"rng_state": "AAAA"}), "rng_state"),
    (_tampered(sample={"rng_state": None}), "rng_state is missing"),
    (_tampered(sample={"output_ids": list(range(16))}), "had finished"),
])
def test_anything_encode_would_not_write_is_refused(data, why):
    with pytest.raises(RecordError, match=why):
        decode(data, VOCAB)


@pytest.mark.parametrize("field, value", [("temperature", -1), ("top_p", 0), ("max_new_tokens", 0),
                                          ("logprobs", 99), ("stop_token_ids", [VOCAB]), ("logit_bias", [[VOCAB, 1.0]]),
                                          ("seed", "7"), ("stop", "\n")])
def test_sampling_parameters_a_request_could_not_set_are_refused(field, value):
    body = json.loads(_record().encode())
    body["params"][field] = value
    with pytest.raises(RecordError, match="params"):
        decode(json.dumps(body).encode(), VOCAB)
