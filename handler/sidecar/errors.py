"""Exceptions raised by the sidecar.

    SidecarError
    ├── MetadataError          a metadata service answered something unusable (403, bad JSON)
    │   └── MetadataUnavailable  transient failures (timeouts, 5xx) outlasted the retries
    └── CapacityError          replacement capacity could not be requested

TorchServe's own failures (its management API, stopping it) are handler.torchserve.errors'
TorchServeError, shared with the launcher.

`ConfigError` (a bad key, value or combination in the sidecar config) is the package's one
config error, handler.typed_config.ConfigError (a ValueError, not a SidecarError), re-exported.

`TransientError` is internal to the retry helper: it marks one failed attempt that is worth
repeating and never escapes `call_with_retry`.
"""

from handler.typed_config import ConfigError

__all__ = ["CapacityError", "ConfigError", "MetadataError", "MetadataUnavailable", "SidecarError", "TransientError"]


class SidecarError(Exception):
    """Base class for every error the sidecar raises on purpose."""


class MetadataError(SidecarError):
    pass


class MetadataUnavailable(MetadataError):
    pass


class CapacityError(SidecarError):
    pass


class TransientError(SidecarError):
    """One attempt failed in a way that a later attempt may not (timeout, 5xx, throttling)."""
