"""serve.sh's entry point (handler.serve): errors it answers before starting anything."""
from handler.engine.platform import PROFILE_ENV
from handler.serve import main


def test_serve_sh_with_an_unknown_cpu_profile_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.setenv(PROFILE_ENV, "avx3")
    assert main([]) == 2
    assert "serve.sh: error: TS_LLM_CPU_PROFILE='avx3' is not a profile" in capsys.readouterr().err

