"""continuousBatching: ContinuousService is driven once per TorchServe `handle` call. The frontend
sends every live request each call (a continuing one with no body), and we answer each with its
next piece from the step run ahead (or run one step, or a few: `call_seconds`). Transport rules:
handler.serving.lifecycle.reply."""
from __future__ import annotations

from typing import Any

from handler.engine.sequence import StepOutput
from handler.serving.lifecycle.stages import Stages
from handler.serving.live import Incoming, Reply, SendPartial
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


class ContinuousService:
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

    def __init__(self, *args: Any, call_seconds: float = 0.0, step_ahead: bool = False, **kwargs: Any):
        self.stages = Stages(*args, **kwargs)
        self.call_seconds = call_seconds
        self._step_thread = StepThread() if step_ahead else None
        self._quiet_calls = 0  # calls in a row that admitted and finished nothing

    def start(self) -> None:
        pass

    def abandon(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.stages.ending.drop(request_id)

    def handle(self, batch: list[Incoming], send_partial: SendPartial | None = None) -> list[Reply | None]:
        """This call's replies, one per request of `batch` (None: a whole answer not finished, held
        until its end: handler.serving.lifecycle.reply), each request through its stages in order.
        A stream's pieces are this call's replies too (more=True), so `send_partial` (DynamicService's
        way) is taken and not used."""
        s = self.stages
        ahead = self._step_thread.wait() if self._step_thread else None  # the step run since the last reply
        was_idle = not s.engine.running  # before this call's admissions
        present = {inc.request_id for inc in batch}
        if gone := [request_id for request_id in s.live if request_id not in present]:  # clients went away or timed out
            s.ending.cancel(gone)
        if s.cutting():
            s.ending.cut_running()
        arrived = [inc for inc in batch if inc.request_id not in s.live]
        refused = {inc.request_id: r for inc in arrived if (r := s.admission.admit(inc))}
        taken = s.engine.running
        refused |= s.starts.start_waiting()
        started = s.engine.running > taken
        if s.engine.running and (started or not ahead):  # a request started now is in this call's step
            self._steps_for_this_call()
        replies = [refused.get(inc.request_id) or s.replies.next_piece(inc.request_id) for inc in batch]
        self._step_ahead(replies, bool(arrived), was_idle)
        return replies

    def _step_ahead(self, replies: list[Reply | None], arrived: bool, was_idle: bool) -> None:
        """Start the next step on the step thread, to answer the next call with, when this call's
        requests all go on (a held one too) and either it admitted nothing for QUIET_CALLS calls or
        it admitted requests into an idle engine (then FRESH_START_DELAY after its replies)."""
        going_on = all(r is None or r.more is True for r in replies)
        self._quiet_calls = self._quiet_calls + 1 if going_on and not arrived else 0
        fresh = going_on and arrived and was_idle
        s = self.stages
        if self._step_thread and s.engine.running and not s.cutting() and (fresh or self._quiet_calls >= QUIET_CALLS):
            self._step_thread.start(s.steps.step, delay=FRESH_START_DELAY if fresh else 0.0)

    def _step(self) -> list[StepOutput]:
        step = self.stages.steps.step
        return step() if self._step_thread is None else self._step_thread.run(step)

    def _steps_for_this_call(self) -> None:
        """One step, then more while every output continues a sample that already showed text
        (its first visible text, or a finish, is answered at once: time to first token, and a
        slot freed for a waiting request, do not wait) and the next step, as long as the last,
        still ends within call_seconds."""
        s = self.stages
        began = s.clock()
        while True:
            shown = self._samples_with_text()
            step_began = s.clock()
            outputs = self._step()
            now = s.clock()
            if (not s.engine.running or s.cutting()
                    or any(o.finished or (o.request_id, o.index) not in shown for o in outputs)
                    or (now - began) + (now - step_began) > self.call_seconds):
                return

    def _samples_with_text(self) -> set[tuple[str, int]]:
        return {(rid, i) for rid, live in self.stages.live.items() for i, sample in enumerate(live.samples) if any(sample.text)}
