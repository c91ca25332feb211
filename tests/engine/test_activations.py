"""`activations`: the default model on its default path (fine activations, dtype auto) answers as
its unrounded self; the unrounded answers are bench/answers.py's, recorded in tests/fixtures."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.answers import answers, questions
from handler.engine.config import EngineConfig

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "answers_reference.json"


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    return json.loads(FIXTURE.read_text())["tokens"]


def _answers(checkpoint: Path, **settings) -> list[list[int]]:
    texts = questions()
    got, _ = answers(EngineConfig(checkpoint, compile="eager", max_batch_size=len(texts), max_seq_len=256, **settings),
                     texts)
    return got


def test_the_default_path_answers_as_the_unrounded_model(default_checkpoint, reference):
    got = _answers(default_checkpoint)
    assert got[0] == reference[0]  # the README demo: "The capital of France is Paris."
    assert sum(a == b for a, b in zip(got[1:], reference[1:])) >= 19


def test_rounding_once_answers_otherwise(default_checkpoint, reference):
    # what `fine` is for: with x rounded once the same prompts drift (the test above would catch
    # a second round that did nothing)
    got = _answers(default_checkpoint, activations="int8")
    assert sum(a == b for a, b in zip(got, reference)) < 19
