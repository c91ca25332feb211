"""AWS EC2 instance metadata (IMDSv2) watcher: spot interruption and rebalance notices."""

from __future__ import annotations

import json
import random
import time

import requests

from handler.sidecar.errors import ConfigError, MetadataError, TransientError
from handler.sidecar.notice.retry import DEFAULT_BACKOFF, Backoff, Sleep, call_with_retry, send
from handler.sidecar.notice.termination import Clock, NoticeKind, TerminationNotice, parse_rfc3339

TOKEN_PATH = "/latest/api/token"
ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
INSTANCE_ID_PATH = "/latest/meta-data/instance-id"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TTL_S = 21600


class ImdsWatcher:
    name = "aws"

    def __init__(self, base_url: str, *, clock: Clock, session: requests.Session | None = None,
                 token_ttl_s: int = 3600, timeout_s: float = 2.0,
                 backoff: Backoff = DEFAULT_BACKOFF, rng: random.Random | None = None,
                 sleep: Sleep = time.sleep,
                 rebalance_horizon_s: float = 120.0) -> None:
        if not 1 <= token_ttl_s <= MAX_TTL_S:
            raise ConfigError(f"IMDS token TTL must be 1..{MAX_TTL_S} s, got {token_ttl_s}")
        self._base = base_url.rstrip("/")
        self._clock = clock
        self._session = session or requests.Session()
        self._ttl_s = token_ttl_s
        self._timeout_s = timeout_s
        self._backoff = backoff
        self._rng = rng or random.Random()
        self._sleep = sleep
        # A rebalance recommendation promises no deadline; assume the usual 2-minute
        # interruption notice could follow it at any moment.
        self._rebalance_horizon_s = rebalance_horizon_s
        self._token: str | None = None
        self._token_expires = 0.0
        self._seen: set[tuple[str, ...]] = set()

    # ---- notices

    def poll(self) -> TerminationNotice | None:
        action = self._get(ACTION_PATH)
        if action is not None:
            notice = self._spot_notice(action)
            if self._first_time(("spot", notice.detail["action"], notice.detail["time"])):
                return notice
        rebalance = self._get(REBALANCE_PATH)
        if rebalance is not None:
            notice = self._rebalance_notice(rebalance)
            if self._first_time(("rebalance", notice.detail["noticeTime"])):
                return notice
        return None

    def instance_id(self) -> str:
        text = self._get(INSTANCE_ID_PATH)
        if not text:
            raise MetadataError("IMDS has no instance-id")
        return text.strip()

    def _first_time(self, key: tuple[str, ...]) -> bool:
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def _spot_notice(self, body: str) -> TerminationNotice:
        doc = _json_object(body, ACTION_PATH)
        try:
            action, when = str(doc["action"]), str(doc["time"])
            deadline = parse_rfc3339(when)
        except (KeyError, ValueError) as err:
            raise MetadataError(f"{ACTION_PATH}: unexpected body {body!r}") from err
        return TerminationNotice(NoticeKind.SPOT_INTERRUPTION, self.name, deadline,
                                 {"action": action, "time": when})

    def _rebalance_notice(self, body: str) -> TerminationNotice:
        doc = _json_object(body, REBALANCE_PATH)
        if "noticeTime" not in doc:
            raise MetadataError(f"{REBALANCE_PATH}: unexpected body {body!r}")
        deadline = self._clock() + self._rebalance_horizon_s
        return TerminationNotice(NoticeKind.REBALANCE, self.name, deadline,
                                 {"noticeTime": str(doc["noticeTime"])})

    # ---- HTTP with the session token

    def _get(self, path: str) -> str | None:
        """Body of `path`, or None on 404 (IMDS's way of saying "no event")."""
        return call_with_retry(lambda: self._get_once(path), self._backoff, self._rng,
                               self._sleep, f"IMDS GET {path}")

    def _get_once(self, path: str) -> str | None:
        response = self._send_get(path)
        if response.status_code == 401:
            # Expired, revoked, or issued before an IMDS restart: one fresh token, one retry.
            self._token = None
            response = self._send_get(path)
            if response.status_code == 401:
                raise TransientError(f"IMDS GET {path}: 401 with a fresh token")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise MetadataError(f"IMDS GET {path}: HTTP {response.status_code}")
        return response.text

    def _send_get(self, path: str) -> requests.Response:
        headers = {TOKEN_HEADER: self._current_token()}
        return send(self._session, "GET", self._base + path, headers=headers,
                    timeout_s=self._timeout_s)

    def _current_token(self) -> str:
        # Refresh ahead of expiry so a poll never races the token's last second.
        refresh_at = self._token_expires - min(60.0, self._ttl_s / 4)
        if self._token is None or self._clock() >= refresh_at:
            self._token, self._token_expires = self._fetch_token()
        return self._token

    def _fetch_token(self) -> tuple[str, float]:
        response = send(self._session, "PUT", self._base + TOKEN_PATH,
                        headers={TTL_HEADER: str(self._ttl_s)}, timeout_s=self._timeout_s)
        if response.status_code != 200:
            # 403: IMDS disabled or the request was refused; 400: bad TTL. Neither is transient.
            raise MetadataError(f"IMDS token PUT: HTTP {response.status_code}")
        ttl = _int_header(response, TTL_HEADER, default=self._ttl_s)
        return response.text.strip(), self._clock() + ttl


def _json_object(body: str, path: str) -> dict[str, object]:
    try:
        doc = json.loads(body)
    except json.JSONDecodeError as err:
        raise MetadataError(f"{path}: body is not JSON: {body!r}") from err
    if not isinstance(doc, dict):
        raise MetadataError(f"{path}: expected a JSON object, got {body!r}")
    return doc


def _int_header(response: requests.Response, name: str, default: int) -> int:
    value = response.headers.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        return default
