"""batchSize/maxBatchDelay mode: one call serves its whole batch to completion, streaming pieces
through an injected callback."""
from __future__ import annotations

from handler.serving.live import Incoming, Reply, SendPartial
from handler.serving.service import BaseService


class DynamicService(BaseService):
    """One call serves its whole batch. `send_partial(replies)` streams pieces by batch index."""

    def handle(self, batch: list[Incoming], send_partial: SendPartial) -> list[Reply]:
        refused = {i: reply for i, inc in enumerate(batch) if (reply := self._accept(inc)) is not None}
        waiting = [i for i in range(len(batch)) if i not in refused]  # accepted, in arrival order
        while waiting or self.engine.running:
            while waiting and self._fits(batch[waiting[0]].request_id):
                i = waiting.pop(0)
                if reply := self._start(batch[i].request_id):
                    refused[i] = reply
            if self.cutting():
                self.cut_running()  # what still waits is cut too (its reply a 503)
                waiting = []
                continue
            self._step()
            partial = {}
            for i, inc in enumerate(batch):
                live = self.live.get(inc.request_id)
                if live and live.req.stream and live.finish_reason is None and live.pending:
                    partial[i] = Reply("".join(live.pending), content_type=live.fmt.content_type(True), more=True)
                    live.pending, live.opened = [], True
            if partial:
                send_partial(partial)
        return [refused.get(i) or self._final(inc.request_id) for i, inc in enumerate(batch)]

    def _final(self, request_id: str) -> Reply:
        return self.last_reply(self.live.pop(request_id))
