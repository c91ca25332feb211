"""Tool calls read from a model's answer, whole and streamed: text before a call streams, the
call goes out parsed at the end, and what does not parse stays content."""
from __future__ import annotations

import json

import pytest

from handler.serving.tool_calls import ToolStream, parse_answer
from handler.serving.tools import parse_tools

TOOLS = {"tools": [{"type": "function", "function": {"name": "get_time"}}]}


def spec(fmt: str, choice: str = "auto"):
    return parse_tools(TOOLS | {"tool_choice": choice}, fmt)


def test_hermes_calls_and_the_text_before_them():
    text = 'Let me check.\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>\n' \
           '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    content, calls = parse_answer(text, spec("hermes"))
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_time", {"tz": "UTC"}), ("get_time", {})]
    assert calls[0].id.startswith("call_") and calls[0].id != calls[1].id


def test_a_malformed_hermes_block_stays_content():
    text = "<tool_call>{not json}</tool_call>"
    assert parse_answer(text, spec("hermes")) == (text, [])


@pytest.mark.parametrize("text", ['{"name": "get_time", "parameters": {"tz": "UTC"}}',
                                  '<|python_tag|>{"name": "get_time", "parameters": {"tz": "UTC"}}'])
def test_llama3_json_call(text):
    content, [call] = parse_answer(text, spec("llama3_json"))
    assert content is None and (call.name, json.loads(call.arguments)) == ("get_time", {"tz": "UTC"})


def test_llama3_text_answer_is_content():
    assert parse_answer("It is noon.", spec("llama3_json")) == ("It is noon.", [])


def test_constrained_answer_is_calls_or_a_response_and_a_cut_one_is_content():
    _, [call] = parse_answer('{"tool_calls": [{"name": "get_time", "arguments": {}}]}', spec("generic"))
    assert call.arguments == "{}"
    assert parse_answer('{"response": "Noon."}', spec("generic")) == ("Noon.", [])
    assert parse_answer('{"tool_calls": [{"name": "get_ti', spec("hermes", "required")) == ('{"tool_calls": [{"name": "get_ti', [])


def _stream(fmt: str, pieces: list[str], choice: str = "auto"):
    s = ToolStream(spec(fmt, choice))
    sent = [s.feed(p) for p in pieces]
    return sent, s.finish()


def test_hermes_stream_sends_text_holds_a_possible_marker_and_the_call():
    sent, (rest, calls) = _stream("hermes", ["Sure", ". <tool", "_call>", '{"name": "get_time", ', '"arguments": {}}</tool_call>'])
    assert sent == ["Sure", ". ", "", "", ""] and rest == "" and [c.name for c in calls] == ["get_time"]


def test_hermes_stream_releases_a_held_tail_that_was_not_a_marker():
    sent, (rest, calls) = _stream("hermes", ["a <to", "y> b"])
    assert sent == ["a ", "<toy> b"] and (rest, calls) == ("", [])


def test_llama3_stream_text_answer_flows_and_a_call_is_held():
    assert _stream("llama3_json", [" It", " is"]) == ([" It", " is"], ("", []))
    sent, (rest, [call]) = _stream("llama3_json", [" {", '"name": "get_time", "parameters": {}}'])
    assert sent == ["", ""] and rest == "" and call.name == "get_time"


def test_constrained_stream_holds_everything_until_the_end():
    sent, (rest, calls) = _stream("generic", ['{"response": ', '"Noon."}'])
    assert sent == ["", ""] and (rest, calls) == ("Noon.", [])


@pytest.mark.parametrize("fmt, text", [
    ("hermes", 'Sure, <tool maybe. <tool_call>{"name": "get_time", "arguments": {}}</tool_call>'),
    ("llama3_json", '<|python_tag|>{"name": "get_time", "parameters": {}}'),
    ("llama3_json", "It is noon, <|python"),
])
def test_a_stream_fed_any_prefix_at_once_holds_what_it_held_fed_piece_by_piece(fmt, text):
    """A resumed tool stream rebuilds its parser from the text up to the client's point in one
    feed: what it lets out from there must be what the uncut stream let out."""
    piecewise, (piecewise_rest, piecewise_calls) = _stream(fmt, list(text))
    for at in range(len(text) + 1):
        s = ToolStream(spec(fmt))
        assert s.feed(text[:at]) == "".join(piecewise[:at]), at
        assert "".join(s.feed(c) for c in text[at:]) == "".join(piecewise[at:]), at
        rest, calls = s.finish()
        assert rest == piecewise_rest
        assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in piecewise_calls]
