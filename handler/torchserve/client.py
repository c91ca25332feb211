"""Read-only client for TorchServe 0.12's management API, with token auth.

`GET {mgmt}/models/{name}` returns a list (one entry per version) of
`{"modelName", "workers": [{"id", "status": "READY"|"UNLOADING", "pid", ...}],
"jobQueueStatus": {"remainingCapacity", "pendingRequests"}, ...}`. Worker status is READY
only when the worker's model is loaded, so it is the readiness signal; `/ping` is not.
`pendingRequests` counts queued jobs only, not the batch a worker is running, which is why
the drain also reads the handler's running gauge from TorchServe's metrics endpoint.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from handler.torchserve.errors import TorchServeAuthError, TorchServeError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    status: str
    pid: int | None

    def process(self) -> int:
        """The worker's pid; TorchServe lists a worker that has not started without one."""
        if self.pid is None:
            raise RuntimeError(f"worker {self.id} ({self.status}) has no process")
        return self.pid


@dataclass(frozen=True)
class ModelState:
    name: str
    workers: tuple[WorkerInfo, ...]
    pending_requests: int | None  # None when the server does not report a queue

    @property
    def ready_workers(self) -> int:
        return sum(1 for worker in self.workers if worker.status == "READY")


@dataclass(frozen=True)
class KeyFile:
    """TorchServe's key_file.json, written in the JVM's working directory on start."""

    management_key: str
    management_expires: float  # epoch seconds
    api_key: str  # asks for new keys (/token)
    inference_key: str

    @classmethod
    def load(cls, path: Path) -> KeyFile | None:
        """None while the file does not exist (TorchServe not up yet, or auth disabled)."""
        try:
            doc = json.loads(path.read_text())
            management = doc["management"]
            # A Java Instant, always in UTC: '2026-01-05T18:02:00.123456789Z'.
            expires = datetime.fromisoformat(management["expiration time"]).timestamp()
            return cls(management["key"], expires, doc["API"]["key"], doc["inference"]["key"])
        except FileNotFoundError:
            return None
        except (KeyError, TypeError, ValueError) as err:
            raise TorchServeError(f"{path} is not a TorchServe key file: {err}") from err


class TorchServeClient:
    def __init__(self, management_url: str, model_name: str, *, key_file: Path | None = None,
                 session: requests.Session | None = None, timeout_s: float = 2.0,
                 clock: Callable[[], float] = time.time) -> None:
        self._base = management_url.rstrip("/")
        self.model_name = model_name
        self._key_file = key_file  # None: token auth is off (--disable-token-auth)
        self._shared_session = session
        # Readiness probes and the drain call in from different threads; requests does not
        # promise that one Session is safe to share, so each thread gets its own.
        self._local = threading.local()
        self._timeout_s = timeout_s
        self._clock = clock

    def describe(self) -> ModelState:
        response = self._get_authorized(f"/models/{self.model_name}")
        if response.status_code != 200:
            raise TorchServeError(f"describe {self.model_name}: HTTP {response.status_code} "
                                  f"{response.text[:200]}")
        return _parse_describe(self.model_name, response.json())

    def _get_authorized(self, path: str) -> requests.Response:
        sent = self._management_key()
        response = self._get(path, sent)
        # 0.12 answers a missing, wrong or expired key with 400 InvalidKeyException.
        if self._key_file is None or not _is_key_rejection(response):
            return response
        keys = KeyFile.load(self._key_file)
        if keys is None:
            raise TorchServeAuthError(f"TorchServe wants a management key and {self._key_file} "
                                      "does not exist (yet)")
        # A restarted TorchServe has written new keys; otherwise the key has to be renewed.
        fresh = keys.management_key if keys.management_key != sent else self._renew(keys)
        response = self._get(path, fresh)
        if _is_key_rejection(response):
            raise TorchServeAuthError(f"management key refused after a refresh: {path}")
        return response

    def _management_key(self) -> str | None:
        keys = KeyFile.load(self._key_file) if self._key_file is not None else None
        if keys is None:
            return None
        # Keys expire after token_expiration_min (60 by default); a sidecar outlives that.
        if keys.management_expires - self._clock() < 30.0:
            return self._renew(keys)
        return keys.management_key

    def _renew(self, keys: KeyFile) -> str:
        """Ask TorchServe (with the API key) for a new management key; it rewrites the file."""
        response = self._get("/token", keys.api_key, params={"type": "management"})
        renewed = KeyFile.load(self._key_file) if self._key_file is not None else None
        if response.status_code != 200 or renewed is None:
            raise TorchServeAuthError(f"management key renewal: HTTP {response.status_code}")
        return renewed.management_key

    def _get(self, path: str, key: str | None,
             params: dict[str, str] | None = None) -> requests.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            return self._session().get(self._base + path, headers=headers, params=params,
                                       timeout=self._timeout_s)
        except requests.RequestException as err:
            raise TorchServeError(f"GET {self._base}{path}: {type(err).__name__}") from err

    def _session(self) -> requests.Session:
        if self._shared_session is not None:
            return self._shared_session
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        session: requests.Session = self._local.session
        return session


def _is_key_rejection(response: requests.Response) -> bool:
    text = response.text
    return response.status_code in (400, 401) and ("InvalidKey" in text or "Token Auth" in text)


def _parse_describe(name: str, doc: object) -> ModelState:
    entries = doc if isinstance(doc, list) else [doc]
    workers: list[WorkerInfo] = []
    pending: int | None = None
    for entry in entries:
        if not isinstance(entry, dict):
            raise TorchServeError(f"describe {name}: unexpected entry {entry!r}")
        for worker in entry.get("workers", []):
            workers.append(WorkerInfo(str(worker.get("id")), str(worker.get("status")),
                                      worker.get("pid")))
        queue = entry.get("jobQueueStatus")
        if isinstance(queue, dict) and "pendingRequests" in queue:
            pending = (pending or 0) + int(queue["pendingRequests"])
    return ModelState(name, tuple(workers), pending)


def running_reader(url: str, metric_name: str, model_name: str | None = None, *,
                   session: requests.Session | None = None,
                   timeout_s: float = 1.0) -> Callable[[], int]:
    """A callable for DrainDeps.in_flight: the requests generating inside the handler, read
    from `url` as a JSON body (`{"in_flight": n}` or a bare number) or as Prometheus text,
    where the samples of `metric_name` for `model_name` are summed (one series per worker).

    TorchServe shows a backend gauge only once a worker has reported it, so a metric that is
    absent counts as 0 (no request has been stepped since TorchServe started); a warning says
    so once, in case the name is wrong.
    """
    http = session or requests.Session()
    warned: list[bool] = []

    def read() -> int:
        try:
            response = http.get(url, timeout=timeout_s)
        except requests.RequestException as err:
            raise TorchServeError(f"running GET {url}: {type(err).__name__}") from err
        if response.status_code != 200:
            raise TorchServeError(f"running GET {url}: HTTP {response.status_code}")
        if "json" in response.headers.get("Content-Type", ""):
            doc = response.json()
            return int(doc["in_flight"] if isinstance(doc, dict) else doc)
        total = sum_samples(response.text, metric_name, model_name)
        if total is None:
            if not warned:
                warned.append(True)
                log.warning("%s is not on %s yet; counting 0 running (normal before the first "
                            "request; otherwise check metrics.yaml declares it)", metric_name, url)
            return 0
        return total

    return read


MODEL_LABELS = ("ModelName", "model_name")


def sum_samples(text: str, metric_name: str, model_name: str | None = None) -> int | None:
    """Sum of `metric_name` over the series of `model_name` (all series when None or when a
    series has no model label); None when there is no such series."""
    total, found = 0.0, False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != metric_name or not _for_model(sample.labels, model_name):
                continue
            total += sample.value
            found = True
    return int(total) if found else None


def _for_model(labels: dict[str, str], model_name: str | None) -> bool:
    named = [labels[key] for key in MODEL_LABELS if key in labels]
    return model_name is None or not named or model_name in named
