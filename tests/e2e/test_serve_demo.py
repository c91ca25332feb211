"""serve.sh's demo question (handler.serve.ask) against a real TorchServe serving a model whose
checkpoint has no chat template: it asks on the completions route and gets an answer; a refused
request comes back as the server's status and message."""
from __future__ import annotations

import pytest

from handler.engine.tokenizer import NO_CHAT_TEMPLATE
from handler.serve import QUESTION, DemoError, ask


def test_the_demo_asks_a_model_without_a_chat_template_on_the_completions_route(no_template_server, capsys):
    ts = no_template_server
    answer = ask(f"{ts.inference_url}/predictions/llm/1.0/v1", ts.headers(), "llm", QUESTION)
    assert answer.strip()
    assert f"({NO_CHAT_TEMPLATE}: asking on the completions route)" in capsys.readouterr().out


def test_a_refused_demo_request_is_the_servers_status_and_message(no_template_server):
    ts = no_template_server
    with pytest.raises(DemoError) as refused:
        ask(f"{ts.inference_url}/predictions/llm/1.0/v1", ts.headers(), "another-model", QUESTION)
    status, _, message = str(refused.value).partition(": ")
    assert status.isdigit() and 400 <= int(status) < 500 and "another-model" in message, refused.value
