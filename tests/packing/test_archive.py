"""archive.sh: a real .mar with the handler, the checkpoint and a generated model-config.yaml."""
import json
import zipfile

import pytest
import yaml

from handler.packing.archive import build_mar
from handler.packing.cli import main
from handler.packing.model_config import ServingOptions


def test_mar_holds_handler_checkpoint_and_model_config(tmp_path, default_checkpoint):
    opts = ServingOptions("continuous", batch_size=8, handler={"dtype": "float32", "max_seq_len": 512})
    mar = build_mar(default_checkpoint, "llm", tmp_path, opts)
    with zipfile.ZipFile(mar) as z:
        names = set(z.namelist())
        manifest = json.loads(z.read("MAR-INF/MANIFEST.json"))
        config = yaml.safe_load(z.read("model-config.yaml"))
    assert {"llm_handler.py", "checkpoint/model.safetensors", "checkpoint/tokenizer.json", "checkpoint/config.json"} <= names
    assert manifest["model"]["handler"] == "llm_handler.py"
    assert config["continuousBatching"] is True and config["batchSize"] == 8
    assert config["handler"] == {"dtype": "float32", "max_seq_len": 512, "max_batch_size": 8}


def test_dynamic_batching_has_no_continuous_key(tmp_path, default_checkpoint):
    mar = build_mar(default_checkpoint, "m", tmp_path, ServingOptions("dynamic", batch_size=4, max_batch_delay_ms=50))
    with zipfile.ZipFile(mar) as z:
        config = yaml.safe_load(z.read("model-config.yaml"))
    assert "continuousBatching" not in config and config["maxBatchDelay"] == 50


def test_cli_reports_a_bad_checkpoint_clearly(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert main(["--checkpoint", str(tmp_path), "--model-store", str(tmp_path / "store")]) == 2
    assert "unsupported architecture model_type='bert'" in capsys.readouterr().err


def test_unknown_batching_mode_is_refused():
    with pytest.raises(ValueError, match="batching must be"):
        ServingOptions("static")


def test_archive_sh_with_an_unknown_cpu_profile_is_a_one_line_error(capsys):
    assert main(["--cpu-profile", "avx3"]) == 2
    assert "archive.sh: error: TS_LLM_CPU_PROFILE='avx3' is not a profile" in capsys.readouterr().err



def test_archive_sh_sets_the_threading(tmp_path, default_checkpoint):
    assert main(["--checkpoint", str(default_checkpoint), "--model-store", str(tmp_path), "--compile", "eager",
                 "--threading", "openmp"]) == 0
    with zipfile.ZipFile(tmp_path / "llm.mar") as z:
        assert yaml.safe_load(z.read("model-config.yaml"))["handler"]["threading"] == "openmp"


def test_archive_sh_sets_the_resume_store_and_its_secret(tmp_path, default_checkpoint):
    # issue 62: the tester had to edit model-config.yaml inside the .mar to turn resume on
    store = tmp_path / "resume"
    assert main(["--checkpoint", str(default_checkpoint), "--model-store", str(tmp_path), "--compile", "eager",
                 "--resume-store", str(store), "--resume-secret-file", "/run/secrets/resume"]) == 0
    with zipfile.ZipFile(tmp_path / "llm.mar") as z:
        handler = yaml.safe_load(z.read("model-config.yaml"))["handler"]
    assert handler["resume_store"] == str(store) and handler["resume_secret_file"] == "/run/secrets/resume"
    assert "resume_signing_key" not in handler and "resume_public_key" not in handler
