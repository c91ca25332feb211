"""Driving a ContinuousService as TorchServe's frontend does, for the service tests."""
from __future__ import annotations

from handler.serving.continuous_service import ContinuousService
from handler.serving.live import Incoming, Reply


def drive(service: ContinuousService, first: list[Incoming], max_calls: int = 50) -> dict[str, list[Reply]]:
    """Call handle() as the frontend does until every request ended; returns replies per id."""
    replies: dict[str, list[Reply]] = {}
    live = list(first)
    for _ in range(max_calls):
        if not live:
            return replies
        out = service.handle(live)
        for inc, reply in zip(live, out):
            replies.setdefault(inc.request_id, []).append(reply)
        live = [Incoming(i.request_id, None, i.http, i.url_path) for i, r in zip(live, out) if r.more is True]
    raise AssertionError("requests did not finish")
