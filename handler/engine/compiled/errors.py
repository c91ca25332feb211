"""How a failed compile or artifact load is raised and reported, wherever it happens: as the
steps are chosen (handler.engine.compiled.steps), in the background load (warm_start), or when
the compile process fails (in_background.wait_for_compile).
"""
from __future__ import annotations

from handler.engine import EngineError


class CompileError(EngineError, RuntimeError):
    """Compiling or loading the compiled model failed and the configuration does not allow
    eager serving (on_compile_error: raise)."""


def failure_reason(err: BaseException) -> str:
    """`Type: first line of the message`: what a compile or load failure is logged and counted as."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"
