"""The cache publish: started aside with the drain, waited for by the publish step until publish_by.

The publisher itself (app/cache_sync.py) uploads the compile cache; this module only runs it
beside the in-flight wait (start_publish, before the first step) and bounds it: the publish step
waits for it at most until publish_by, so an upload that overruns cannot eat the time the stop
step needs. An abandoned publisher thread is a daemon: it dies with the process.
"""

from __future__ import annotations

import threading

from handler.sidecar.drain.deps import CachePublisher, DrainDeps
from handler.sidecar.drain.report import DrainReport
from handler.sidecar.errors import SidecarError


class Publishing:
    """One publisher call running in its own thread; its result or error once it ends."""

    def __init__(self, publisher: CachePublisher, publish_by: float, deps: DrainDeps) -> None:
        self._deps = deps
        self.started_epoch = deps.clock()
        self.ended_epoch: float | None = None
        self.result: object = None
        self.error: Exception | None = None
        self._thread = threading.Thread(target=self._run, args=(publisher, publish_by),
                                        name="cache-publish", daemon=True)
        self._thread.start()

    def _run(self, publisher: CachePublisher, publish_by: float) -> None:
        try:
            self.result = publisher(publish_by)
        except Exception as err:  # crosses the thread; the publish step re-raises it
            self.error = err
        finally:
            self.ended_epoch = self._deps.clock()

    def join(self, timeout_s: float) -> bool:
        """True once the publisher has returned (or raised)."""
        self._thread.join(max(timeout_s, 0.0))
        return not self._thread.is_alive()


def start_publish(report: DrainReport, deps: DrainDeps) -> Publishing | None:
    """Start the publisher now, beside the wait; None when no publish step is planned or the
    notice left no time before publish_by."""
    if "publish" not in report.plan.steps or deps.publish_cache is None:
        return None
    if report.plan.publish_by <= deps.clock():
        return None
    return Publishing(deps.publish_cache, report.plan.publish_by, deps)


def publish(report: DrainReport, deps: DrainDeps, running: Publishing | None) -> None:
    """The publish step: wait for the publish started with the drain, until publish_by."""
    report.published = False
    budget = report.plan.publish_by - deps.clock()
    if running is None:  # never started: the notice came too late for any publish
        _count_upload(deps, "skipped")
        raise SidecarError(f"no time left to publish ({budget:.1f} s)")
    if not running.join(budget):
        _count_upload(deps, "timeout" if budget > 0 else "skipped")
        raise TimeoutError(f"cache publisher still running {report.plan.publish_by - running.started_epoch:.1f} s "
                           "after the drain started, at publish_by: abandoned for the stop")
    if running.ended_epoch is not None:
        report.publish_seconds = running.ended_epoch - running.started_epoch
    if running.error is not None:
        _count_upload(deps, "error")
        raise running.error
    report.published = bool(running.result)
    _count_upload(deps, "published" if report.published else "unchanged")


def _count_upload(deps: DrainDeps, outcome: str) -> None:
    if deps.metrics is not None:
        deps.metrics.uploads.labels(outcome=outcome).inc()

