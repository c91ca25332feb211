"""What the TorchServe handler calls, whatever the batching mode: batchSize/maxBatchDelay mode is
dynamic_service.DynamicService, continuousBatching continuous_service.ContinuousService,
asyncCommunication loop_service.LoopService. Each drives one replica's requests through their
stages (handler.serving.lifecycle: admit, start, step, reply, end) its own way; none imports
TorchServe."""
from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Protocol

from handler.serving.live import Incoming, Reply, SendPartial


class Service(Protocol):
    def start(self) -> None:
        """Called once, on the thread that built the engine (LoopService starts its engine thread)."""

    def handle(self, batch: list[Incoming], send_partial: SendPartial) -> Sequence[Reply | None] | Awaitable[list[Reply]]:
        """One TorchServe call's requests: their replies, by batch index (an awaitable of them in
        asyncCommunication mode; None: no reply this call, continuous mode's held request);
        streamed pieces go through `send_partial` where the mode sends them between replies."""

    def abandon(self, request_ids: list[str]) -> None:
        """Forget these requests (the handler's error boundary failed their batch): out of the
        engine and out of the service."""
