"""The cache publish: started with the drain, in the background, waited for by the publish step until publish_by.

The publisher itself (app/cache_sync.py) uploads the compile cache; this module only runs it
beside the in-flight wait (start_publish, before the first step) and bounds it: the publish step
waits for it at most until publish_by, so an upload that overruns cannot eat the time the stop
step needs. An abandoned publisher thread is a daemon: it dies with the process.
"""

from __future__ import annotations

from handler.sidecar.background_call import BackgroundCall
from handler.sidecar.drain.deps import DrainDeps
from handler.sidecar.drain.report import DrainReport
from handler.sidecar.errors import SidecarError


def start_publish(report: DrainReport, deps: DrainDeps) -> BackgroundCall[object] | None:
    """Start the publisher now, beside the wait; None when no publish step is planned or the
    notice left no time before publish_by."""
    if "publish" not in report.plan.steps or deps.publish_cache is None:
        return None
    if report.plan.publish_by <= deps.clock():
        return None
    publisher, publish_by = deps.publish_cache, report.plan.publish_by
    return BackgroundCall(lambda: publisher(publish_by), "cache-publish", deps.clock)


def publish(report: DrainReport, deps: DrainDeps, running: BackgroundCall[object] | None) -> None:
    """The publish step: wait for the publish started with the drain, until publish_by."""
    report.published = False
    budget = report.plan.publish_by - deps.clock()
    if running is None:  # never started: the notice came too late for any publish
        _count_upload(deps, "skipped")
        raise SidecarError(f"no time left to publish ({budget:.1f} s)")
    if not running.join(budget):
        _count_upload(deps, "timeout" if budget > 0 else "skipped")
        raise TimeoutError(f"cache publisher still running {report.plan.publish_by - running.started:.1f} s "
                           "after the drain started, at publish_by: abandoned for the stop")
    if running.ended is not None:
        report.publish_seconds = running.ended - running.started
    if running.error is not None:
        _count_upload(deps, "error")
        raise running.error
    report.published = bool(running.result)
    _count_upload(deps, "published" if report.published else "unchanged")


def _count_upload(deps: DrainDeps, outcome: str) -> None:
    if deps.metrics is not None:
        deps.metrics.uploads.labels(outcome=outcome).inc()

