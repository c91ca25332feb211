"""The sidecar's fleet keys: cache_public_key and cache_signing_key into handler.cache.signing.

With a public key every manifest restored from the store must carry a signature by it
(handler.cache.store refuses the rest, counted and logged). Without one, a store is trusted as
far as SHA-256 against its own manifests goes, which stops corruption, not a writer: this is
said at WARNING wherever a store is opened, so nobody mistakes it for signed artifacts. A pod
that verifies but holds no signing key does not publish: every verifying replica would refuse
what it stored.
"""
from __future__ import annotations

import logging

from handler.cache.errors import SigningKeyError
from handler.cache.signing import Signing
from handler.sidecar.config import SidecarConfig
from handler.sidecar.errors import ConfigError

log = logging.getLogger(__name__)

UNVERIFIED = ("compile cache: no cache_public_key: artifacts from %s are ONLY hash-checked against a manifest "
              "from the same store, so whoever can write it can run code on this replica; set "
              "cache_public_key (./archive.sh keygen) to refuse manifests the fleet key did not sign")
NO_SIGNER = ("compile cache: cache_public_key is set but cache_signing_key is not: this pod verifies "
             "artifacts and does not publish (what it compiles stays local; builds publish with "
             "./archive.sh --aot-store --signing-key)")


def load_signing(config: SidecarConfig) -> Signing:
    """The keys the config names, read now (a bad key file is a ConfigError: exit 2)."""
    try:
        signing = Signing.from_files(config.cache_signing_key, config.cache_public_key)
    except SigningKeyError as err:
        raise ConfigError(str(err)) from err
    if signing.verifier is None and config.cache_store:
        log.warning(UNVERIFIED, config.cache_store)
    elif signing.verifier is not None:
        log.info("compile cache: manifests must be signed by key %s (%s)", signing.verifier.key_id,
                 config.cache_public_key)
    return signing


def may_publish(signing: Signing) -> bool:
    """False (and said) when nothing this pod publishes would pass its own verification."""
    if signing.verifier is not None and signing.signer is None:
        log.warning("%s", NO_SIGNER)
        return False
    return True
