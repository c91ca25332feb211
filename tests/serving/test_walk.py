"""One streamed chat completion's way through `handler/serving/` in continuous batching: each
stage once, in the order the request lives, and each helper under one stage (tests/support/walk.py;
docs/architecture.md, "One request's walk")."""
from __future__ import annotations

import pytest

from handler.engine.config import EngineConfig
from handler.engine.factory import build_engine
from handler.serving.continuous_service import ContinuousService
from handler.serving.live import Incoming
from handler.serving.request_fields import Limits
from tests.support.recording_sink import RecordingSink
from tests.support.walk import walk

LIMITS = Limits(max_seq_len=128, max_new_tokens_cap=64, default_max_new_tokens=8, served_model_name="llm")
CHAT = {"model": "llm", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
PATH = "/v1/chat/completions"


@pytest.fixture(scope="module")
def service(default_checkpoint):
    cfg = EngineConfig(default_checkpoint, dtype="float32", compile="eager", max_batch_size=2, max_seq_len=128,
                       quantization="none")
    # The drain flag's hooks, as the handler gives them (handler.drain_flag: outside serving). No
    # step run ahead: that step runs on a thread of its own after the call's replies, for the next call.
    return ContinuousService(build_engine(cfg).engine, LIMITS, RecordingSink(), draining=lambda: False,
                             cutting=lambda: False, step_ahead=False)


def test_the_call_that_admits_a_stream_visits_each_stage_once_in_order(service):
    first = walk(lambda: service.handle([Incoming("a", CHAT, True, PATH)]))
    assert first.returns == []
    stages = [module for module in first.stays if module.startswith("lifecycle/") and module != "lifecycle/resume.py"]
    assert stages == ["lifecycle/admit.py", "lifecycle/start.py", "lifecycle/step.py", "lifecycle/reply.py"]


def test_a_continuing_call_visits_each_stage_once_in_order(service):
    service.handle([Incoming("b", CHAT, True, PATH)])
    going_on = walk(lambda: service.handle([Incoming("b", None, True, PATH)]))
    assert going_on.returns == []
    assert [m for m in going_on.stays if m.startswith("lifecycle/")] == ["lifecycle/start.py", "lifecycle/step.py",
                                                                           "lifecycle/reply.py"]
