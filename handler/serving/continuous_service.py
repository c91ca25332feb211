"""continuousBatching: ContinuousService is driven once per TorchServe `handle` call. The frontend
sends every live request each call (a continuing one with no body), and we answer each with its
next piece from the step run ahead (or run one step, or a few: `call_seconds`). Transport rules:
handler.serving.service."""
from __future__ import annotations

from handler.engine.sequence import StepOutput
from handler.serving.live import Incoming, Reply, SendPartial
from handler.serving.service import BaseService
from handler.serving.step_thread import StepThread

# Calls in a row that admit and finish no request before steps run ahead again. A step run ahead
# cannot hold a request still in the frontend's queue, whose first token then comes a step later:
# while requests come and go (a finish brings a client's next request, or a waiting one), each
# call runs its own step, which holds the requests it brings. 1, not 2: at 1 client the second
# synchronous call cost every request a round trip (ad hoc A/B, docs/benchmarks.md), and 16
# clients' first tokens came as soon.
QUIET_CALLS = 1
# A call that admits requests into an idle engine (a lone client's next request, a burst's first)
# starts the next step ahead too, but this long after its replies: the first token's way out
# (worker, frontend, client) needs the cores the step's threads would take. At once, the first
# token came ~2 ms later; after 1 ms, the second token comes ~1 ms sooner than a round trip
# would let it, the first as soon (ad hoc A/B at 1 client, docs/benchmarks.md).
FRESH_START_DELAY = 0.001


class ContinuousService(BaseService):
    """The frontend sends its next call only after this one's replies. `step_ahead`: meanwhile the
    next step runs on a thread of its own (handler.serving.step_thread) and the next call is
    answered with it: a token a step, no round trip in between, once QUIET_CALLS calls in a row
    admitted and finished nothing (until then each call runs its own step, which holds the requests
    it admits), or right after a call that admitted requests into an idle engine (FRESH_START_DELAY).
    A call that starts requests runs a step for them after the one run ahead: their first token
    does not wait for the next call (the running requests get two tokens in that reply).
    A request that call no longer carries is cancelled then. `call_seconds`:
    how long one call may go on stepping while every request in it goes on (0: one step a call;
    `_steps_for_this_call`): fewer round trips, tokens streamed a few at a time."""

    def __init__(self, *args, call_seconds: float = 0.0, step_ahead: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.call_seconds = call_seconds
        self._steps = StepThread() if step_ahead else None
        self._quiet_calls = 0  # calls in a row that admitted and finished nothing

    def handle(self, batch: list[Incoming], send_partial: SendPartial | None = None) -> list[Reply]:
        """This call's replies, one per request of `batch`. A stream's pieces are this call's replies
        too (more=True), so `send_partial` (DynamicService's way) is taken and not used."""
        ahead = self._steps.wait() if self._steps else None  # the step run since the last reply
        was_idle = not self.engine.running  # before this call's admissions
        present = {inc.request_id for inc in batch}
        for gone in [rid for rid in self.live if rid not in present]:  # its client went away or timed out
            self.engine.cancel(gone)
            del self.live[gone]
            self.metrics.observe("ts_llm_request_failure_total", 1, "cancelled")
        if self.cutting():
            self.cut_running()
        arrived = any(inc.request_id not in self.live for inc in batch)
        refused = {inc.request_id: r for inc in batch if inc.request_id not in self.live and (r := self._accept(inc))}
        taken = self.engine.running
        refused |= self._start_waiting()
        started = self.engine.running > taken  # requests start here only
        # Before the step, so admissions and cancellations show at once (the sidecar's drain reads it).
        self.metrics.observe("ts_llm_requests_running", self.engine.running)
        if self.engine.running and (started or not ahead):  # a request started now is in this call's step
            self._steps_for_this_call()
        # gRPC requests must be answered whole, now (see module docstring); the rest keep pace.
        while any(not self.live[i.request_id].http and self.live[i.request_id].finish_reason is None
                  for i in batch if i.request_id in self.live):
            self._step()
        replies = [refused.get(inc.request_id) or self._reply(inc.request_id) for inc in batch]
        going_on = all(r.more is True for r in replies)
        self._quiet_calls = self._quiet_calls + 1 if going_on and not arrived else 0
        fresh = going_on and arrived and was_idle
        if self._steps and self.engine.running and not self.cutting() and (fresh or self._quiet_calls >= QUIET_CALLS):
            self._steps.start(super()._step, delay=FRESH_START_DELAY if fresh else 0.0)
        return replies

    def _step(self) -> list[StepOutput]:
        return super()._step() if self._steps is None else self._steps.run(super()._step)

    def _steps_for_this_call(self) -> None:
        """One step, then more while every output continues a sample that already showed text
        (its first visible text, or a finish, is answered at once: time to first token, and a
        slot freed for a waiting request, do not wait) and the next step, as long as the last,
        still ends within call_seconds."""
        began = self.clock()
        while True:
            shown = self._samples_with_text()
            step_began = self.clock()
            outputs = self._step()
            now = self.clock()
            if (not self.engine.running or self.cutting()
                    or any(o.finished or (o.request_id, o.index) not in shown for o in outputs)
                    or (now - began) + (now - step_began) > self.call_seconds):
                return

    def _samples_with_text(self) -> set[tuple[str, int]]:
        return {(rid, i) for rid, live in self.live.items() for i, sample in enumerate(live.samples) if any(sample.text)}

    def _start_waiting(self) -> dict[str, Reply]:
        """Start accepted requests in arrival order while they fit (slots and KV pages). An
        HTTP request that does not fit waits (its replies are empty pieces until it runs); a gRPC
        one cannot wait (module docstring) and is refused with a 503."""
        refused, blocked = {}, False
        for request_id, live in list(self.live.items()):
            if live.started or live.finish_reason is not None:
                continue
            if (not blocked and self._fits(request_id)) or not live.http:
                if (refusal := self._start(request_id)) is not None:
                    refused[request_id] = refusal
            else:
                blocked = True
        return refused

    def _reply(self, request_id: str) -> Reply:
        live = self.live[request_id]
        done = live.finish_reason is not None
        ctype = live.fmt.content_type(live.req.stream)
        if done:
            del self.live[request_id]
        if live.cut or not live.http or (done and not live.opened):
            return self.last_reply(live)
        live.opened = True
        if not live.req.stream:
            # A non-streaming HTTP client still rides the chunked response: empty pieces until the end.
            return Reply(self._whole(live) if done else "", content_type=ctype, more=not done)
        body, live.pending = "".join(live.pending), []
        return Reply(body, content_type=ctype, more=not done)
