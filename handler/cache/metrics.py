"""Counters the store updates; injected so each test (or process) owns its registry."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter


@dataclass(frozen=True)
class CacheMetrics:
    rejected: Counter  # artifacts that failed verification and were discarded
    downloads: Counter  # artifacts actually downloaded (not found already in place)
    signature_rejected: Counter  # of the rejected: unsigned, or not signed by the configured key
    replaced: Counter  # rejected artifacts this process replaced with one it compiled

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> CacheMetrics:
        """Register the counters in `registry`; a private one when None (nothing exported)."""
        registry = registry if registry is not None else CollectorRegistry()
        return cls(
            rejected=Counter("ts_llm_cache_artifacts_rejected", "Artifacts rejected by verification",
                             registry=registry),
            downloads=Counter("ts_llm_cache_artifact_downloads", "Artifacts downloaded from the store",
                              registry=registry),
            signature_rejected=Counter("ts_llm_cache_manifest_signatures_rejected",
                                       "Artifacts rejected because their manifest is unsigned or wrongly signed",
                                       registry=registry),
            replaced=Counter("ts_llm_cache_artifacts_replaced",
                             "Rejected artifacts replaced in the store by a freshly compiled one",
                             registry=registry),
        )
