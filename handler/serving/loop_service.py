"""The engine stepped by a thread of its own, for TorchServe's asyncCommunication mode.

In continuous mode every call is a round trip through TorchServe's frontend (the worker answers a
step or a few for every live request, the frontend sends them all back for the next). In async mode
the frontend hands each request to the worker once and the worker answers when it likes: here a
thread admits what arrived between two steps, steps the engine and hands every request's pieces to
its `Delivery` (which writes them to TorchServe's socket, from this thread). It saves the
frontend's round trip a token; which of it and continuous batching serves more has depended on
the machine and the load (docs/benchmarks.md, "Batching modes"). Continuous batching is the
default also for what this mode lacks: the frontend sends nothing when a client goes away, so a
request runs to its own end (bounded by its max_new_tokens).

Requests beyond the engine's slots wait in arrival order. gRPC gets each answer in one reply, as in
continuous mode (token by token needs dynamic mode).
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from handler.serving import openmp
from handler.serving.lifecycle.stages import Stages
from handler.serving.live import Incoming, Reply, SendPartial

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Delivery:
    """Where one request's replies go; both are called from the engine thread."""
    piece: Callable[[Reply], None]  # a streamed piece of an HTTP response (more=True)
    done: Callable[[Reply], None]  # the last reply, exactly once: whole (more=None) or the stream's end (or gRPC's one)


class LoopService:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.stages = Stages(*args, **kwargs)
        self._inbox: queue.SimpleQueue[tuple[Incoming, Delivery] | None] = queue.SimpleQueue()  # None: wake up
        self._deliveries: dict[str, Delivery] = {}
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def submit(self, inc: Incoming, delivery: Delivery) -> None:
        """From any thread; the engine thread admits it before its next step."""
        self._inbox.put((inc, delivery))

    def handle(self, batch: list[Incoming], send_partial: SendPartial) -> Awaitable[list[Reply]]:
        """One call's requests, each handed to the engine thread, which sends their streamed pieces
        through `send_partial` itself; what is returned gives their last replies, in batch order.
        From the running event loop (TorchServe's asyncCommunication awaits it)."""
        loop = asyncio.get_running_loop()
        finals: list[asyncio.Future[Reply]] = []
        for idx, inc in enumerate(batch):
            final: asyncio.Future[Reply] = loop.create_future()
            finals.append(final)

            def piece(reply: Reply, i: int = idx) -> None:
                send_partial({i: reply})

            def done(reply: Reply, f: asyncio.Future[Reply] = final) -> None:
                loop.call_soon_threadsafe(f.set_result, reply)

            self.submit(inc, Delivery(piece=piece, done=done))
        return asyncio.gather(*finals)

    def abandon(self, request_ids: list[str]) -> None:
        """Not called in this mode (the engine thread is its own error boundary: _fail_running)."""
        for request_id in request_ids:
            self.stages.ending.drop(request_id)

    def start(self) -> None:
        """From the thread that built the engine: its OpenMP workers are released first, or the
        engine thread's would be throttled (handler.serving.openmp)."""
        openmp.release_this_threads_pool()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        self._inbox.put(None)  # wakes an idle loop
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self.run_once(block=True)

    def run_once(self, block: bool = False) -> None:
        """Take what arrived (waiting for it when idle and `block`), start what fits, run one step
        and deliver. Tests call this directly."""
        s = self.stages
        self._take(block=block and not s.engine.running and not s.starts.waiting())
        for request_id, refused in s.starts.start_waiting().items():
            self._deliveries.pop(request_id).done(refused)
        if s.cutting():
            s.ending.cut_running()  # what still waits is cut too (its reply a 503)
            self._deliver_all()
        if not s.engine.running:
            return
        try:
            s.steps.step()
        except Exception as err:  # the thread's error boundary: fail what was running, keep serving
            log.exception("generation failed")
            self._fail_running(f"generation failed: {type(err).__name__}: {err}")
            return
        self._deliver_all()

    def _take(self, block: bool) -> None:
        try:
            item = self._inbox.get(block=block)
            while True:
                if item is not None:
                    self._admit(*item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            pass

    def _admit(self, inc: Incoming, delivery: Delivery) -> None:
        """Admitted as it arrives: refused (or a models route answered) at once, else it waits its turn."""
        if (reply := self.stages.admission.admit(inc)) is not None:
            delivery.done(reply)
            return
        self._deliveries[inc.request_id] = delivery

    def _deliver_all(self) -> None:
        for request_id in list(self._deliveries):
            self._deliver(request_id)

    def _deliver(self, request_id: str) -> None:
        s = self.stages
        live = s.live[request_id]
        if live.finish_reason is not None:
            self._deliveries.pop(request_id).done(s.replies.finish(request_id))
        elif live.http and (piece := s.replies.streamed(live)) is not None:
            self._deliveries[request_id].piece(piece)

    def _fail_running(self, message: str) -> None:
        s = self.stages
        for request_id, delivery in self._deliveries.items():
            delivery.done(s.replies.failed(s.ending.fail(request_id), message))
        self._deliveries.clear()
