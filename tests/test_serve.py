"""serve.sh's entry point (handler.serve): errors it answers before starting anything, and --help."""
import os
import shutil
import subprocess
from pathlib import Path

from handler.engine.compiled.warm_start import SWITCHED
from handler.engine.platform import PROFILE_ENV
from handler.serve import compile_status, main

REPO = Path(__file__).resolve().parents[1]


def test_serve_sh_with_an_unknown_cpu_profile_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.setenv(PROFILE_ENV, "avx3")
    assert main([]) == 2
    assert "serve.sh: error: TS_LLM_CPU_PROFILE='avx3' is not a profile" in capsys.readouterr().err



def test_compile_status_names_the_latest_graph_compiling():
    log = ("2026 compile process: INFO handler.engine.compiled.aot: aot: compiling graph 1 of 4 (prefill); a time estimate follows\n"
           "2026 compile process: INFO handler.engine.compiled.aot: aot: compiling graph 2 of 4 (decode); about 3 min left\n")
    status = compile_status(log)
    assert status.startswith("Serving eager steps while the compile runs: compiling graph 2 of 4 (decode); about 3 min left.")


def test_compile_status_says_when_compiled_steps_serve():
    assert compile_status(f"... compiling graph 4 of 4 ...\n... {SWITCHED}\n") == "Compiled steps are serving."


def test_serve_sh_help_runs_on_a_bare_python_and_builds_nothing(tmp_path):
    # serve.sh and the one module its --help runs, alone: no .venv, no model_store, no package installed
    (tmp_path / "handler").mkdir()
    for name in ("serve.sh", "handler/__init__.py", "handler/serve.py"):
        shutil.copy(REPO / name, tmp_path / name)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    done = subprocess.run(["bash", "serve.sh", "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"]})
    assert done.returncode == 0, done.stderr
    assert "--model-name" in done.stdout
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "__pycache__" not in p.parts)
    assert after == before


def test_serve_sh_with_a_model_name_never_built_says_how_to_build_it(tmp_path, capsys):
    assert main(["--model-store", str(tmp_path), "--model-name", "base"]) == 2
    assert f"{tmp_path}/base.mar not found: build it first (./archive.sh --checkpoint DIR --model-name base)" \
        in capsys.readouterr().err
