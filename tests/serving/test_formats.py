"""OpenAI's response shapes for log-probabilities and several choices, whole and streamed."""
from __future__ import annotations

import json

from handler.engine.sampling import TokenLogprob
from handler.serving.formats import Choice, Formatter, Usage

VOCAB = {1: "Hel", 2: "lo", 3: "é", 4: "!"}
LOGPROBS = [TokenLogprob(1, -0.1, ((1, -0.1), (4, -2.5))), TokenLogprob(2, -0.2, ((2, -0.2), (3, -3.0)))]


def formatter(api: str) -> Formatter:
    return Formatter(api, "llm", token_text=VOCAB.__getitem__)


def events(sse: str) -> list[dict]:
    return [json.loads(line[6:]) for line in sse.split("\n") if line.startswith("data: {")]


def test_completions_logprobs_are_parallel_lists_with_text_offsets():
    body = json.loads(formatter("completions").whole([Choice("Hello", "length", LOGPROBS)], Usage(3, 2)))
    assert body["choices"][0]["logprobs"] == {"tokens": ["Hel", "lo"], "token_logprobs": [-0.1, -0.2],
                                              "top_logprobs": [{"Hel": -0.1, "!": -2.5}, {"lo": -0.2, "é": -3.0}],
                                              "text_offset": [0, 3]}


def test_completions_logprobs_zero_has_null_alternatives():
    lps = [TokenLogprob(1, -0.1, ())]
    body = json.loads(formatter("completions").whole([Choice("Hel", "length", lps)], Usage(3, 1)))
    assert body["choices"][0]["logprobs"]["top_logprobs"] == [None]


def test_streamed_completions_offsets_continue_across_pieces():
    fmt = formatter("completions")
    first, second = (events(fmt.chunk(t, None, Usage(3, i + 1), [lp]))[0] for i, (t, lp) in enumerate(zip(["Hel", "lo"], LOGPROBS)))
    assert [first["choices"][0]["logprobs"]["text_offset"], second["choices"][0]["logprobs"]["text_offset"]] == [[0], [3]]


def test_chat_logprobs_are_objects_with_bytes():
    body = json.loads(formatter("chat").whole([Choice("Hello", "stop", LOGPROBS[1:])], Usage(3, 2)))
    assert body["choices"][0]["logprobs"] == {"content": [
        {"token": "lo", "logprob": -0.2, "bytes": [108, 111],
         "top_logprobs": [{"token": "lo", "logprob": -0.2, "bytes": [108, 111]},
                          {"token": "é", "logprob": -3.0, "bytes": [195, 169]}]}]}


def test_no_logprobs_asked_is_null():
    assert json.loads(formatter("chat").whole([Choice("Hi", "stop")], Usage(1, 1)))["choices"][0]["logprobs"] is None
    assert events(formatter("completions").chunk("Hi", None, Usage(1, 1)))[0]["choices"][0]["logprobs"] is None


def test_choices_are_indexed_and_usage_counts_them_all():
    body = json.loads(formatter("chat").whole([Choice("Red", "stop"), Choice("Blue", "length")], Usage(5, 7)))
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "Red", "stop"), (1, "Blue", "length")]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
                             "prompt_tokens_details": {"cached_tokens": 0}}


def test_a_stream_of_choices_ends_once_with_the_last_piece():
    fmt = Formatter("chat", "llm", include_usage=True)
    first_done = fmt.chunk("Red", "stop", Usage(5, 1), index=0, last=False)
    second = fmt.chunk("Blue", None, Usage(5, 2), index=1, last=False)
    last = fmt.chunk("", "length", Usage(5, 3), index=1, last=True)
    assert "[DONE]" not in first_done + second and last.endswith("data: [DONE]\n\n")
    pieces = [events(p) for p in (first_done, second, last)]
    assert [p[0]["choices"][0]["index"] for p in pieces] == [0, 1, 1]
    assert [p[0]["choices"][0]["delta"].get("role") for p in pieces] == ["assistant", "assistant", None]
    assert pieces[2][1]["usage"]["completion_tokens"] == 3
