"""The docs keep up with the code: every setting documented, every request error explained,
every relative link alive. Fast: reads source and Markdown only, starts nothing."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from handler.serving.config import SECTION_KEYS
from handler.sidecar.config import SidecarConfig

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
CONFIGURATION = DOCS / "configuration.md"
TROUBLESHOOTING = DOCS / "troubleshooting.md"
PROTOCOL = REPO / "handler" / "serving" / "protocol.py"
# Where the answers to a request are raised: the parser, and the resume of a cut stream.
REQUEST_ERROR_SOURCES = [PROTOCOL, REPO / "handler" / "serving" / "lifecycle" / "resume.py", REPO / "handler" / "resume" / "ids.py",
                         REPO / "handler" / "resume" / "records.py"]
REQUEST_ERRORS = {"RequestError", "ResumeIdError", "RecordNotFound", "RecordExpired", "RecordRefused", "StoreFailed"}

# Literal pieces of an f-string message shorter than this ("`", ", got ") say nothing alone.
MIN_SEGMENT = 12


def squash(text: str) -> str:
    """Whitespace-insensitive text, so a message may wrap in the Markdown source."""
    return re.sub(r"\s+", " ", text)


# ---- settings ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [*SECTION_KEYS, "batching"])
def test_every_handler_key_is_documented(name: str) -> None:
    assert f"`{name}`" in CONFIGURATION.read_text(), f"handler.{name} is missing from docs/configuration.md"


@pytest.mark.parametrize("field", dataclasses.fields(SidecarConfig), ids=lambda f: f.name)
def test_every_sidecar_key_and_flag_is_documented(field: dataclasses.Field) -> None:
    text = CONFIGURATION.read_text()
    flag = "--" + field.name.replace("_", "-")
    assert f"`{field.name}`" in text, f"SidecarConfig.{field.name} is missing from docs/configuration.md"
    assert f"`{flag}`" in text, f"the flag {flag} is missing from docs/configuration.md"


# ---- request errors ------------------------------------------------------------------------

def request_error_messages() -> list[tuple[str, list[str]]]:
    """(file:line, literal segments) of every `raise RequestError(<str or f-string>)` (and the
    resume's errors, REQUEST_ERRORS) in REQUEST_ERROR_SOURCES."""
    found = []
    for source in REQUEST_ERROR_SOURCES:
        for node in ast.walk(ast.parse(source.read_text())):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            func = node.exc.func
            if not (isinstance(func, ast.Name) and func.id in REQUEST_ERRORS) or not node.exc.args:
                continue
            message, where = node.exc.args[0], f"{source.name}:{node.lineno}"
            if isinstance(message, ast.Constant) and isinstance(message.value, str):
                found.append((where, [message.value]))
            elif isinstance(message, ast.JoinedStr):
                found.append((where, [v.value for v in message.values if isinstance(v, ast.Constant)]))
            # Anything else (str(err)) passes another module's message on; nothing literal here.
    return found


def test_protocol_raises_request_errors() -> None:
    assert len(request_error_messages()) >= 20  # the parser above still finds them


@pytest.mark.parametrize("line, segments", request_error_messages(), ids=[w for w, _ in request_error_messages()])
def test_every_request_error_is_explained(line: str, segments: list[str]) -> None:
    docs = squash(TROUBLESHOOTING.read_text() + CONFIGURATION.read_text())
    checked = [s for s in (squash(p).strip() for p in segments) if len(s) >= MIN_SEGMENT]
    for segment in checked:
        assert segment in docs, (f"{line}: the message text {segment!r} is in neither "
                                 "docs/troubleshooting.md nor docs/configuration.md")


# ---- compile cache errors ------------------------------------------------------------------

CACHE_ERROR_SOURCES = {
    "handler/cache/s3.py": "StoreUnavailable",
    "handler/cache/local.py": "StoreUnavailable",
    "handler/sidecar/app/cache_sync.py": "ArtifactDirError",
}


def cache_error_messages() -> list[tuple[str, list[str]]]:
    """(file:line, literal segments) of every StoreUnavailable / ArtifactDirError built from a
    literal or an f-string (raised or returned)."""
    found = []
    for rel, name in CACHE_ERROR_SOURCES.items():
        for node in ast.walk(ast.parse((REPO / rel).read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == name and node.args):
                continue
            message = node.args[0]
            if isinstance(message, ast.Constant) and isinstance(message.value, str):
                found.append((f"{rel}:{node.lineno}", [message.value]))
            elif isinstance(message, ast.JoinedStr):
                found.append((f"{rel}:{node.lineno}",
                              [v.value for v in message.values if isinstance(v, ast.Constant)]))
    return found


def test_cache_errors_are_found() -> None:
    assert len(cache_error_messages()) >= 12  # the parser above still finds them


@pytest.mark.parametrize("where, segments", cache_error_messages(),
                         ids=[w for w, _ in cache_error_messages()])
def test_every_cache_error_is_explained(where: str, segments: list[str]) -> None:
    docs = squash(TROUBLESHOOTING.read_text())
    for segment in (s for s in (squash(p).strip() for p in segments) if len(s) >= MIN_SEGMENT):
        assert segment in docs, f"{where}: {segment!r} is not in docs/troubleshooting.md"


def test_no_setting_the_code_does_not_have_is_named() -> None:
    text = TROUBLESHOOTING.read_text() + CONFIGURATION.read_text()
    assert not re.search(r"cache\.(s3_\w+|local_dir)", text)


# ---- links -----------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.M)}


def relative_links() -> list[tuple[str, str]]:
    out = []
    for doc in sorted(DOCS.glob("*.md")):
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for m in LINK.finditer(text):
            target = m.group(1) or m.group(2)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                out.append((doc.name, target))
    return out


def test_docs_have_relative_links() -> None:
    assert relative_links()


@pytest.mark.parametrize("doc, target", relative_links())
def test_relative_link_resolves(doc: str, target: str) -> None:
    path, _, anchor = target.partition("#")
    file = (DOCS / path).resolve() if path else DOCS / doc
    assert file.exists(), f"docs/{doc}: link to {target} points to a missing file"
    if anchor and file.suffix == ".md":
        assert anchor in anchors(file), f"docs/{doc}: link to {target}: no such heading in {file.name}"
