"""gRPC Predictions and StreamPredictions, with stubs compiled at test time from our .proto."""
from __future__ import annotations

import json

import grpc
import pytest

pytestmark = pytest.mark.slow


def call(ts, stubs, method, body):
    pb, pb_grpc = stubs
    with grpc.insecure_channel(f"127.0.0.1:{ts.ports.grpc_inference}") as channel:
        stub = pb_grpc.InferenceAPIsServiceStub(channel)
        request = pb.PredictionsRequest(model_name="llm", input={"data": json.dumps(body).encode()})
        result = getattr(stub, method)(request, metadata=(("authorization", f"Bearer {ts.token()}"),), timeout=120)
        return [result] if method == "Predictions" else list(result)


def test_predictions(server, grpc_stubs):
    [reply] = call(server, grpc_stubs, "Predictions", {"prompt": "Hello, my name is", "max_new_tokens": 8})
    body = json.loads(reply.prediction)
    assert body["text"].strip() and body["usage"]["completion_tokens"] <= 8


def test_stream_predictions_in_continuous_mode_end_with_the_final_piece(server, grpc_stubs):
    replies = call(server, grpc_stubs, "StreamPredictions", {"prompt": "Hello, my name is", "max_new_tokens": 8, "stream": True})
    pieces = [json.loads(line) for r in replies for line in r.prediction.decode().splitlines()]
    assert pieces[-1]["finish_reason"] in ("length", "stop")
    whole = json.loads(call(server, grpc_stubs, "Predictions", {"prompt": "Hello, my name is", "max_new_tokens": 8})[0].prediction)
    assert "".join(p["text"] for p in pieces) == whole["text"]


def test_stream_predictions_in_async_mode_end(async_server, grpc_stubs):
    body = {"prompt": "Hello, my name is", "max_new_tokens": 8, "ignore_eos": True}
    replies = call(async_server, grpc_stubs, "StreamPredictions", {**body, "stream": True})
    pieces = [json.loads(line) for r in replies for line in r.prediction.decode().splitlines()]
    assert pieces[-1]["finish_reason"] == "length"
    whole = json.loads(call(async_server, grpc_stubs, "Predictions", body)[0].prediction)
    assert "".join(p["text"] for p in pieces) == whole["text"]


def test_stream_predictions_token_by_token_in_dynamic_mode(dynamic_server, grpc_stubs):
    replies = call(dynamic_server, grpc_stubs, "StreamPredictions", {"prompt": "One, two,", "max_new_tokens": 8, "stream": True})
    assert len(replies) > 2, "each decode step arrives as its own gRPC message"
    pieces = [json.loads(line) for r in replies for line in r.prediction.decode().splitlines()]
    assert pieces[-1]["finish_reason"] in ("length", "stop")


def test_grpc_without_token_is_refused(server, grpc_stubs):
    pb, pb_grpc = grpc_stubs
    with grpc.insecure_channel(f"127.0.0.1:{server.ports.grpc_inference}") as channel:
        stub = pb_grpc.InferenceAPIsServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Predictions(pb.PredictionsRequest(model_name="llm", input={"data": b'{"prompt": "hi"}'}), timeout=30)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_one_step_stream_in_dynamic_mode_ends(dynamic_server, grpc_stubs):
    replies = call(dynamic_server, grpc_stubs, "StreamPredictions", {"prompt": "One, two,", "max_new_tokens": 1, "stream": True})
    assert [json.loads(line)["finish_reason"] for r in replies for line in r.prediction.decode().splitlines()][-1] == "length"
