"""Parsing `tools` / `tool_choice`, the schema a constrained answer follows, the template's tool
format, and the messages a template without tools reads."""
from __future__ import annotations

import json

import jsonschema
import pytest

from handler.serving.tools import ToolsError, generic_messages, parse_tools, template_message, tool_format

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def spec(fmt="generic", **data):
    return parse_tools({"tools": [WEATHER, TIME]} | data, fmt)


def test_no_tools_or_choice_none_is_plain_chat():
    assert parse_tools({}, "generic") is None
    assert spec(tool_choice="none") is None


def test_choice_defaults_to_auto_and_parallel_calls():
    s = spec()
    assert (s.choice, s.parallel, [f.name for f in s.functions]) == ("auto", True, ["get_weather", "get_time"])
    assert s.functions[1].parameters == {"type": "object", "properties": {}}


@pytest.mark.parametrize(("data", "message"), [
    ({"tool_choice": "required"}, "`tool_choice` needs `tools`"),
    ({"tools": {"a": 1}}, "`tools` must be a list"),
    ({"tools": [{"type": "function", "function": {}}]}, "tools[0] must be"),
    ({"tools": [TIME, TIME]}, "tool names must be unique"),
    ({"tools": [TIME], "tool_choice": "sometimes"}, "`tool_choice` must be one of none, auto, required"),
    ({"tools": [TIME], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "names 'nope', which is not in"),
    ({"tools": [TIME], "parallel_tool_calls": "yes"}, "`parallel_tool_calls` must be true or false"),
])
def test_malformed_tools_say_what_to_fix(data, message):
    with pytest.raises(ToolsError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_tools(data, "generic")


def _valid(schema_text: str, value) -> bool:
    try:
        jsonschema.validate(value, json.loads(schema_text))
        return True
    except jsonschema.ValidationError:
        return False


def test_required_allows_only_calls_with_valid_arguments():
    schema = spec("hermes", tool_choice="required").schema()
    assert _valid(schema, {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}},
                                          {"name": "get_time", "arguments": {}}]})
    assert not _valid(schema, {"tool_calls": [{"name": "get_weather", "arguments": {}}]})
    assert not _valid(schema, {"tool_calls": []}) and not _valid(schema, {"response": "hi"})


def test_a_named_function_allows_one_call_of_it():
    schema = spec(tool_choice={"type": "function", "function": {"name": "get_time"}}).schema()
    assert _valid(schema, {"tool_calls": [{"name": "get_time", "arguments": {}}]})
    assert not _valid(schema, {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]})
    assert not _valid(schema, {"tool_calls": [{"name": "get_time", "arguments": {}}] * 2})


def test_arguments_the_function_does_not_declare_are_refused_unless_its_schema_allows_them():
    schema = spec(tool_choice="required").schema()
    assert not _valid(schema, {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo", "maxLength": 4}}]})
    open_tools = {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "additionalProperties": True}}}], "tool_choice": "required"}
    assert _valid(parse_tools(open_tools, "generic").schema(), {"tool_calls": [{"name": "f", "arguments": {"x": 1}}]})


def test_no_parallel_calls_allows_one():
    schema = spec(tool_choice="required", parallel_tool_calls=False).schema()
    assert not _valid(schema, {"tool_calls": [{"name": "get_time", "arguments": {}}] * 2})


def test_auto_is_free_text_in_the_models_format_and_a_call_or_response_in_generic():
    assert spec("hermes").schema() is None and not spec("hermes").constrained
    schema = spec("generic").schema()
    assert _valid(schema, {"response": "It is sunny."})
    assert _valid(schema, {"tool_calls": [{"name": "get_time", "arguments": {}}]})


def test_the_tool_format_is_read_from_the_template():
    assert tool_format(None) == "generic"
    assert tool_format("{% for m in messages %}{{ m.content }}{% endfor %}") == "generic"
    assert tool_format("{% if tools %}<tool_call>{{ tools | tojson }}</tool_call>{% endif %}") == "hermes"
    assert tool_format("{% if tools %}<|python_tag|>{% endif %}") == "llama3_json"


def test_a_call_in_the_history_has_its_arguments_as_an_object():
    m = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\": \"UTC\"}"}}]}
    assert template_message(m, 1)["tool_calls"][0]["function"]["arguments"] == {"tz": "UTC"}
    with pytest.raises(ToolsError, match="are not JSON"):
        template_message(m | {"tool_calls": [{"function": {"name": "x", "arguments": "{"}}]}, 1)


def test_generic_history_without_tools_offered_keeps_calls_and_results_readable():
    call = {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": {}}}
    messages = [{"role": "user", "content": "Time?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": "12:00", "tool_call_id": "c1"}]
    out = generic_messages(messages, None)
    assert [m["role"] for m in out] == ["user", "assistant", "user"] and "tool_response" in out[2]["content"]
    assert generic_messages(messages[:1], None) == messages[:1]


def test_generic_messages_put_the_tools_in_the_system_message_and_results_in_one_user_turn():
    call = {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": {}}}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Time?"},
                {"role": "assistant", "content": "", "tool_calls": [call, call | {"id": "c2"}]},
                {"role": "tool", "content": "12:00", "tool_call_id": "c1"}, {"role": "tool", "content": "13:00", "tool_call_id": "c2"}]
    out = generic_messages(messages, spec())
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\nTools: [") and "get_weather" in out[0]["content"]
    assert json.loads(out[2]["content"]) == {"tool_calls": [{"name": "get_time", "arguments": {}}] * 2}
    assert [json.loads(line)["tool_response"]["content"] for line in out[3]["content"].split("\n")] == ["12:00", "13:00"]
