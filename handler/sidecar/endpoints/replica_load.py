"""The replica's load on the sidecar's /metrics, read at scrape time, for autoscaling.

    ts_llm_requests_waiting{model_name}    queued in TorchServe's frontend, not yet in a batch
                                           (management API: jobQueueStatus.pendingRequests)
    ts_llm_requests_in_flight{model_name}  accepted and not finished: waiting + the handler's
                                           running gauge (the number the drain waits on)

The HPA scales on ts_llm_requests_waiting (deploy/k8s/base/hpa.yaml, through prometheus-adapter);
the label is `model_name`, the HPA's metric selector. A source that cannot be read leaves its
series out of that scrape rather than failing the whole endpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from handler.sidecar.drain.deps import ModelDescriber
from handler.sidecar.drain.in_flight import READ_ERRORS

log = logging.getLogger(__name__)

WAITING = "ts_llm_requests_waiting"
IN_FLIGHT = "ts_llm_requests_in_flight"
MODEL_LABEL = "model_name"


class LoadCollector(Collector):
    def __init__(self, model_name: str, torchserve: ModelDescriber,
                 running: Callable[[], int] | None) -> None:
        self._model = model_name
        self._torchserve = torchserve
        self._running = running

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Names only: registering must not call TorchServe.
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        waiting = _read(lambda: self._torchserve.describe().pending_requests, "queue")
        running = _read(self._running, "running") if self._running is not None else 0
        waiting_family, in_flight_family = self._families()
        if waiting is not None:
            waiting_family.add_metric([self._model], waiting)
            yield waiting_family
            if running is not None:
                in_flight_family.add_metric([self._model], waiting + running)
                yield in_flight_family

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (GaugeMetricFamily(WAITING, "Requests queued in TorchServe, not yet in a batch.",
                                  labels=[MODEL_LABEL]),
                GaugeMetricFamily(IN_FLIGHT, "Requests accepted and not finished "
                                  "(queued + generating).", labels=[MODEL_LABEL]))


def _read(source: Callable[[], int | None], what: str) -> int | None:
    try:
        value = source()
    except READ_ERRORS as err:
        log.debug("load metrics: %s unreadable: %s", what, err)
        return None
    return None if value is None else int(value)
