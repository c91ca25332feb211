"""Driving a ContinuousService as TorchServe's frontend does, for the service tests."""
from __future__ import annotations

from handler.serving.continuous_service import ContinuousService
from handler.serving.live import Incoming, Reply


def drive(service: ContinuousService, first: list[Incoming], max_calls: int = 50) -> dict[str, list[Reply | None]]:
    """Call handle() as the frontend does until every request ended; returns replies per id (None:
    held that call, so sent again as it came, body and all; a continuing stream comes without its body)."""
    replies: dict[str, list[Reply | None]] = {}
    live = list(first)
    for _ in range(max_calls):
        if not live:
            return replies
        out = service.handle(live)
        for inc, reply in zip(live, out):
            replies.setdefault(inc.request_id, []).append(reply)
        live = [i if r is None else Incoming(i.request_id, None, i.http, i.url_path)
                for i, r in zip(live, out) if r is None or r.more is True]
    raise AssertionError("requests did not finish")


def sent(replies: list[Reply | None]) -> list[Reply]:
    """What went out to the client: the replies of the calls that did not hold the request."""
    return [r for r in replies if r is not None]
