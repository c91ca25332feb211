"""The generation engine: a fixed set of KV-cache slots, batched prefill and decode.

Requests are added into free slots, then each `step()` prefills the newly added ones (their first
token) and advances every running one by a token. Finished sequences free their slot at once, so
a waiting request can take it before the next step: this is what continuous batching needs. The
engine holds no threads and does no I/O; the TorchServe handler drives it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from handler.engine.grammar import GrammarError, Grammars, Matcher
from handler.engine.sampling import SamplingParams, TokenLogprob, make_generator, sample_next, token_logprob
from handler.engine.tokenizer import Tokenizer

PREFILL_PAD = 16  # prompts are right-padded to a multiple of this: fewer distinct shapes
KV_BUCKET = 64  # decode attends to a multiple of this many positions


def decode_window(positions: int, max_seq_len: int) -> int:
    """How many cached positions a decode step attends to when the furthest sequence needs
    `positions`: the next multiple of KV_BUCKET (compiled graphs take the window as a symbol)."""
    return min(-(-positions // KV_BUCKET) * KV_BUCKET, max_seq_len)


def prefill_width(longest_prompt: int, max_seq_len: int) -> int:
    """The padded prompt width of a prefill whose longest prompt has `longest_prompt` tokens."""
    return min(-(-longest_prompt // PREFILL_PAD) * PREFILL_PAD, max_seq_len)


PrefillFn = Callable[[Tensor, Tensor, Tensor], Tensor]  # (tokens[B,T], slot_ids[B], last_index[B]) -> logits[B,V]
DecodeFn = Callable[[Tensor, Tensor, int], Tensor]  # (tokens[B], input_pos[B], kv_len) -> logits[B,V]
CopyPrefixFn = Callable[[int, int, int], None]  # (src slot, dst slot, positions): KV of 0..positions-1


class EngineFull(RuntimeError):
    """Every slot is taken; the caller keeps the request waiting."""


@dataclass
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    slot: int
    generator: torch.Generator | None
    index: int = 0  # which of its request's samples
    leader: Sequence | None = None  # the request's first sample, whose prefill this one copies
    matcher: Matcher | None = None  # its grammar's state, when params.json_schema constrains it
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    emitted_chars: int = 0
    finish_reason: str | None = None

    @property
    def next_pos(self) -> int:
        # position of the last sampled token, which the next decode step writes into the cache
        return len(self.prompt_ids) + len(self.output_ids) - 1


@dataclass(frozen=True)
class StepOutput:
    request_id: str
    index: int  # which of the request's samples (0 unless it asked for several)
    text: str  # new text since the previous output of this request
    token_ids: tuple[int, ...]
    finish_reason: str | None  # None while running; "stop" or "length" when done
    prompt_tokens: int
    completion_tokens: int
    logprobs: tuple[TokenLogprob, ...] = ()  # of token_ids, when the request asked for them

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Engine:
    def __init__(self, prefill: PrefillFn, decode: DecodeFn, tokenizer: Tokenizer, slots: int, max_seq_len: int,
                 device: torch.device, copy_prefix: CopyPrefixFn | None = None, grammars: Grammars | None = None):
        self._prefill, self._decode, self._copy_prefix = prefill, decode, copy_prefix
        self.grammars = grammars  # None: requests with a json_schema are refused
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len
        self.device = device
        self._slots: list[Sequence | None] = [None] * slots
        self._new: list[Sequence] = []

    # ---- admission -------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        return len(self._slots)

    @property
    def free_slots(self) -> int:
        return self._slots.count(None)

    @property
    def running(self) -> int:
        return len(self._slots) - self.free_slots

    def add(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        self.add_samples(request_id, prompt_ids, [params])

    def add_samples(self, request_id: str, prompt_ids: list[int], params: list[SamplingParams]) -> None:
        """len(params) samples of one prompt (StepOutput.index tells them apart), each in its own
        slot: the prompt is prefilled once and its KV copied to the other slots, which then sample
        on their own (params, seeds)."""
        assert prompt_ids, "empty prompt"
        assert all(len(prompt_ids) + p.max_new_tokens <= self.max_seq_len for p in params), len(prompt_ids)
        assert len(params) == 1 or self._copy_prefix is not None, "no copy_prefix: one sample per prompt"
        if not self.free_slots:
            raise EngineFull(f"all {len(self._slots)} slots are busy")
        if self.free_slots < len(params):
            raise EngineFull(f"{self.free_slots} of {len(self._slots)} slots are free, {len(params)} asked")
        matchers = [self._matcher(p) for p in params]  # GrammarError before any slot is taken
        leader = None
        for index, (p, matcher) in enumerate(zip(params, matchers)):
            slot = self._slots.index(None)
            seq = Sequence(request_id, list(prompt_ids), p, slot, make_generator(p), index, leader, matcher)
            self._slots[slot] = seq
            self._new.append(seq)
            leader = leader or seq

    def _matcher(self, params: SamplingParams) -> Matcher | None:
        if params.json_schema is None:
            return None
        if self.grammars is None:
            raise GrammarError("this engine has no grammar support; send the request without a schema")
        return self.grammars.matcher(params.json_schema)

    def cancel(self, request_id: str) -> None:
        for i, seq in enumerate(self._slots):
            if seq is not None and seq.request_id == request_id:
                self._slots[i] = None
        self._new = [s for s in self._new if s.request_id != request_id]

    # ---- stepping --------------------------------------------------------------------------
    # no_grad, not inference_mode: AOT-compiled steps guard on each tensor's dispatch keys, and
    # tensors made in inference mode lack the autograd key the graphs were captured with.
    @torch.no_grad()
    def step(self) -> list[StepOutput]:
        new, self._new = self._new, []
        running = [s for s in self._slots if s is not None and s not in new]
        outputs = []
        # Decode first: its rows for slots it does not run write junk at position 0, which the
        # prefill of a newly admitted sequence in such a slot then overwrites.
        if running:
            outputs += self._advance(running, self._run_decode(running))
        if new:
            outputs += self._advance(new, self._prefilled(new))
        return outputs

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
        """Offline helper: run prompts to completion (as many at once as there are slots)."""
        pending = list(enumerate(prompts))
        done: dict[str, list[int]] = {}
        while pending or self.running:
            while pending and self.free_slots:
                i, ids = pending.pop(0)
                self.add(str(i), ids, params[i])
            for out in self.step():
                done.setdefault(out.request_id, []).extend(out.token_ids)
        return [done[str(i)] for i in range(len(prompts))]

    def _prefilled(self, new: list[Sequence]) -> Tensor:
        """Next-token logits [len(new), V]: the leaders' from a prefill, each follower its leader's
        row with the leader's KV copied into its slot."""
        leaders = [s for s in new if s.leader is None]
        logits = self._run_prefill(leaders)
        row = {id(s): i for i, s in enumerate(leaders)}
        for s in new:
            if s.leader is not None:
                self._copy_prefix(s.leader.slot, s.slot, len(s.prompt_ids))
        return logits[torch.tensor([row[id(s.leader or s)] for s in new], device=logits.device)]

    def _run_prefill(self, seqs: list[Sequence]) -> Tensor:
        width = prefill_width(max(len(s.prompt_ids) for s in seqs), self.max_seq_len)
        tokens = torch.zeros(len(seqs), width, dtype=torch.long)
        for row, s in enumerate(seqs):
            tokens[row, : len(s.prompt_ids)] = torch.tensor(s.prompt_ids)
        slot_ids = torch.tensor([s.slot for s in seqs])
        last = torch.tensor([len(s.prompt_ids) - 1 for s in seqs])
        return self._prefill(*(t.to(self.device) for t in (tokens, slot_ids, last)))

    def _run_decode(self, seqs: list[Sequence]) -> Tensor:
        # Decode covers slots 0..n-1; free slots inside that range compute rows nobody reads.
        n = max(s.slot for s in seqs) + 1
        tokens = torch.zeros(n, dtype=torch.long)
        pos = torch.zeros(n, dtype=torch.long)
        for s in seqs:
            tokens[s.slot], pos[s.slot] = s.output_ids[-1], s.next_pos
        kv_len = decode_window(int(pos.max()) + 1, self.max_seq_len)
        logits = self._decode(tokens.to(self.device), pos.to(self.device), kv_len)
        return logits[torch.tensor([s.slot for s in seqs], device=logits.device)]

    def _advance(self, seqs: list[Sequence], logits: Tensor) -> list[StepOutput]:
        # logits: [len(seqs), V], this step's own copy (indexed out of the graph's output)
        for row, s in enumerate(seqs):
            if s.matcher is not None:
                s.matcher.mask_logits(logits[row])
        next_ids = sample_next(logits, [s.params for s in seqs], [s.generator for s in seqs])
        return [self._append(s, t, logits, row) for row, (s, t) in enumerate(zip(seqs, next_ids))]

    def _append(self, seq: Sequence, token: int, logits: Tensor, row: int) -> StepOutput:
        new_ids: tuple[int, ...] = ()
        if token in self.tokenizer.eos_ids and not seq.params.ignore_eos:
            seq.finish_reason = "stop"
        else:
            seq.output_ids.append(token)
            new_ids = (token,)
            if seq.matcher is not None:
                seq.matcher.accept(token)
            seq.text = self.tokenizer.decode(seq.output_ids)
            if _cut_at_stop(seq) or (seq.matcher is not None and seq.matcher.complete):
                seq.finish_reason = "stop"
            elif len(seq.output_ids) >= seq.params.max_new_tokens or seq.next_pos + 1 >= self.max_seq_len:
                seq.finish_reason = "length"
        delta = _take_text(seq)
        if seq.finish_reason is not None:
            self._slots[seq.slot] = None
        logprobs = (token_logprob(logits[row], token, seq.params),) if new_ids and seq.params.logprobs is not None else ()
        return StepOutput(seq.request_id, seq.index, delta, new_ids, seq.finish_reason, len(seq.prompt_ids),
                          len(seq.output_ids), logprobs)


def _cut_at_stop(seq: Sequence) -> bool:
    # Only the tail can hold a new match: search from just before the text emitted so far.
    for stop in seq.params.stop:
        at = seq.text.find(stop, max(0, seq.emitted_chars - len(stop)))
        if at != -1:
            seq.text = seq.text[:at]
            return True
    return False


def _take_text(seq: Sequence) -> str:
    """Text safe to emit now: all of it once finished; else hold back an incomplete UTF-8
    character and any tail that could still grow into a stop string."""
    end = len(seq.text)
    if seq.finish_reason is None:
        if seq.text.endswith("\ufffd"):
            end -= 1
        end -= _stop_prefix_len(seq.text[:end], seq.params.stop)
    end = max(end, seq.emitted_chars)
    delta = seq.text[seq.emitted_chars : end]
    seq.emitted_chars = end
    return delta


def _stop_prefix_len(text: str, stops: tuple[str, ...]) -> int:
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest
