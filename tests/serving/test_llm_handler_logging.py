"""The handler drops TorchServe's per-message log line and per-call PredictionTime metric (one each
a decode step in continuous mode) and nothing else."""
import logging

from ts.metrics.caching_metric import CachingMetric
from ts.metrics.metric_type_enum import MetricTypes

from handler.serving.llm_handler import PER_MESSAGE_LINE, _not_per_message, _not_per_step_metric


def test_the_per_message_line_is_dropped_and_other_lines_kept(caplog):
    root = logging.getLogger()
    root.addFilter(_not_per_message)
    try:
        with caplog.at_level(logging.INFO):
            logging.info(PER_MESSAGE_LINE, 1796186650)  # as ts/protocol/otf_message_handler.py logs it
            logging.info("Backend received inference at: %s", "another format")
            logging.info("model_name: %s, batchSize: %d", "llm", 16)
    finally:
        root.removeFilter(_not_per_message)
    assert [r.getMessage() for r in caplog.records] == ["Backend received inference at: another format",
                                                        "model_name: llm, batchSize: 16"]


def test_the_per_step_prediction_time_is_dropped_and_other_metrics_kept(caplog):
    # TorchServe's metric lines, emitted as its worker emits them (this logger, pre-formatted text).
    logger = logging.getLogger("ts.metrics.caching_metric")
    logger.addFilter(_not_per_step_metric)
    try:
        with caplog.at_level(logging.INFO, logger=logger.name):
            for name in ("PredictionTime", "ts_llm_generation_tokens_total"):
                metric = CachingMetric(name, "ms", ["ModelName"], MetricTypes.GAUGE)
                metric.add_or_update(7.5, ["llm"])
    finally:
        logger.removeFilter(_not_per_step_metric)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["[METRICS]ts_llm_generation_tokens_total.Milliseconds"]
