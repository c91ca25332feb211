"""Exceptions raised by the sidecar.

    SidecarError
    ├── ConfigError            bad key, value or combination in the sidecar config
    ├── MetadataError          a metadata service answered something unusable (403, bad JSON)
    │   └── MetadataUnavailable  transient failures (timeouts, 5xx) outlasted the retries
    └── CapacityError          replacement capacity could not be requested

TorchServe's own failures (its management API, stopping it) are handler.torchserve.errors'
TorchServeError, shared with the launcher.

`TransientError` is internal to the retry helper: it marks one failed attempt that is worth
repeating and never escapes `call_with_retry`.
"""


class SidecarError(Exception):
    """Base class for every error the sidecar raises on purpose."""


class ConfigError(SidecarError):
    pass


class MetadataError(SidecarError):
    pass


class MetadataUnavailable(MetadataError):
    pass


class CapacityError(SidecarError):
    pass


class TransientError(SidecarError):
    """One attempt failed in a way that a later attempt may not (timeout, 5xx, throttling)."""
