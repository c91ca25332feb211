"""Is this directory a complete artifact for this key? One answer for the three who ask: the
engine before it loads an artifact (every file hashed: an artifact is code), the store before it
downloads one again, and the sidecar before it publishes one (sizes: both only find what an
install hashed, and re-hashing gigabytes at every start would cost what the cache saves)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from handler.cache.errors import ArtifactVerificationError
from handler.cache.key import CacheKey
from handler.cache.manifest import MANIFEST_NAME, Manifest, artifact_files, verify_dir


class Verdict(StrEnum):
    VERIFIED = "verified"
    ABSENT = "absent"  # no artifact there (no manifest)
    OTHER_KEY = "other_key"  # an artifact built for something else: torch, config, weights, CPU
    REJECTED = "rejected"  # the files or the manifest do not hold up: never loaded


@dataclass(frozen=True)
class Checked:
    path: Path
    verdict: Verdict
    # why, when not VERIFIED: for OTHER_KEY the key fields that differ, else "<path> " + detail
    # reads as a sentence
    detail: str = ""
    manifest: Manifest | None = None  # read, unless ABSENT or unreadable

    @property
    def verified(self) -> bool:
        return self.verdict == Verdict.VERIFIED


def check_artifact(path: Path, key: CacheKey, hashes: bool) -> Checked:
    """The manifest's key, then exactly its files, with their sizes (and their SHA-256 with
    `hashes`)."""
    try:
        manifest = Manifest.from_json((path / MANIFEST_NAME).read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        return Checked(path, Verdict.ABSENT)
    except OSError as err:
        return Checked(path, Verdict.REJECTED, f"has a manifest that cannot be read ({err})")
    except ArtifactVerificationError as err:
        return Checked(path, Verdict.REJECTED, f"holds an unusable manifest ({err})")
    if manifest.key_digest != key.digest():
        return Checked(path, Verdict.OTHER_KEY, _key_difference(manifest.key, key), manifest)
    if manifest.key != key.describe():
        return Checked(path, Verdict.REJECTED, "holds a manifest whose key fields do not match its digest", manifest)
    problem = _file_problem(path, manifest, hashes)
    if problem is not None:
        return Checked(path, Verdict.REJECTED, f"does not match its manifest ({problem})", manifest)
    return Checked(path, Verdict.VERIFIED, manifest=manifest)


def _file_problem(path: Path, manifest: Manifest, hashes: bool) -> str | None:
    try:
        present = dict(artifact_files(path))
    except ValueError as err:  # a symlink
        return str(err)
    listed = {entry.path: entry for entry in manifest.files}
    if not listed:
        return "it lists no files"
    odd = sorted(present.keys() ^ listed.keys())
    if odd:
        return f"{odd[0]} is {'not in' if odd[0] in present else 'missing from'} it"
    if hashes:
        try:
            verify_dir(path, manifest)
        except ArtifactVerificationError as err:
            return str(err)
        return None
    for rel, entry in listed.items():
        size = present[rel].stat().st_size
        if size != entry.size:
            return f"{rel}: size {size} != {entry.size}"
    return None


def _key_difference(theirs: dict, ours: CacheKey) -> str:
    mine = ours.describe()
    fields = [f"{k}: {theirs.get(k)!r} != {v!r}" for k, v in mine.items() if k != "digest" and theirs.get(k) != v]
    return "; ".join(fields) or f"digest {theirs.get('digest')!r} != {ours.digest()!r}"
