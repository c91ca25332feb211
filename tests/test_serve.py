"""serve.sh's entry point (handler.serve): errors it answers before starting anything."""
from handler.engine.compiled.warm_start import SWITCHED
from handler.engine.platform import PROFILE_ENV
from handler.serve import compile_status, main


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
