"""batchSize/maxBatchDelay mode: one call serves its whole batch to completion, streaming pieces
through an injected callback."""
from __future__ import annotations

from typing import Any

from handler.serving.lifecycle.stages import Stages
from handler.serving.live import Incoming, Reply, SendPartial


class DynamicService:
    """One call serves its whole batch. `send_partial(replies)` streams pieces by batch index."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.stages = Stages(*args, **kwargs)

    def start(self) -> None:
        pass

    def abandon(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.stages.ending.drop(request_id)

    def handle(self, batch: list[Incoming], send_partial: SendPartial) -> list[Reply]:
        s = self.stages
        refused = {inc.request_id: reply for inc in batch if (reply := s.admission.admit(inc)) is not None}
        while s.starts.waiting() or s.engine.running:
            refused |= s.starts.start_waiting()
            if s.cutting():
                s.ending.cut_running()  # what still waits is cut too (its reply a 503)
                continue
            s.steps.step()
            partial = {i: reply for i, inc in enumerate(batch)
                       if inc.request_id in s.live and (reply := s.replies.streamed(s.live[inc.request_id]))}
            if partial:
                send_partial(partial)
        return [refused.get(inc.request_id) or s.replies.finish(inc.request_id) for inc in batch]
