"""The handler drops TorchServe's per-message log line (one a decode step) and nothing else."""
import logging

from handler.serving.llm_handler import PER_MESSAGE_LINE, _not_per_message


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
