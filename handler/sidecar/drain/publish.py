"""The publish step: the cache publisher, run aside and abandoned at publish_by.

The publisher itself (app/cache_sync.py) uploads the compile cache; this step only bounds it,
so an upload that overruns cannot eat the time the stop step needs.
"""

from __future__ import annotations

import threading

from handler.sidecar.drain.deps import CachePublisher, DrainDeps
from handler.sidecar.drain.report import DrainReport
from handler.sidecar.errors import SidecarError


def publish(report: DrainReport, deps: DrainDeps) -> None:
    assert deps.publish_cache is not None, "publish step planned without a publisher"
    report.published = False
    budget = report.plan.publish_by - deps.clock()
    if budget <= 0:
        _count_upload(deps, "skipped")
        raise SidecarError(f"no time left to publish ({budget:.1f} s)")
    outcome: dict[str, object] = {}
    # The publisher cannot be interrupted; run it aside so its overrun cannot eat the stop.
    worker = threading.Thread(target=_call_publisher, name="cache-publish", daemon=True,
                              args=(deps.publish_cache, report.plan.publish_by, outcome))
    worker.start()
    worker.join(budget)
    if worker.is_alive():
        _count_upload(deps, "timeout")
        raise TimeoutError(f"cache publisher still running after {budget:.1f} s")
    if "error" in outcome:
        _count_upload(deps, "error")
        raise outcome["error"]  # type: ignore[misc]
    report.published = bool(outcome.get("result"))
    _count_upload(deps, "published" if report.published else "unchanged")


def _call_publisher(publisher: CachePublisher, publish_by: float, out: dict[str, object]) -> None:
    try:
        out["result"] = publisher(publish_by)
    except Exception as err:  # crosses the thread; publish re-raises it
        out["error"] = err


def _count_upload(deps: DrainDeps, outcome: str) -> None:
    if deps.metrics is not None:
        deps.metrics.uploads.labels(outcome=outcome).inc()
