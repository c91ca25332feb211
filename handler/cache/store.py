"""The artifact store contract, and publish/fetch built once over per-backend blob primitives.

Stored layout, under a backend's root or prefix:
    <key digest>/blobs/<sha256>     file contents, content-addressed
    <key digest>/manifest.json      written last and never overwritten: its presence marks
                                    a complete artifact

Blobs are named by content so that two publishers racing on one key never overwrite each
other's files with different bytes (compiled code is not byte-reproducible); the loser's
manifest put fails, and the winner's manifest still matches every blob it names.

The one overwrite: a process that rejected a stored artifact (fetch records the manifest's
version, an S3 ETag) and compiled the key itself replaces it (publish(replace=version)) with a
conditional write on that version, so an artifact someone else stored since is never clobbered.
With a signer the stored manifest is signed, with a verifier a fetch refuses one the fleet key
did not sign, before anything else is downloaded (handler.cache.signing).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from handler.cache.errors import ArtifactNotFound, ArtifactVerificationError, ManifestSignatureError
from handler.cache.install import clear_leftovers, install_lock, installed, replace_dir, staging_dir
from handler.cache.key import CacheKey
from handler.cache.manifest import MANIFEST_NAME, FileEntry, Manifest, build_manifest, verify_dir
from handler.cache.metrics import CacheMetrics
from handler.cache.progress import ByteCallback, byte_progress
from handler.cache.signing import Signing, unverified_body

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class PublishResult:
    key_digest: str
    published: bool  # False: an artifact was already there (maybe a concurrent publisher won)
    files: int
    bytes: int
    location: str
    replaced: bool = False  # published over an artifact this process had rejected


@dataclass(frozen=True)
class FetchResult:
    key_digest: str
    dest_dir: Path
    downloaded: bool  # False: already in place, e.g. installed by another worker
    files: int
    bytes: int
    seconds: float


class ArtifactStore(Protocol):
    signing: Signing

    def publish(self, key: CacheKey, src_dir: Path, replace: str | None = None) -> PublishResult: ...
    def fetch(self, key: CacheKey, dest_dir: Path) -> FetchResult: ...
    def exists(self, key: CacheKey) -> bool: ...
    def describe(self) -> str: ...
    def rejected_version(self, key: CacheKey) -> str | None:
        """The version of the stored manifest a fetch of `key` rejected here, if one did."""
    def read_record(self, name: str) -> bytes | None: ...
    def write_record(self, name: str, data: bytes) -> None: ...
    def list_records(self, prefix: str) -> list[tuple[str, float]]: ...
    def delete_record(self, name: str) -> None: ...


def manifest_name(digest: str) -> str:
    return f"{digest}/manifest.json"


def blob_name(digest: str, sha256: str) -> str:
    return f"{digest}/blobs/{sha256}"


class BlobStore(ABC):
    """ArtifactStore over six primitives a backend implements (names are relative to its root)."""

    def __init__(self, *, metrics: CacheMetrics | None = None, progress: bool = True,
                 workers: int = 8, signing: Signing | None = None) -> None:
        assert workers >= 1, workers
        self.metrics = metrics if metrics is not None else CacheMetrics.create()
        self.progress = progress
        self.workers = workers  # files move in parallel: artifacts are often many small files
        self.signing = signing if signing is not None else Signing()
        self._rejected: dict[str, str] = {}  # key digest -> version of the manifest a fetch rejected

    @abstractmethod
    def describe(self) -> str: ...

    @abstractmethod
    def _put_file(self, name: str, src: Path, on_bytes: ByteCallback, overwrite: bool = False) -> bool:
        """Store src under name unless name exists (or regardless, with overwrite); False when it already did."""

    @abstractmethod
    def _put_bytes(self, name: str, data: bytes) -> bool:
        """Store data under name unless name exists; False when it already did."""

    @abstractmethod
    def _overwrite_bytes(self, name: str, data: bytes) -> None:
        """Store data under name, whatever is there."""

    @abstractmethod
    def _replace_bytes(self, name: str, data: bytes, version: str) -> bool:
        """Store data under name only if name holds `version` now; False when it does not."""

    @abstractmethod
    def _get_file(self, name: str, size: int, dest: Path, on_bytes: ByteCallback) -> None:
        """Write the blob to dest; ArtifactNotFound if absent."""

    @abstractmethod
    def _get_bytes(self, name: str) -> tuple[bytes, str]:
        """The blob's content and version (what _replace_bytes compares); ArtifactNotFound if absent."""

    @abstractmethod
    def _version(self, name: str) -> str | None:
        """The blob's version, None if absent."""

    @abstractmethod
    def _list(self, prefix: str) -> list[tuple[str, float]]:
        """(name, unix time written) of every blob whose name starts with prefix."""

    @abstractmethod
    def _delete(self, name: str) -> None:
        """Remove the blob; nothing when it is absent."""

    def _preflight(self) -> None:  # noqa: B027 - an optional hook: most stores have nothing to check
        """Fail with StoreUnavailable before the first operation if the store cannot work."""

    # ---- the contract

    def exists(self, key: CacheKey) -> bool:
        self._preflight()
        return self._version(manifest_name(key.digest())) is not None

    def rejected_version(self, key: CacheKey) -> str | None:
        return self._rejected.get(key.digest())

    # A small record beside the artifacts (the fleet's stop times): data, never code, and
    # overwritten by whoever measured last. `name` must not start with a key digest.

    def read_record(self, name: str) -> bytes | None:
        """The record's bytes; None when there is none."""
        self._preflight()
        try:
            return self._get_bytes(name)[0]
        except ArtifactNotFound:
            return None

    def write_record(self, name: str, data: bytes) -> None:
        self._preflight()
        self._overwrite_bytes(name, data)

    def list_records(self, prefix: str) -> list[tuple[str, float]]:
        """The records whose names start with `prefix` (a folder: "resume/"), each with the unix
        time it was written."""
        self._preflight()
        return self._list(prefix)

    def delete_record(self, name: str) -> None:
        self._preflight()
        self._delete(name)

    def publish(self, key: CacheKey, src_dir: Path, replace: str | None = None) -> PublishResult:
        """`replace`: the version of a stored manifest this process rejected (rejected_version,
        or a restore's record); src_dir's artifact replaces exactly that one, never another."""
        digest = key.digest()
        if replace is None and self.exists(key):  # skip hashing and uploading what is already stored
            return PublishResult(digest, False, 0, 0, self.describe())
        stored = None if replace is None else self._version(manifest_name(digest))
        if stored is not None and stored != replace:  # replaced by someone else since: theirs stands
            return PublishResult(digest, False, 0, 0, self.describe())
        manifest = build_manifest(src_dir, key.describe())
        if not manifest.files:
            raise ValueError(f"{src_dir}: no files to publish")
        unique = {e.sha256: e for e in manifest.files}  # identical files are stored once
        total = sum(e.size for e in unique.values())
        # Replacing, blobs are rewritten: the rejected artifact may have a damaged blob under a
        # name ours shares, and rewriting a content-addressed name with its content harms no one.
        overwrite = stored is not None
        with byte_progress(total, f"upload {digest}", self.progress) as on_bytes:
            self._parallel(lambda e: self._put_file(blob_name(digest, e.sha256), src_dir / e.path, on_bytes,
                                                    overwrite), unique.values())
        data = manifest.to_json() if self.signing.signer is None else self.signing.signer.sign(manifest.to_json())
        # Last: the manifest's presence is what marks the artifact complete.
        if stored is None:
            published = self._put_bytes(manifest_name(digest), data)
        else:
            published = self._replace_bytes(manifest_name(digest), data, stored)
            self._replaced(digest, published)
        return PublishResult(digest, published, len(manifest.files), manifest.total_bytes, self.describe(),
                             replaced=published and stored is not None)

    def _replaced(self, digest: str, replaced: bool) -> None:
        if not replaced:  # another publisher replaced it first: theirs stands
            return
        self._rejected.pop(digest, None)
        self.metrics.replaced.inc()
        log.warning("compile cache: replaced the rejected artifact %s in %s with the one compiled here",
                    digest, self.describe())

    def fetch(self, key: CacheKey, dest_dir: Path) -> FetchResult:
        start = time.monotonic()
        digest = key.digest()
        with install_lock(dest_dir):
            # A waiter that lost the lock race finds the winner's artifact here and skips the
            # download; this path needs no store at all.
            local = installed(dest_dir, key)
            if local is not None:
                return FetchResult(digest, dest_dir, False, len(local.files), local.total_bytes,
                                   time.monotonic() - start)
            clear_leftovers(dest_dir)  # we hold the lock: any staging dir is from a dead process
            self._preflight()
            data, version = self._read_manifest(key)
            try:
                manifest = self._install(key, self._open_manifest(key, data), dest_dir)
            except ArtifactVerificationError as err:
                self._reject(digest, version, err)
                raise
        self.metrics.downloads.inc()
        return FetchResult(digest, dest_dir, True, len(manifest.files), manifest.total_bytes,
                           time.monotonic() - start)

    # ---- fetch steps

    def _install(self, key: CacheKey, manifest: Manifest, dest_dir: Path) -> Manifest:
        with staging_dir(dest_dir) as staged:
            with byte_progress(manifest.total_bytes, f"download {key.digest()}", self.progress) as on_bytes:
                self._parallel(lambda e: self._download(key.digest(), e, staged, on_bytes), manifest.files)
            verify_dir(staged, manifest)
            (staged / MANIFEST_NAME).write_bytes(manifest.to_json())
            replace_dir(staged, dest_dir)
        return manifest

    def _read_manifest(self, key: CacheKey) -> tuple[bytes, str]:
        try:
            return self._get_bytes(manifest_name(key.digest()))
        except ArtifactNotFound as e:
            raise ArtifactNotFound(f"no artifact {key.digest()} in {self.describe()}") from e

    def _open_manifest(self, key: CacheKey, data: bytes) -> Manifest:
        """The signature first (when a public key is configured), over the stored bytes: nothing
        the manifest names is downloaded, and its JSON is not even parsed, before it verifies."""
        verifier = self.signing.verifier
        manifest = Manifest.from_json(unverified_body(data) if verifier is None else verifier.open(data))
        if manifest.key != key.describe():
            raise ArtifactVerificationError(MANIFEST_NAME, f"describes key {manifest.key_digest!r}, "
                                                           f"not {key.digest()!r}")
        return manifest

    def _download(self, digest: str, entry: FileEntry, staged: Path, on_bytes: ByteCallback) -> None:
        dest = staged / entry.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._get_file(blob_name(digest, entry.sha256), entry.size, dest, on_bytes)
        except ArtifactNotFound as e:
            # The manifest promised this blob: the artifact is damaged, not merely absent.
            raise ArtifactVerificationError(entry.path, "listed in manifest but missing from store") from e

    def _reject(self, digest: str, version: str, err: ArtifactVerificationError) -> None:
        self.metrics.rejected.inc()
        if isinstance(err, ManifestSignatureError):
            self.metrics.signature_rejected.inc()
        self._rejected[digest] = version
        log.error("compile cache: REJECTED artifact %s from %s: %s; it was discarded and not installed "
                  "(a replica that compiles this key replaces it in the store)", digest, self.describe(), err)

    def _parallel(self, fn: Callable[[T], object], items: Iterable[T]) -> None:
        """Run fn over items on the worker pool; the first failure cancels the rest and is raised."""
        with ThreadPoolExecutor(self.workers) as pool:
            futures = [pool.submit(fn, item) for item in items]
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for f in pending:
                f.cancel()
            for f in done:
                f.result()
