"""The `watch` loop: watchers in threads, /ready /live /metrics /drain, one drain on notice.

    with Sidecar(config, Hooks(in_flight=..., publish_cache=...)) as sidecar:
        report = sidecar.run()          # blocks until a notice was drained (or `until` is set)

With a cache store configured, the sidecar also exports the restore step's outcome (read from
its record beside the cache dir) and publishes once, as soon as TorchServe is first ready, an
artifact the store lacks: a cold start's artifact reaches the store then, not only when this pod
drains. The drain publishes again (a no-op when the store has it).

When nobody here stops TorchServe (stop_method none, no stop hook: a sidecar container next to
TorchServe's), `run` keeps serving after the drain (/ready 503, /drain done) until SIGTERM, so
the preStop `drain --wait` sees the result and a native sidecar is not restarted mid-shutdown.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from handler.cache import CacheMetrics
from handler.sidecar.app import cache_sync, fleet_stop, wiring
from handler.sidecar.app.restore_record import read_restore_record
from handler.sidecar.config import SidecarConfig, StopMethod
from handler.sidecar.drain import admission
from handler.sidecar.drain.control import DrainControl
from handler.sidecar.drain.deps import CachePublisher, DrainDeps
from handler.sidecar.drain.plan import DrainPolicy, budget_warning
from handler.sidecar.drain.report import DrainReport
from handler.sidecar.drain.run import run_drain
from handler.sidecar.endpoints.readiness import Readiness
from handler.sidecar.endpoints.replica_load import LoadCollector
from handler.sidecar.endpoints.server import SidecarHttpServer
from handler.sidecar.endpoints.sidecar_metrics import SidecarMetrics
from handler.sidecar.errors import MetadataError, SidecarError
from handler.sidecar.notice.board import NoticeBoard
from handler.sidecar.notice.signals import SignalWatcher
from handler.sidecar.notice.termination import Clock, NoticeKind, TerminationNotice, should_drain
from handler.sidecar.notice.watcher import run_watcher
from handler.torchserve.client import TorchServeClient
from handler.torchserve.errors import TorchServeError

log = logging.getLogger(__name__)

# How long the fleet stop record's write may take when the pod's SIGTERM ends the linger (the
# pod's grace has what TorchServe's container left of it).
SHARE_AFTER_LINGER_S = 3.0

@dataclass(frozen=True)
class Hooks:
    """What the serving side plugs in; every field is optional."""

    in_flight: Callable[[], int] | None = None  # else config.metrics_url, else queue only
    publish_cache: CachePublisher | None = None  # publish_cache(publish_by_epoch) -> uploaded?
    close_admission: Callable[[], None] | None = None  # else config.drain_flag_file
    stop_torchserve: Callable[[float], None] | None = None  # overrides config.stop_method
    torchserve_pid: Callable[[], int] | None = None  # the root of TorchServe's process tree, when started here


class Sidecar:
    def __init__(self, config: SidecarConfig, hooks: Hooks = Hooks(), *, clock: Clock = time.time,
                 sleep: Callable[[float], None] = time.sleep,
                 registry: CollectorRegistry | None = None) -> None:
        self.config, self.hooks, self._clock, self._sleep = config, hooks, clock, sleep
        self.registry = registry or CollectorRegistry()
        self.metrics = SidecarMetrics(self.registry)
        self.board = NoticeBoard(config.drain_on_rebalance)
        self.board.add_listener(self._on_posted)
        key_file = Path(config.key_file) if config.key_file else None
        self.torchserve = TorchServeClient(config.management_url, config.model_name,
                                           key_file=key_file, timeout_s=config.http_timeout_s)
        self.signals = SignalWatcher(clock=clock, grace_s=config.signal_grace_s)
        self.watchers = wiring.build_watchers(config, clock)
        self._stop = threading.Event()
        self._signalled = threading.Event()
        self._threads: list[threading.Thread] = []
        self._running = False
        self._deregister: Callable[[], None] | None = None
        self._autoscaling: Any = None
        # The store's counters (rejections, downloads) on this registry, when there is a store.
        self.cache_metrics = (CacheMetrics.create(self.registry)
                              if config.cache_store else None)
        self._publisher = (hooks.publish_cache
                           or wiring.config_publisher(config, self.cache_metrics))
        self._in_flight = hooks.in_flight or wiring.config_running(config)
        # The fleet's stop record beside the cache: read by any replica with a store, written
        # only by one that may publish to it.
        self.stops = fleet_stop.MeasuredStops(wiring.stop_record_path(config),
                                              wiring.fleet_store(config, self._publisher),
                                              isinstance(self._publisher, cache_sync.Publisher), clock)
        self._close_admission = hooks.close_admission or wiring.config_closer(config, clock)
        self.control = DrainControl(self.board, clock, config.signal_grace_s)
        self.registry.register(LoadCollector(config.model_name, self.torchserve, self._in_flight))
        self.http = SidecarHttpServer(config.listen_host, config.listen_port,
                                      Readiness(self.board, self.torchserve, self.metrics,
                                                wiring.worker_error(config.model_log)),
                                      lambda: self._running, self.registry, self.control)

    def __enter__(self) -> Sidecar:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Sidecar:
        # Resolved now, not at notice time: boto3 clients take a moment to build and the
        # instance id needs IMDS, neither of which should eat into a 30 s deadline.
        self._deregister = wiring.deregisterer(self.config, self.watchers)
        if self.config.drain_flag_file and admission.clear_flag(Path(self.config.drain_flag_file)):
            log.warning("removed the drain flag %s left by an earlier drain: admission is open",
                        self.config.drain_flag_file)
        if self.config.asg_name:
            self._autoscaling = wiring.aws_client(self.config, "autoscaling")
        if not self.config.restore_at_start:  # else the entrypoint exports it when it ends
            self.export_restore()
        if self.stops.load():
            self._spawn("fleet-stop-seed", self.stops.seed)
        for warning in self.budget_warnings():
            log.warning("%s", warning)
        self._running = True
        self.http.start()
        if threading.current_thread() is threading.main_thread():
            self.signals.install()
        self._spawn("watch-signal", self.signals.run, self.board.post, self._stop)
        for watcher in self.watchers:
            self._spawn(f"watch-{watcher.name}", run_watcher, watcher, self.board.post,
                        self._stop, self.config.poll_interval_s, self._on_watch_error)
        if self.config.publish_after_start and isinstance(self._publisher,
                                                          cache_sync.Publisher):
            self._spawn("publish-after-start", self._publish_after_start, self._publisher)
        log.info("sidecar up: /ready on port %d, watching %s", self.http.port,
                 [w.name for w in self.watchers] + ["signal"])
        return self

    def run(self, until: threading.Event | None = None) -> DrainReport | None:
        """Block until a draining notice arrives, drain, and return the report; or return
        None once `until` is set (the entrypoint's TorchServe child exited on its own)."""
        until = until or threading.Event()
        while not until.is_set():
            notice = self.board.wait(timeout_s=0.2)
            if notice is not None:
                report = self._drain(notice)
                share_by = report.plan.deadline_epoch
                if self._lingers(notice):
                    self._linger(until)
                    share_by = self._clock() + SHARE_AFTER_LINGER_S
                self.stops.share(share_by)
                return report
        return None

    def _drain(self, notice: TerminationNotice) -> DrainReport:
        report = run_drain(notice, self.drain_deps(notice), self.drain_policy())
        if self._stops_torchserve:  # a clean stop of TorchServe is a measurement for the next drain
            self.stops.record(report)
        self.control.finished(report)
        if self.config.report_file:
            wiring.write_report(Path(self.config.report_file), report)
        return report

    @property
    def _stops_torchserve(self) -> bool:
        """Whether this sidecar's drain stops TorchServe (else the orchestrator does)."""
        return self.hooks.stop_torchserve is not None or self.config.stop_method is not StopMethod.NONE

    def _lingers(self, notice: TerminationNotice) -> bool:
        return not self._stops_torchserve and notice.kind is not NoticeKind.SIGNAL

    def _linger(self, until: threading.Event) -> None:
        log.info("drain done; serving /ready (503) and /drain until SIGTERM")
        while not (until.is_set() or self._signalled.is_set() or self._stop.is_set()):
            self._signalled.wait(0.2)

    def close(self) -> None:
        self._running = False
        self._stop.set()
        self.signals.restore()
        self.http.stop()
        for thread in self._threads:
            thread.join(timeout=1.0)  # a GCP long-poll may still hang; threads are daemons

    def drain_deps(self, notice: TerminationNotice) -> DrainDeps:
        config, hooks = self.config, self.hooks
        # mark_not_ready stays the default no-op: /ready reads the board, which turned
        # not-ready the moment this notice was posted.
        return DrainDeps(
            clock=self._clock, sleep=self._sleep,
            stop_torchserve=hooks.stop_torchserve or wiring.stopper(config),
            torchserve=self.torchserve, in_flight=self._in_flight,
            close_admission=self._close_admission, deregister=self._deregister,
            # with a hooked admission there is no flag file to carry the cut
            cut_in_flight=None if hooks.close_admission else wiring.config_cutter(config, self._clock),
            request_capacity=wiring.capacity_requester(config, self._autoscaling, notice),
            publish_cache=self._publisher,
            close_listeners=wiring.listener_closer(config, hooks.torchserve_pid or wiring.pid_reader(config)),
            acknowledge=wiring.acknowledger(config, self.watchers, notice), current_deadline=self.board.deadline,
            metrics=self.metrics)

    def drain_policy(self) -> DrainPolicy:
        """The configured policy, with the stop reserve from the stops measured here or, copied
        at start, by the fleet (if any)."""
        return self.stops.policy(self.config.drain_policy())

    def budget_warnings(self) -> list[str]:
        """One line per notice this sidecar can get whose drain would leave the in-flight wait
        less than min_wait_s with every reserve in full (see drain/plan.py budget_warning), the
        stop reserve as the drain would take it (a measured stop's, when there is one)."""
        policy = self.drain_policy()
        found = (budget_warning(notice_s, source, setting, policy)
                 for notice_s, source, setting in wiring.notice_lengths(self.config))
        return [line for line in found if line is not None]

    # ---- pieces

    def export_restore(self) -> None:
        """The restore ran in another process (an init container) or thread (the entrypoint's
        restore_at_start): its record carries the outcome and the store's counters here."""
        if self.cache_metrics is None or not self.config.cache_dir:
            return
        record = read_restore_record(Path(self.config.cache_dir))
        if record is None:
            return
        self.metrics.cache_restores.labels(outcome=record.outcome).inc()
        self.cache_metrics.rejected.inc(record.rejected)
        self.cache_metrics.signature_rejected.inc(record.signature_rejected)
        self.cache_metrics.downloads.inc(record.downloads)

    def _publish_after_start(self, publisher: cache_sync.Publisher) -> None:
        """Once TorchServe is first ready (the worker has loaded or compiled and installed its
        artifact), publish it once unless a notice came first: the drain publishes then."""
        while not self._stop.is_set():
            if self.board.pending() is not None:
                return
            try:
                ready = self.torchserve.describe().ready_workers > 0
            except (SidecarError, TorchServeError, OSError, ValueError):
                ready = False
            if ready:
                outcome = publisher.publish_after_start()
                self.metrics.publishes_after_start.labels(outcome=outcome).inc()
                return
            self._stop.wait(self.config.poll_interval_s)

    def _spawn(self, name: str, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _on_posted(self, notice: TerminationNotice) -> None:
        if notice.kind is NoticeKind.SIGNAL:
            self._signalled.set()
        self.metrics.notices.labels(kind=notice.kind.value).inc()
        if should_drain(notice, self.config.drain_on_rebalance):
            log.warning("termination notice: %s", notice.to_json())
            self.metrics.termination_pending.set(1)
        else:
            # Not the words the runbook has operators look for: nothing drains.
            log.info("advisory notice, not draining (drain_on_rebalance is off): %s", notice.to_json())

    def _on_watch_error(self, name: str, err: MetadataError) -> None:
        self.metrics.errors.labels(step=f"watch_{name}").inc()
