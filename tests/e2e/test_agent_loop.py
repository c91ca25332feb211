"""Tool calls through a real TorchServe: the official OpenAI client's agent loop (call -> tool
result -> answer), streamed calls, and LangChain's ChatOpenAI.bind_tools pointed at our base URL.
The default model's template knows no tools: the generic format (tools.py) carries them."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                   "unit": {"enum": ["celsius", "fahrenheit"]}},
                  "required": ["city", "unit"]}
# One tool: the e2e server's context is 256 tokens (several tools' choice is tests/serving/test_tools.py's).
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": WEATHER_PARAMS}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.inference_url}/predictions/llm/1.0/v1", api_key=server.token(), max_retries=0)


def _chat(client, messages, **kw):
    return client.chat.completions.create(model="llm", messages=messages, tools=TOOLS, max_tokens=48, **kw)


def test_the_official_clients_tool_loop_reaches_an_answer(client):
    first = _chat(client, ASK, tool_choice="required", temperature=0, parallel_tool_calls=False)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)
    results = [{"role": "tool", "tool_call_id": c.id, "content": json.dumps({"temperature": 18, "sky": "clear"})} for c in calls]
    final = _chat(client, [*ASK, choice.message.model_dump(exclude_none=True), *results], tool_choice="none", temperature=0)
    assert final.choices[0].finish_reason in ("stop", "length") and final.choices[0].message.content.strip()
    assert not final.choices[0].message.tool_calls


def test_a_named_function_is_called_with_valid_arguments(client):
    r = _chat(client, ASK, tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=1.0, seed=3)
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)


def test_auto_answers_in_text_or_calls_a_tool(client):
    r = _chat(client, ASK, tool_choice="auto", temperature=0)
    message = r.choices[0].message
    assert bool(message.tool_calls) != bool(message.content)
    assert r.choices[0].finish_reason in (("tool_calls",) if message.tool_calls else ("stop", "length"))


def test_streamed_tool_calls_equal_the_whole_answer(client):
    whole = _chat(client, ASK, tool_choice="required", temperature=0, parallel_tool_calls=False)
    chunks = list(_chat(client, ASK, tool_choice="required", temperature=0, parallel_tool_calls=False, stream=True))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert [(d.function.name, d.function.arguments) for d in deltas] == \
        [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_a_tool_choice_without_tools_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="`tool_choice` needs `tools`"):
        client.chat.completions.create(model="llm", messages=ASK, tool_choice="required", max_tokens=8)


def test_langchain_bind_tools_round_trip(server):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_time(city: str) -> str:
        """Current time in a city."""
        return "12:00"

    llm = ChatOpenAI(model="llm", base_url=f"{server.inference_url}/predictions/llm/1.0/v1", api_key=server.token(),
                     temperature=0, max_tokens=48, max_retries=0)
    messages = [HumanMessage("What time is it in Oslo?")]
    ai = llm.bind_tools([get_time], tool_choice="get_time").invoke(messages)
    [call] = ai.tool_calls
    assert call["name"] == "get_time" and isinstance(call["args"]["city"], str)
    messages += [ai, ToolMessage(get_time.invoke(call["args"]), tool_call_id=call["id"])]
    answer = llm.bind_tools([get_time]).invoke(messages)
    assert answer.content.strip() or answer.tool_calls
