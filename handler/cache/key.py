"""The cache key: everything that decides whether a compile artifact is valid here.

A compiled artifact is code generated for one torch/Triton build, one device, one set of
weights and one engine configuration. Any difference must land in a different key, or a
worker would load code built for something else.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

DISTRIBUTION = "ts-llm-spot"
# Bump when the stored layout or manifest format changes, so old artifacts stop matching.
KEY_SCHEMA = 1
DIGEST_CHARS = 16  # 64 bits: the prefix only has to separate a handful of live artifacts
_CHUNK = 1 << 20
# The key as a file (CacheKey.describe() JSON): written inside each artifact a worker installs
# (listed in its manifest) and by the pod's key step; the sidecar reads <cache_dir>/KEY_FILE_NAME
# by default, so it finds the key of what it restores or publishes.
KEY_FILE_NAME = "cache-key.json"


@dataclass(frozen=True)
class CacheKey:
    torch_version: str
    triton_version: str  # "none" when Triton is not importable (CPU-only builds)
    device_type: str  # "cpu" | "cuda"
    device_capability: str  # CPU: "x86_64 AVX512"; CUDA: "sm_90 NVIDIA H200"
    weights_digest: str
    config_digest: str
    package_version: str
    schema: int = KEY_SCHEMA

    def digest(self) -> str:
        """Short hex digest of every field; the storage prefix of the artifact."""
        return sha256_json(dataclasses.asdict(self))[:DIGEST_CHARS]

    def describe(self) -> dict[str, Any]:
        """The fields plus the digest, for logs and the manifest."""
        return {**dataclasses.asdict(self), "digest": self.digest()}


def sha256_json(value: Any) -> str:
    """SHA-256 of canonical JSON, so key order and whitespace never change a digest."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def digest_files(paths: Iterable[Path]) -> str:
    """One SHA-256 over several files (e.g. the weight shards), streamed, independent of order.

    Each file contributes its name, size and content digest, so renaming or swapping two
    shards changes the result; directories above the file do not, so the digest is the
    same on every machine.
    """
    h = hashlib.sha256()
    for path in sorted((Path(p) for p in paths), key=lambda p: (p.name, str(p))):
        h.update(f"{path.name}\0{path.stat().st_size}\0{sha256_file(path)}\n".encode())
    return h.hexdigest()


def torch_version() -> str:
    import torch  # lazy: the store and its tests must not pay for importing torch

    return str(torch.__version__)


def triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "none"
    return str(triton.__version__)


def device_capability(device: str) -> tuple[str, str]:
    """(device type, capability summary) for "cpu", "cuda" or "cuda:N"."""
    import torch

    dev = torch.device(device)
    if dev.type == "cpu":
        # Inductor's CPU code is specialised for the vector ISA it detects.
        return "cpu", f"{platform.machine()} {torch.backends.cpu.get_cpu_capability()}"
    if dev.type == "cuda":
        # The index is left out on purpose: an artifact is valid on any GPU of the same model.
        major, minor = torch.cuda.get_device_capability(dev)
        return "cuda", f"sm_{major}{minor} {torch.cuda.get_device_name(dev)}"
    raise ValueError(f"unsupported device {device!r}: expected 'cpu' or 'cuda[:N]'")


def package_version(version: str | None = None) -> str:
    """The installed ts-llm-spot version; `version` is used only when it is not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError as e:
        if version is None:
            raise metadata.PackageNotFoundError(
                f"{DISTRIBUTION} is not installed, so the cache key has no package version: "
                "install it (pip install -e .) or pass version="
            ) from e
        return version


def current_key(
    weights_digest: str, config: dict[str, Any], device: str, *, version: str | None = None
) -> CacheKey:
    """The key for this process: versions and device read now, weights and config from the caller."""
    device_type, capability = device_capability(device)
    return CacheKey(
        torch_version=torch_version(),
        triton_version=triton_version(),
        device_type=device_type,
        device_capability=capability,
        weights_digest=weights_digest,
        config_digest=sha256_json(config),
        package_version=package_version(version),
    )
