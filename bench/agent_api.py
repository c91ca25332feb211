"""The API agents use, measured on ours (the default model, continuous batching, compiled):

    .venv/bin/python -m bench.agent_api

- `tool_call_valid_fraction`: requests with `tool_choice: "required"` at temperature 1.0 through
  the official `openai` client, 16 at a time, each asking about one city (`parallel_tool_calls:
  false`: one call is the answer); valid when the answer is tool calls whose arguments parse and
  validate against the function's schema. `tool_call_valid_fraction_parallel`: the same with
  parallel calls allowed, where a small model may go on adding calls until max_tokens cuts it.
- `tools_throughput_ratio`: 16 clients, output tok/s of tool-constrained answers over the same
  prompts (the tools' system message written out) answered freely.
- `penalties_throughput_ratio`: 16 clients, output tok/s with frequency and presence penalties on
  every request over none.

The throughput runs go round by round (each round runs every variant once), and a ratio is the
median of the rounds' ratios: on a noisy 2-core VM a single few-second run of each is not enough.

Both ratios run every request to --output-tokens (ignore_eos; the tool's argument is a string too
long to close within it), so they compare the cost of a token. Writes these keys (and the runs)
into docs/results/serve.json, and the Agent API section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import openai

from bench.common import REPO, RESULTS, versions, write_json, write_section
from bench.load import PROMPTS, run_load, summarize
from bench.serve import build_ours, serving
from handler.engine.convert import ensure_default_checkpoint
from handler.engine.tokenizer import Tokenizer
from handler.serving.tools import generic_messages, parse_tools, tool_format

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}
VALIDITY_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                                    "parameters": WEATHER}}]
# A string that cannot close within --output-tokens: every constrained answer runs to the limit.
NOTE_TOOLS = [{"type": "function", "function": {"name": "save_note", "description": "Save a note", "parameters": {
    "type": "object", "properties": {"text": {"type": "string", "minLength": 400}}, "required": ["text"]}}}]
QUESTIONS = ("What is the weather in Paris?", "Is it raining in Tokyo right now?", "How warm is it in Lima, in fahrenheit?",
             "Should I take a coat in Oslo today?", "What's the temperature in Cairo?")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--validity-requests", type=int, default=100)
    p.add_argument("--requests", type=int, default=64, help="requests per throughput run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    return p.parse_args()


def chat(messages: list[dict], args, **extra) -> dict:
    return {"messages": messages, "max_tokens": args.output_tokens, "temperature": 0, "ignore_eos": True,
            "stream_options": {"include_usage": True}, **extra}


def throughput_runs(url: str, headers: dict, system: str, args) -> dict[str, list[dict]]:
    asks = [[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}] for i in range(args.requests)]
    variants = {
        "free": [chat([{"role": "system", "content": system}, *m], args) for m in asks],
        "tools": [chat(m, args, tools=NOTE_TOOLS, tool_choice="required") for m in asks],
        "plain": [chat(m, args) for m in asks],
        "penalties": [chat(m, args, frequency_penalty=0.5, presence_penalty=0.5) for m in asks],
    }
    for bodies in variants.values():
        run_load(url, headers, bodies[:2], 1, stream=True)  # warm-up (the grammar's tables), not recorded
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        for name, bodies in variants.items():
            runs[name].append(summarize(run_load(url, headers, bodies, args.clients, stream=True)))
            print(f"round {round_} {name}: {runs[name][-1]['output_tokens_per_s']:.1f} tok/s, errors {runs[name][-1]['errors']}",
                  flush=True)
    return runs


def paired_ratio(runs: dict[str, list[dict]], variant: str, base: str) -> float:
    return statistics.median(a["output_tokens_per_s"] / b["output_tokens_per_s"] for a, b in zip(runs[variant], runs[base]))


def tool_validity(client: openai.OpenAI, args, parallel: bool) -> dict:
    def one(i: int) -> tuple[bool, str]:
        # the request as JSON-shaped dicts (the SDK's TypedDicts would restate VALIDITY_TOOLS' schema)
        request: dict[str, Any] = {"messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                   "tools": VALIDITY_TOOLS, "tool_choice": "required", "temperature": 1.0,
                                   "max_tokens": 128 if parallel else 64, "parallel_tool_calls": parallel}
        r = client.chat.completions.create(model="llm", **request)
        choice = r.choices[0]
        if choice.finish_reason != "tool_calls" or not choice.message.tool_calls:
            return False, f"finish_reason {choice.finish_reason}: {choice.message.content!r}"
        try:
            for call in choice.message.tool_calls:
                jsonschema.validate(json.loads(call.function.arguments), WEATHER)
        except (json.JSONDecodeError, jsonschema.ValidationError) as err:
            return False, str(err).splitlines()[0]
        return True, ""

    with ThreadPoolExecutor(args.clients) as pool:
        results = list(pool.map(one, range(args.validity_requests)))
    failures = [why for ok, why in results if not ok]
    return {"requests": len(results), "valid": len(results) - len(failures), "failures": failures[:5]}


def main() -> None:
    args = parse_args()
    checkpoint = ensure_default_checkpoint(REPO / "artifacts" / "checkpoints" / "smollm2-135m-instruct")
    tok = Tokenizer.from_dir(checkpoint)
    spec = parse_tools({"tools": NOTE_TOOLS, "tool_choice": "required"}, tool_format(tok.chat_template))
    system = generic_messages([{"role": "user", "content": ""}], spec)[0]["content"]  # the tools' system message
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "model_store"
        build_ours(checkpoint, store, args)
        with serving(store, Path(tmp) / "work", compiled=True) as ts:
            url = f"{ts.inference_url}/predictions/llm/1.0/v1/chat/completions"
            runs = throughput_runs(url, ts.headers(), system, args)
            client = openai.OpenAI(base_url=url.removesuffix("/chat/completions"), api_key=ts.token(), max_retries=0)
            validity = {parallel: tool_validity(client, args, parallel) for parallel in (False, True)}
    for parallel, v in validity.items():
        print(f"tool calls valid (parallel {parallel}): {v['valid']}/{v['requests']}", flush=True)
    result = json.loads((RESULTS / "serve.json").read_text())
    result |= {
        "agent_api": {"versions": versions(), "clients": args.clients, "output_tokens": args.output_tokens, "rounds": runs,
                      "tool_validity": validity[False], "tool_validity_parallel": validity[True]},
        "tool_call_valid_fraction": validity[False]["valid"] / validity[False]["requests"],
        "tool_call_valid_fraction_parallel": validity[True]["valid"] / validity[True]["requests"],
        "tools_throughput_ratio": paired_ratio(runs, "tools", "free"),
        "penalties_throughput_ratio": paired_ratio(runs, "penalties", "plain"),
    }
    write_json("serve.json", result)
    write_section("agent_api", markdown(result, " ".join(sys.argv[1:])))


def markdown(r: dict, argv: str) -> str:
    a = r["agent_api"]
    rows = "\n".join(f"| {name} | {' / '.join(_tps(run) for run in rounds)} | "
                     f"{rounds[-1]['ttft_p50_s']:.3f} | {_ms(rounds[-1]['itl_p50_s'])} / {_ms(rounds[-1]['itl_p99_s'])} | "
                     f"{sum(run['errors'] for run in rounds)} |" for name, rounds in a["rounds"].items())
    v, vp = a["tool_validity"], a["tool_validity_parallel"]
    command = f".venv/bin/python -m bench.agent_api {argv}".strip()
    return f"""## Agent API (tools, penalties)

`{command}` on {a['versions']['machine']} (CPU profile {a['versions']['cpu_profile']}), {a['clients']} clients,
{a['output_tokens']} output tokens per request (chat route, streamed).

| run | output tok/s, round by round | TTFT p50 (s, last round) | gap p50 / p99 (ms, last round) | errors |
|---|---|---|---|---|
{rows}

- `tool_choice: "required"` at temperature 1.0, one call asked (`parallel_tool_calls: false`):
  **{v['valid']}/{v['requests']}** answers were tool calls with arguments valid for the schema
  (`tool_call_valid_fraction` = {r['tool_call_valid_fraction']:.2f}); with parallel calls allowed and 128 tokens,
  {vp['valid']}/{vp['requests']} (`tool_call_valid_fraction_parallel`: the rest were cut by max_tokens while the
  model went on adding calls).
- `tools_throughput_ratio` = **{r['tools_throughput_ratio']:.2f}** (tools vs free, same prompt tokens);
  `penalties_throughput_ratio` = **{r['penalties_throughput_ratio']:.2f}** (penalties vs plain); each the median of
  the rounds' ratios.
- A tool answer goes out whole at its end (here cut by max_tokens: as `content`), so the tools run's TTFT is its
  end-to-end time and it has no gaps.
"""


def _tps(run: dict) -> str:
    return f"{run['output_tokens_per_s']:.0f}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


if __name__ == "__main__":
    main()
