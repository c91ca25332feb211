"""The TorchServe handler: a thin adapter from TorchServe's context to the serving core.

Archives name this file as their handler (`archive.sh` does), so TorchServe imports it by path;
everything else is imported from the installed `handler` package.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, cast

from ts.handler_utils.utils import send_intermediate_predict_response
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import PredictionException

from handler.drain_flag import DrainFlag
from handler.engine.compiled.artifacts import MAR_ARTIFACT_DIR, ArtifactPlaces
from handler.engine.engine import Engine
from handler.engine.factory import build_engine
from handler.engine.kernels import build as kernel_build
from handler.resume.records import ExpiryPolicy, ResumeRecords, open_records
from handler.serving.config import ConfigError, HandlerConfig
from handler.serving.continuous_service import ContinuousService
from handler.serving.dynamic_service import DynamicService
from handler.serving.live import Incoming, Reply
from handler.serving.loop_service import LoopService
from handler.serving.metrics import EngineModeGauge, TorchServeSink
from handler.serving.request_fields import MAX_N, Limits
from handler.serving.service import Service
from handler.serving.tools import tool_format

log = logging.getLogger(__name__)

# TorchServe's worker logs this (root logger, INFO) for every message from its frontend: with
# continuous batching that is every decode step, ~60 lines a second at one client, each a write
# to the worker's stdout that the frontend reads and logs again.
PER_MESSAGE_LINE = "Backend received inference at: %d"
# ...and its Service.predict emits PredictionTime (a metric line on stdout, parsed and logged by
# the frontend) for every call: in continuous mode that is one decode step, which
# ts_llm_time_per_output_token_seconds already measures per request.
PER_STEP_METRIC = "[METRICS]PredictionTime."
LAST_EVENT_ID = "last-event-id"  # what an SSE client sends back on reconnect (handler.serving.lifecycle.resume)


def _not_per_message(record: logging.LogRecord) -> bool:
    return record.msg != PER_MESSAGE_LINE


def _not_per_step_metric(record: logging.LogRecord) -> bool:
    return not (isinstance(record.msg, str) and record.msg.startswith(PER_STEP_METRIC))


class LLMHandler(BaseHandler):
    def __init__(self) -> None:
        super().__init__()
        self.service: Service | None = None
        self.awaited = False  # asyncCommunication: TorchServe awaits what handle returns

    def initialize(self, context):
        props = context.system_properties
        try:
            cfg = HandlerConfig.from_model_yaml(context.model_yaml_config, Path(props["model_dir"]), props.get("gpu_id"))
        except ConfigError:
            log.exception("invalid model configuration")
            raise
        sink = TorchServeSink(context.metrics, context.model_name)
        logging.getLogger().addFilter(_not_per_message)
        # Compiled artifacts: the sidecar's restore (or a cold compile's install), then the .mar's.
        places = artifact_places(cfg, Path(props["model_dir"]))
        log.info("compile cache: %s (set handler.compile_cache_dir or TS_LLM_CACHE_DIR to move it)",
                 places.shelf or places.cache_dir or "none: nothing compiled here is kept")
        engine_cfg = cfg.engine
        mode = EngineModeGauge(sink)
        loaded = build_engine(engine_cfg, on_fallback=lambda reason: _served_eager(sink, mode),
                              places=places, on_rejected=lambda: sink.observe("ts_llm_compile_artifacts_rejected_total", 1),
                              on_compiled=lambda seconds: _served_compiled(sink, mode, seconds))
        if loaded.steps.background is None:
            sink.observe("ts_llm_compile_seconds", loaded.steps.compile_seconds)
        mode.started(loaded.steps.serving)
        sink.observe("ts_llm_requests_running", 0)  # a restarted worker must not inherit its predecessor's value
        sink.observe("ts_llm_engine_info", 1, loaded.path)
        sink.observe("ts_llm_engine_threads", loaded.threads.threads, loaded.threads.wait)
        log.info("engine ready: %s, %s, %d slots x %d tokens, compile %.1f s (%s)", engine_cfg.checkpoint_dir.name,
                 loaded.path, engine_cfg.max_batch_size, engine_cfg.max_seq_len, loaded.steps.compile_seconds, loaded.steps.mode)
        limits = Limits(engine_cfg.max_seq_len, cfg.max_new_tokens_cap, cfg.default_max_new_tokens, cfg.served_model_name,
                        min(MAX_N, engine_cfg.max_batch_size), loaded.engine.tokenizer.vocab_size,
                        tool_format(loaded.engine.tokenizer.chat_template), loaded.engine.pages)
        if cfg.batching == "continuous":
            logging.getLogger("ts.metrics.caching_metric").addFilter(_not_per_step_metric)
        self.service = build_service(cfg, loaded.engine, limits, sink)
        self.service.start()
        self.awaited = cfg.batching == "async"
        self.initialized = True

    def handle(self, data, context):
        batch = [_incoming(i, row, context) for i, row in enumerate(data)]
        assert self.service is not None, "handle before initialize"
        send = functools.partial(_send_partial, context=context)
        if self.awaited:  # the engine thread's own error boundary fails what it was running
            return _apply_later(cast("Awaitable[list[Reply]]", self.service.handle(batch, send)), context)
        # One error boundary: bad requests were answered per request inside the service; what
        # reaches here is a server fault, reported for the whole batch.
        try:
            replies = cast("Sequence[Reply | None]", self.service.handle(batch, send))
        except Exception as err:
            log.exception("generation failed")
            self.service.abandon([inc.request_id for inc in batch])
            raise PredictionException(f"generation failed: {type(err).__name__}: {err}", 500) from err
        return _apply(replies, context)


def build_service(cfg: HandlerConfig, engine: Engine, limits: Limits, sink: TorchServeSink) -> Service:
    """The service of cfg.batching over the engine, with the drain flag's and the resume store's hooks."""
    flag = DrainFlag(Path(cfg.drain_flag_file)) if cfg.drain_flag_file else None
    hooks: dict[str, Any] = {"draining": flag.draining if flag else lambda: False,
                             "cutting": flag.cutting if flag else lambda: False, "records": resume_records(cfg),
                             "times_alone": kernel_build.times_alone}
    if cfg.batching == "continuous":
        return ContinuousService(engine, limits, sink, call_seconds=cfg.continuous_call_ms / 1000,
                                 step_ahead=cfg.continuous_step_ahead, **hooks)
    if cfg.batching == "dynamic":
        return DynamicService(engine, limits, sink, **hooks)
    return LoopService(engine, limits, sink, **hooks)


async def _apply_later(replies: Awaitable[list[Reply]], context) -> list[str]:
    """asyncCommunication: the last replies once the engine thread gives them; TorchServe sends
    them (ending each stream)."""
    return _apply(list(await replies), context)


def artifact_places(cfg: HandlerConfig, model_dir: Path) -> ArtifactPlaces:
    """Compiled artifacts: the cache (a shelf of them, or the sidecar's one), then the .mar's own."""
    bundled = model_dir / MAR_ARTIFACT_DIR
    if not cfg.compile_cache_dir:
        return ArtifactPlaces(bundled_dir=bundled)
    if cfg.compile_cache_shelf:
        return ArtifactPlaces(bundled_dir=bundled, shelf=Path(cfg.compile_cache_dir),
                              shelf_limit_bytes=cfg.compile_cache_shelf_mb * 2**20)
    return ArtifactPlaces(Path(cfg.compile_cache_dir), bundled)


def resume_records(cfg: HandlerConfig) -> ResumeRecords | None:
    """Where cut streams' records go (handler.resume); None: no resume store configured."""
    if not cfg.resume_store:
        return None
    records = open_records(cfg.resume_store, ExpiryPolicy(cfg.resume_ttl_s, cfg.resume_max_records),
                           cfg.resume_aws_endpoint_url, cfg.resume_aws_region, cfg.resume_secret_file,
                           cfg.resume_public_key, cfg.resume_signing_key)
    if not records.seal.checks:
        log.warning("resume: records in %s are not sealed: anyone who can write the store could change a resumed "
                    "answer; give every replica the fleet's resume_secret_file", cfg.resume_store)
    if not records.writable:
        log.warning("resume: %s verifies records with resume_public_key and this replica has no resume_signing_key: "
                    "it resumes streams cut elsewhere, and streams cut here are not resumable", records.describe())
    log.info("resume: cut streams leave their records in %s (kept %g s, at most %d)", records.describe(),
             cfg.resume_ttl_s, cfg.resume_max_records)
    return records


def _served_eager(sink: TorchServeSink, mode: EngineModeGauge) -> None:
    sink.observe("ts_llm_compile_eager_fallback_total", 1)
    mode.settled("eager")


def _served_compiled(sink: TorchServeSink, mode: EngineModeGauge, seconds: float) -> None:
    """Called as a background load ends (on its thread), not at the next request: an idle
    replica's gauge says "compiled" as soon as the next step would run compiled."""
    sink.observe("ts_llm_compile_seconds", seconds)
    mode.settled("compiled")


def _incoming(idx: int, row: dict, context) -> Incoming:
    headers = context.request_processor[idx].get_request_properties()
    body = row.get("body", row.get("data")) if row else None
    http = any(k.lower() == "host" for k in headers)  # gRPC requests carry no HTTP headers
    return Incoming(context.get_request_id(idx), body, http, headers.get("url_path", "") or "", _header(headers, LAST_EVENT_ID))


def _header(headers: dict, name: str) -> str | None:
    """An HTTP header's value whatever its case (TorchServe keeps the client's)."""
    value = next((v for k, v in headers.items() if k.lower() == name), None)
    return value.decode("latin-1") if isinstance(value, (bytes, bytearray)) else value


def _apply(replies: Sequence[Reply | None], context) -> list[str]:
    for idx, reply in enumerate(replies):
        if reply is None:
            # Held: TorchServe answers only the ids left in this map (the one its response is built
            # from), so its frontend keeps this request, sends it again next call and its client nothing.
            del context.request_ids[idx]
            continue
        if reply.status != 200:
            context.set_response_status(reply.status, _phrase(reply.status), idx)
        context.set_response_content_type(idx, reply.content_type)
    # TorchServe asks each criterion "is this request done?" to set ts_stream_next ("true": more
    # to come, in continuous mode; "false": the end, which gRPC StreamPredictions needs in every
    # mode); None means a whole (non-chunked) response.
    context.stopping_criteria = [_criterion(None if r is None else r.more) for r in replies]
    return ["" if r is None else r.body for r in replies]


def _criterion(more: bool | None):
    return lambda _output: None if more is None else not more


def _send_partial(partial: dict[int, Reply], context) -> None:
    for idx, reply in partial.items():
        context.set_response_content_type(idx, reply.content_type)
    ids = {idx: context.request_ids[idx] for idx in partial}
    bodies = [partial[idx].body if idx in partial else "" for idx in range(len(context.request_ids))]
    send_intermediate_predict_response(bodies, ids, "Intermediate Prediction success", 200, context)


def _phrase(status: int) -> str:
    return {400: "Bad Request", 404: "Not Found", 410: "Gone", 503: "Service Unavailable"}.get(status, "Error")
