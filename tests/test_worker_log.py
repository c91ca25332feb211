"""Reading a worker's log: the cause of a failed load, not TorchServe's wrapper around it."""
from handler.worker_log import first_cause, first_cause_in

LOG = """\
2026-12-01 07:00:01,000 [INFO ] W-9000-llm_1.0-stdout MODEL_LOG - engine path avx2/bfloat16/packed-float32
2026-12-01 07:00:02,000 [INFO ] W-9000-llm_1.0-stdout MODEL_LOG - Traceback (most recent call last):
2026-12-01 07:00:02,001 [INFO ] W-9000-llm_1.0-stdout MODEL_LOG - RuntimeError: mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert
2026-12-01 07:00:02,002 [INFO ] W-9000-llm_1.0-stdout MODEL_LOG - RuntimeError: 500 - Unknown exception
2026-12-01 07:00:02,003 [INFO ] W-9000-llm_1.0-stdout MODEL_LOG - Backend worker process died.
2026-12-01 07:00:09,002 [INFO ] W-9000-llm_1.0-stdout MODEL_LOG - RuntimeError: 500 - Unknown exception
"""  # noqa: E501 - a worker's log lines as TorchServe writes them
CAUSE = "RuntimeError: mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert"


def test_the_first_real_cause_is_reported_not_torchserves_wrapper():
    assert first_cause(LOG.splitlines()) == CAUSE


def test_module_qualified_exception_types_are_causes():
    line = "x MODEL_LOG - handler.engine.platform.PlatformError: TS_LLM_CPU_PROFILE=avx3 is not a profile"
    assert first_cause([line]) == "handler.engine.platform.PlatformError: TS_LLM_CPU_PROFILE=avx3 is not a profile"


def test_only_wrappers_mean_no_cause():
    assert first_cause(["MODEL_LOG - RuntimeError: 500 - Unknown exception", "Backend worker process died."]) is None


def test_a_log_file_is_read_and_a_missing_one_is_no_cause(tmp_path):
    (tmp_path / "model_log.log").write_text(LOG)
    assert first_cause_in(tmp_path / "model_log.log") == CAUSE
    assert first_cause_in(tmp_path / "absent.log") is None
