"""The manifest: every file of an artifact with its size and SHA-256.

A manifest read from a store is untrusted input (the artifact it describes is code that
will run), so parsing rejects anything that could escape the artifact directory or name
an object outside it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from handler.cache.errors import ArtifactVerificationError
from handler.cache.key import sha256_file

SCHEMA = 1
# The installed copy of the manifest lives inside the artifact directory under this name;
# it is not part of the artifact itself.
MANIFEST_NAME = ".artifact-manifest.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative, POSIX separators
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    key: dict[str, Any]  # CacheKey.describe()
    files: tuple[FileEntry, ...]
    created: str  # ISO 8601, UTC
    schema: int = SCHEMA

    @property
    def key_digest(self) -> str:
        return str(self.key.get("digest", ""))

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> bytes:
        doc = {"schema": self.schema, "created": self.created, "key": self.key,
               "files": [asdict(f) for f in self.files]}
        return json.dumps(doc, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        try:
            doc = json.loads(data)
            files = tuple(_parse_entry(e) for e in doc["files"])
            manifest = cls(key=dict(doc["key"]), files=files, created=str(doc["created"]),
                           schema=int(doc["schema"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ArtifactVerificationError(MANIFEST_NAME, f"malformed manifest ({e})") from e
        if manifest.schema != SCHEMA:
            raise ArtifactVerificationError(MANIFEST_NAME, f"unknown schema {manifest.schema}")
        _reject_duplicates(manifest.files)
        return manifest


def _parse_entry(raw: dict[str, Any]) -> FileEntry:
    entry = FileEntry(path=str(raw["path"]), size=int(raw["size"]), sha256=str(raw["sha256"]))
    if not _is_safe_relative(entry.path):
        raise ArtifactVerificationError(entry.path, "unsafe path in manifest")
    if entry.size < 0 or not _SHA256.fullmatch(entry.sha256):
        raise ArtifactVerificationError(entry.path, "invalid size or sha256 in manifest")
    return entry


def _is_safe_relative(path: str) -> bool:
    p = PurePosixPath(path)
    return (bool(path) and "\\" not in path and not p.is_absolute()
            and all(part not in ("", ".", "..") for part in path.split("/"))
            and path != MANIFEST_NAME)


def _reject_duplicates(files: tuple[FileEntry, ...]) -> None:
    seen: set[str] = set()
    for f in files:
        if f.path in seen:
            raise ArtifactVerificationError(f.path, "listed twice in manifest")
        seen.add(f.path)


def artifact_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(relative POSIX path, path) of every artifact file under root, sorted."""
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            # A link could point anywhere on the publisher's disk; refuse rather than follow.
            raise ValueError(f"{path}: symlinks cannot be part of an artifact")
        rel = path.relative_to(root).as_posix()
        if path.is_file() and rel != MANIFEST_NAME:
            yield rel, path


def build_manifest(root: Path, key: dict[str, Any]) -> Manifest:
    files = tuple(FileEntry(rel, p.stat().st_size, sha256_file(p)) for rel, p in artifact_files(root))
    created = datetime.now(UTC).isoformat(timespec="seconds")
    return Manifest(key=key, files=files, created=created)


def verify_dir(root: Path, manifest: Manifest) -> None:
    """Raise ArtifactVerificationError naming the first file that differs from the manifest."""
    actual = dict(artifact_files(root))
    expected = {f.path: f for f in manifest.files}
    missing = sorted(expected.keys() - actual.keys())
    if missing:
        raise ArtifactVerificationError(missing[0], "missing")
    extra = sorted(actual.keys() - expected.keys())
    if extra:
        raise ArtifactVerificationError(extra[0], "not in manifest")
    for entry in manifest.files:
        _verify_file(actual[entry.path], entry)


def _verify_file(path: Path, entry: FileEntry) -> None:
    size = path.stat().st_size
    if size != entry.size:  # cheap check first: a truncated download needs no hashing
        raise ArtifactVerificationError(entry.path, f"size {size} != {entry.size} in manifest")
    digest = sha256_file(path)
    if digest != entry.sha256:
        raise ArtifactVerificationError(entry.path, f"sha256 {digest} != {entry.sha256} in manifest")
