"""A request in a service: what came in (Incoming), what goes back (Reply), and while it runs its
completions (Sample), the outputs its client has not been sent yet (Piece) and its state (Live)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from handler.engine.sampling import SamplingParams, TokenLogprob
from handler.engine.sequence import Continuation
from handler.serving.formats import Formatter, Usage
from handler.serving.protocol import GenerationRequest
from handler.serving.tool_calls import ToolCall, ToolStream


@dataclass(frozen=True)
class Incoming:
    request_id: str
    body: object | None  # None: a continuing request whose body TorchServe keeps in the backend
    http: bool
    url_path: str = ""
    last_event_id: str | None = None  # the header a reconnecting SSE client sends: resume after that event


@dataclass(frozen=True)
class Reply:
    body: str
    status: int = 200
    content_type: str = "application/json"
    more: bool | None = None


@dataclass
class Sample:
    """One of a request's completions (OpenAI's `n`; one unless it asked for more)."""
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)  # every generated token's, when asked
    logprobs_sent: int = 0  # how many of them streamed pieces carried
    tools: ToolStream | None = None  # splits content from tool calls, when the request has tools
    tool_calls: list[ToolCall] = field(default_factory=list)  # once finished
    token_ids: list[int] = field(default_factory=list)  # generated: a finished sample's record at a cut
    chars: int = 0  # of the model's text in pieces built so far (with tools: what the parser was fed)


@dataclass(frozen=True)
class Piece:
    """One step's output for one sample of a stream, recorded by the step stage and formatted by
    the reply stage (handler.serving.lifecycle)."""
    index: int  # the sample's
    text: str
    finish_reason: str | None  # the sample's, once it finished
    last: bool  # every sample has finished: this piece ends the stream
    tool_calls: tuple[ToolCall, ...] = ()  # a finished sample's, whole
    logprobs: tuple[TokenLogprob, ...] | None = None  # the tokens' since the sample's previous piece, when asked
    point: int = 0  # the sample's once this piece is out (handler.resume.ids.sample_point): in event ids


@dataclass
class Live:
    req: GenerationRequest
    sample_params: list[SamplingParams]  # of each sample the engine runs (GenerationRequest.sample_params; resumed: `resume`'s)
    http: bool
    arrived: float
    samples: list[Sample]
    fmt: Formatter | None = None  # its API's pieces and bodies: the reply stage's, made at its first reply
    started: bool = False  # in the engine; a request waits here while fewer slots are free than it has samples
    first_token_at: float | None = None
    cached_tokens: int = 0  # of its prompt's, from the prefix cache (known at its first token)
    pending: list[Piece] = field(default_factory=list)  # streamed pieces not yet sent
    opened: bool = False  # a chunked HTTP response has started
    sent_at: float | None = None  # when its stream last sent bytes (the reply stage's clock)
    finish_reason: str | None = None  # once every sample has finished (the first sample's), or "cut"
    key: str | None = None  # a resumable stream's (handler.resume.ids): its events carry ids
    points: list[int] = field(default_factory=list)  # a resumable stream's: each sample's, as of the pieces sent
    resume: list[Continuation] | None = None  # a resumed stream's running samples, where the engine takes them on
    resume_id: str | None = None  # once cut: where its record says to resume (the last event's id)

    @property
    def cut(self) -> bool:
        """Ended by the replica's shutdown before it finished (handler.serving.lifecycle.end)."""
        return self.finish_reason == "cut"

    @property
    def usage(self) -> Usage:
        """The client's counts: a resumed stream's engine prompt also holds the tokens sent before
        the cut, so its cached tokens are counted only up to the client's prompt."""
        prompt = len(self.req.prompt_ids)
        return Usage(prompt, sum(s.completion_tokens for s in self.samples), min(self.cached_tokens, prompt))


SendPartial = Callable[[dict[int, Reply]], None]  # streamed pieces now, by batch index
