"""docs/capacity.md's worked example must be what the planner prints for the command shown."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from handler.planner import cli

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "capacity.md"


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```(?:bash)?\n(.*?)```", text, flags=re.S)


def test_placeholder_example_matches_the_planner(monkeypatch, capsys) -> None:
    text = DOC.read_text()
    marker = "Output on the placeholder files:"
    if marker not in text:
        pytest.skip("the worked example has been regenerated from the real results")
    before, after = text.split(marker, 1)
    command = next(b for b in code_blocks(before) if "tests/planner/fixtures" in b)
    expected = code_blocks(after)[0]
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[0] == "ts-llm-plan"
    monkeypatch.chdir(REPO)
    assert cli.main(argv[1:]) == 0
    assert capsys.readouterr().out == expected
