"""The engine's exception tree: one root (handler.engine.EngineError) under every error it defines."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import handler.engine
from handler.engine import EngineError
from handler.engine.checkpoint import CheckpointError
from handler.engine.engine import EngineFull


def engine_exceptions() -> dict[str, type]:
    found = {}
    for info in pkgutil.walk_packages(handler.engine.__path__, "handler.engine."):
        module = importlib.import_module(info.name)
        for name, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == info.name:
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_engine_error_derives_from_engine_error() -> None:
    errors = engine_exceptions()
    assert len(errors) >= 11
    assert [name for name, cls in errors.items() if not issubclass(cls, EngineError)] == []


def test_engine_errors_keep_their_builtin_kind() -> None:
    assert issubclass(CheckpointError, ValueError) and issubclass(EngineFull, RuntimeError)
