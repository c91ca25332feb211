"""Replying, a request's fourth stage: its pieces formatted for its API (handler.serving.formats)
and sent as they come, then its last reply; a finished request leaves the table here.

Transport rules come from TorchServe 0.12.0's frontend:
- HTTP: a reply marked `more=True` opens a chunked response; `more=False` ends it; `more=None` is
  a whole response (the only form that may carry a 4xx or a 503, and the only form allowed for a
  request answered in its first call).
- gRPC (no HTTP headers): in continuous mode the frontend completes a unary call on its first
  reply and drops a stream after its first reply. Token-by-token gRPC streaming needs dynamic mode.
  In every mode a gRPC call's last reply is `more=False` (`last`): StreamPredictions ends on
  nothing else, and a stream's only reply without it makes the frontend fail the worker.
- In continuous mode a call may leave a request unanswered (`next_piece` gives None): the frontend
  keeps it, sends it again (body and all) with the next call, and sends its client nothing. So a
  whole answer (a non-streaming HTTP request, any gRPC call) is held until its end and goes out as
  one response, while the other requests keep stepping: its status is still open, so a cut one is
  a whole 503 that a load balancer can retry on another replica.
"""
from __future__ import annotations

from collections.abc import Callable

from handler.resume.ids import event_id, public_id
from handler.serving.formats import Choice, Formatter, error_body
from handler.serving.lifecycle.resume import RESUME_MESSAGE
from handler.serving.live import Live, Reply

KEEPALIVE_S = 15.0  # a stream that sent nothing this long sends an SSE comment: proxies close idle connections
CUT_MESSAGE = ("this replica is shutting down and its drain time ran out: the generation was cut before it "
               "finished; retry on another replica")


class Replies:
    def __init__(self, live: dict[str, Live], model: str, token_text: Callable[[int], str], clock: Callable[[], float]):
        self.live, self.model, self.token_text, self.clock = live, model, token_text, clock

    def next_piece(self, request_id: str) -> Reply | None:
        """Continuous mode's reply to one call: what the request's client has not been sent yet,
        its last reply once it finished (it leaves the table); None for a whole answer not yet
        finished (held: no reply this call)."""
        live = self.live[request_id]
        done = live.finish_reason is not None
        if not (live.http and live.req.stream):
            return self.finish(request_id) if done else None
        if done:
            del self.live[request_id]
        if live.cut or (done and not live.opened):
            return self.last(live)
        live.opened = True
        return Reply(self._stream_body(live), content_type=self._format(live).content_type(True), more=not done)

    def streamed(self, live: Live) -> Reply | None:
        """A running stream's pieces not yet sent, as one more=True reply (None when there are none)."""
        if not live.req.stream or live.finish_reason is not None or not live.pending:
            return None
        live.opened = True
        return Reply(self._stream_body(live), content_type=self._format(live).content_type(True), more=True)

    def _stream_body(self, live: Live) -> str:
        """The pending pieces; with none, after KEEPALIVE_S of silence, a keep-alive comment: a
        stream whose text is held (a tool call being written, a resumed one waiting for a slot)
        may send nothing for minutes, and a proxy's idle timeout would close it."""
        body, now = self._take_pieces(live), self.clock()
        if not body and now - (live.sent_at or live.arrived) >= KEEPALIVE_S:
            body = self._format(live).keepalive()
        if body:
            live.sent_at = now
        return body

    def finish(self, request_id: str) -> Reply:
        """A finished (or cut) request's last reply; it leaves the table."""
        return self.last(self.live.pop(request_id))

    def last(self, live: Live) -> Reply:
        """A finished request's last reply. more=False ends a chunked HTTP response and any gRPC
        call: TorchServe completes StreamPredictions on nothing else, and its frontend fails the
        worker on a stream's reply that says neither; None is a whole HTTP response."""
        if live.cut:
            return self._cut(live)
        return Reply(self._whole(live), content_type=self._format(live).content_type(live.req.stream),
                     more=False if live.opened or not live.http else None)

    def failed(self, live: Live, message: str) -> Reply:
        """A server fault's reply: a 500, or, on a stream already sent, an error as its last event."""
        fmt = self._format(live)
        if live.opened:
            return Reply(fmt.error_event(message), 200, fmt.content_type(live.req.stream), False)
        return Reply(error_body(message, 500), 500, fmt.content_type(live.req.stream), None)

    def _cut(self, live: Live) -> Reply:
        """A cut request's: a 503 (a recorded gRPC call's says where to resume), or on a stream
        already sent, its pieces and a last event that says where to resume (or to retry)."""
        fmt = self._format(live)
        if live.resume_id is not None:
            end = fmt.resume_event(RESUME_MESSAGE.format(id=live.resume_id), live.resume_id)
        else:
            end = fmt.error_event(CUT_MESSAGE, 503) if live.opened else error_body(CUT_MESSAGE, 503)
        if not live.opened:  # only a stream is opened before its end
            return Reply(end, 503, more=None if live.http else False)
        return Reply(self._take_pieces(live) + end, content_type=fmt.content_type(True), more=False)

    def _whole(self, live: Live) -> str:
        if live.req.stream:
            return self._take_pieces(live)
        asked = live.req.params.logprobs is not None
        choices = [Choice("".join(s.text), s.finish_reason, s.logprobs if asked else None, s.tool_calls) for s in live.samples]
        return self._format(live).whole(choices, live.usage)

    def _take_pieces(self, live: Live) -> str:
        """The pending pieces, formatted in order (a formatter counts what it has sent), and gone."""
        pieces, live.pending, fmt = live.pending, [], self._format(live)
        return "".join(fmt.chunk(p.text, p.finish_reason, live.usage, logprobs=p.logprobs, index=p.index, last=p.last,
                                 tool_calls=p.tool_calls, event_id=self._event_id(live, p.index, p.point))
                       for p in pieces)

    @staticmethod
    def _event_id(live: Live, index: int, point: int) -> str | None:
        """A resumable stream's event id once sample `index` reached `point`: every sample's point."""
        if live.key is None:
            return None
        live.points[index] = point
        return event_id(live.key, live.points)

    def _format(self, live: Live) -> Formatter:
        """The request's formatter, made at its first reply."""
        if live.fmt is None:
            live.fmt = Formatter(live.req.api, self.model, live.req.include_usage, token_text=self.token_text)
            if live.key is not None:  # the same id on every replica, and not the key: whoever logs ids cannot resume
                live.fmt.id = public_id(live.key)
            if live.resume is not None:  # its client holds each sample's text up to its resume point
                live.fmt.resumed(live.points)
        return live.fmt
