"""The generation engine: a fixed set of slots over one pool of KV pages, batched prefill and decode.

Requests are added into free slots, then each `step()` prefills the next chunk of the newly added
ones (at most `prefill_chunk` padded tokens a step, so a long prompt does not stall the running
streams) and advances every running one by a token. Prefill stops before a prompt's last token:
that token joins the decode batch, so every first token comes out of the decode graph, in the step
its prompt's prefill ends, whether the prefix cache held the rest or not (the same rounding either
way, so a cached prompt gives the same greedy text; a prompt the cache holds needs no prefill call).
Finished sequences free their slot at once, so a waiting request can take it before the next
step: this is what continuous batching needs.

The KV cache is one budget of pages (handler.engine.kv.pages), not max_seq_len positions per slot:
a sequence gets pages as it grows, so one request may use the whole context while short ones share
the rest. A request is added only when the pages its prompt and max_new_tokens could fill are not
promised to running ones (EngineFull: the caller keeps it waiting), so a running stream never
runs out of pages and none is ever evicted; what idle slots keep for the prefix cache is given up,
least recently used first, when pages run short.

A slot keeps its KV pages after its sequence ends (handler.engine.kv.prefix_cache records which
tokens): with prefix caching a new prompt that shares a prefix with what some slot holds prefills
only the rest, in that slot or sharing the prefix's pages with it. The engine holds no threads and does no
I/O; the TorchServe handler drives it.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from handler.engine import EngineError
from handler.engine.compiled.shapes import PREFILL_PAD, decode_window, prefill_width
from handler.engine.grammar import GrammarError, Grammars, Matcher
from handler.engine.kv.pages import PAGE, pages_for
from handler.engine.kv.prefix_cache import BLOCK, common_prefix
from handler.engine.kv.slot_memory import CopyPageFn, SlotMemory, promised_pages
from handler.engine.next_token import constrain, record
from handler.engine.prefill_pace import PrefillPace
from handler.engine.sampling import LogitControls, SamplingParams, make_generator, sample_next
from handler.engine.sequence import Continuation, Sequence, StepOutput, continuation, restore
from handler.engine.tokenizer import Tokenizer

# (tokens[B,T], pages[B,N], start_pos[B], last_index[B], kv_len) -> logits[B,V]: see Transformer.prefill
PrefillFn = Callable[[Tensor, Tensor, Tensor, Tensor, int], Tensor]
DecodeFn = Callable[[Tensor, Tensor, Tensor, int], Tensor]  # (tokens[B], pages[B,N], input_pos[B], kv_len) -> logits[B,V]


class EngineFull(EngineError, RuntimeError):
    """Too few slots or unpromised KV pages for the request now; the caller keeps it waiting."""


class Engine:
    def __init__(self, prefill: PrefillFn, decode: DecodeFn, tokenizer: Tokenizer, slots: int, max_seq_len: int,
                 device: torch.device, copy_page: CopyPageFn | None = None, grammars: Grammars | None = None,
                 prefill_chunk: int = 512, prefix_caching: bool = False, pages: int | None = None,
                 prefill_stall_s: float | None = None):
        """`pages`: the KV cache's pages of PAGE positions (default: max_seq_len positions per slot),
        at least a whole context's. `prefill_stall_s`: while sequences decode, a step prefills only
        as many tokens as fit this long at the speed its prefill calls measured (None: prefill_chunk)."""
        assert prefill_chunk % PREFILL_PAD == 0, prefill_chunk
        assert copy_page is not None or not prefix_caching, "prefix caching shares pages between slots"
        pages = slots * pages_for(max_seq_len) if pages is None else pages
        assert pages >= pages_for(max_seq_len), f"{pages} pages hold less than one context of {max_seq_len}"
        self._prefill, self._decode = prefill, decode
        self.grammars = grammars  # None: requests with a json_schema are refused
        self.tokenizer = tokenizer
        self._eos_ids = sorted(tokenizer.eos_ids)  # masked for ignore_eos requests
        self.max_seq_len = max_seq_len
        self.device = device
        self.prefill_chunk = prefill_chunk  # padded prompt tokens prefilled per step, all sequences together
        self._pace = PrefillPace(prefill_chunk, prefill_stall_s)
        self.prefix_caching = prefix_caching
        self._slots: list[Sequence | None] = [None] * slots
        self._memory = SlotMemory(slots, pages, max_seq_len, copy_page)
        self._waiting: list[Sequence] = []  # added, prompt not yet all prefilled; in arrival order

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

    @property
    def pages(self) -> int:
        return self._memory.table.pages

    def fits(self, prompt_len: int, params: list[SamplingParams]) -> bool:
        """Whether add_samples would take these samples now: slots free and pages unpromised."""
        need = sum(promised_pages(prompt_len, p.max_new_tokens) for p in params)
        return self.free_slots >= len(params) and need <= self._unpromised()

    def _unpromised(self) -> int:
        """Pages no running sequence may still fill: each is promised what its prompt and
        max_new_tokens could (handler.engine.kv.slot_memory)."""
        promised = sum(promised_pages(len(s.prompt_ids), s.params.max_new_tokens) for s in self._slots if s is not None)
        return self.pages - promised

    def add(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        self.add_samples(request_id, prompt_ids, [params])

    def add_samples(self, request_id: str, prompt_ids: list[int], params: list[SamplingParams],
                    resume: list[Continuation] | None = None) -> None:
        """len(params) samples of one prompt (StepOutput.index tells them apart), each in its own
        slot: the prompt is prefilled once and its KV copied to the other slots, which then sample
        on their own (params, seeds). `resume`: each sample goes on from where it was cut (one
        Continuation per params, its index the sample's); each prefills its own tokens."""
        assert prompt_ids, "empty prompt"
        assert resume is None or len(resume) == len(params), (len(params), resume)
        assert all(len(prompt_ids) + p.max_new_tokens <= self.max_seq_len for p in params), len(prompt_ids)
        assert len(params) == 1 or resume is not None or self._memory.can_share, "no copy_page: one sample per prompt"
        if not self.free_slots:
            raise EngineFull(f"all {len(self._slots)} slots are busy")
        if self.free_slots < len(params):
            raise EngineFull(f"{self.free_slots} of {len(self._slots)} slots are free, {len(params)} asked")
        if not self.fits(len(prompt_ids), params):
            raise EngineFull(f"the KV cache's {self.pages} pages of {PAGE} positions are promised to running "
                             f"requests but {self._unpromised()}")
        matchers = [self._matcher(p) for p in params]  # GrammarError before any slot is taken
        leader = None
        for index, (p, matcher) in enumerate(zip(params, matchers)):
            at = resume[index] if resume is not None else None
            context = prompt_ids if at is None else list(prompt_ids) + list(at.output_ids)
            slot = self._free_slot(context if leader is None else [])
            seq = Sequence(request_id, list(prompt_ids), p, slot, make_generator(p), index if at is None else at.index,
                           leader, matcher, LogitControls.for_params(p, prompt_ids, self.tokenizer.eos_ids))
            if at is not None:
                restore(seq, at, self.tokenizer.decode)
            self._slots[slot] = seq
            # What the slot holds past the pages promised to its new sequence is none of its prefix:
            # given back now, so running sequences hold no more pages than their promises.
            self._memory.truncate(slot, promised_pages(len(prompt_ids), p.max_new_tokens) * PAGE, self._idle())
            self._waiting.append(seq)
            if resume is None:  # resumed samples have tokens of their own: none copies another's prefix
                leader = leader or seq

    def continuations(self, request_id: str) -> list[Continuation]:
        """Where each of the request's running samples could go on, at this step (none: not running)."""
        running = [s for s in self._slots if s is not None and s.request_id == request_id]
        return [continuation(s) for s in sorted(running, key=lambda s: s.index)]

    def _free_slot(self, prompt_ids: list[int]) -> int:
        taken = [s is not None for s in self._slots]
        return self._memory.cache.free_slot(taken, prompt_ids if self.prefix_caching else [])

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
        self._waiting = [s for s in self._waiting if s.request_id != request_id]

    # ---- stepping --------------------------------------------------------------------------
    # no_grad, not inference_mode: AOT-compiled steps guard on each tensor's dispatch keys, and
    # tensors made in inference mode lack the autograd key the graphs were captured with.
    @torch.no_grad()
    def step(self) -> list[StepOutput]:
        chunks = self._schedule_prefill(self._pace.budget(any(s is not None and s.decoding for s in self._slots)))
        if chunks:
            with self._pace.timing(sum(n for _, _, n in chunks)):
                logits = self._run_prefill(chunks)
            self._prefilled(chunks, logits)
        self._start_decoding()
        running = [s for s in self._slots if s is not None and s.decoding]
        return self._advance(running, self._run_decode(running)) if running else []

    # ---- prefill: which chunks, from where --------------------------------------------------
    def _schedule_prefill(self, budget: int) -> list[tuple[Sequence, int, int]]:
        """This step's chunks (sequence, first position, tokens), first come first served, while
        the padded batch fits in `budget` tokens; a prompt's last token is left to decode. A request's other samples wait for its
        first (they copy its prefix); a prompt that shares a longer prefix with one being
        prefilled than any slot holds waits for it, to prefill only the rest."""
        self._rebind_unstarted()
        picked: list[Sequence] = []
        width = 0
        for s in self._waiting:
            if s.leader is not None:
                continue
            if not s.started:
                if self._waits_for_prefix(s):
                    continue
                self._start(s)
            if s.prefilled == s.prefill_end:
                continue
            wider = max(width, prefill_width(s.prefill_end - s.prefilled, budget))
            if picked and (len(picked) + 1) * wider > budget:
                break
            picked.append(s)
            width = wider
        return [(s, s.prefilled, min(s.prefill_end - s.prefilled, width)) for s in picked]

    def _rebind_unstarted(self) -> None:
        """Hand the slots of the sequences not yet started out again before any starts (and so
        overwrites what its slot holds), each prompt to the one holding most of it. add() binds each
        request alone: a burst into an idle engine took slots 0, 1, ... in arrival order, each start
        overwriting a prompt that a later request then prefilled again (docs/benchmarks.md)."""
        unstarted = [s for s in self._waiting if not s.started]
        if not self.prefix_caching or len(unstarted) < 2:
            return
        slots = sorted(s.slot for s in unstarted)
        # a sample after a request's first copies its prefix: any slot does
        best = self._memory.cache.best_slots([s.context if s.leader is None else [] for s in unstarted], slots)
        rest = iter(slot for slot in slots if slot not in best)
        for s, slot in zip(unstarted, best):
            s.slot = next(rest) if slot is None else slot
            self._slots[s.slot] = s

    def _waits_for_prefix(self, seq: Sequence) -> bool:
        if not self.prefix_caching:
            return False
        _, cached = self._memory.cache.longest(seq.context)
        return any(common_prefix(s.context, seq.context) >= cached + BLOCK
                   for s in self._waiting if s.started and s.leader is None)

    def _start(self, seq: Sequence) -> None:
        """Settle the cached prefix the sequence's prefill starts after (up to the prompt's last
        token, which decode takes)."""
        seq.started = True
        seq.prefilled = seq.cached_tokens = self._memory.settle(seq.slot, seq.context, seq.prefill_end, self._idle(),
                                                                self.prefix_caching)

    def _idle(self) -> list[int]:
        return [i for i, s in enumerate(self._slots) if s is None]

    def _run_prefill(self, chunks: list[tuple[Sequence, int, int]]) -> Tensor:
        width = prefill_width(max(n for _, _, n in chunks), min(self.prefill_chunk, self.max_seq_len))
        tokens = torch.zeros(len(chunks), width, dtype=torch.long)
        idle = self._idle()
        for row, (s, start, n) in enumerate(chunks):
            tokens[row, :n] = torch.tensor(s.context[start:start + n])
            self._memory.grow(s.slot, start + n, idle)
        pages = self._memory.table.tensor([s.slot for s, _, _ in chunks], self.device)
        start_pos = torch.tensor([start for _, start, _ in chunks])
        last = torch.tensor([n - 1 for _, _, n in chunks])
        kv_len = decode_window(max(start + n for _, start, n in chunks), self.max_seq_len)
        tokens, start_pos, last = (t.to(self.device) for t in (tokens, start_pos, last))
        return self._prefill(tokens, pages, start_pos, last, kv_len)

    def _prefilled(self, chunks: list[tuple[Sequence, int, int]], logits: Tensor) -> None:
        # logits (of each chunk's last row) unused: a prompt's last token is decoded
        for s, start, n in chunks:
            s.prefilled = start + n
            self._memory.cache.extend(s.slot, s.context[start:start + n])

    def _start_decoding(self) -> None:
        """Each request whose prompt is prefilled up to its last token joins decode, with its
        other samples, the prefill's KV copied into their slots."""
        for s in [s for s in self._waiting if s.started and s.leader is None and s.prefilled == s.prefill_end]:
            for f in [s] + [f for f in self._waiting if f.leader is s]:
                if f is not s:
                    self._memory.share(s.slot, f.slot, f.context[:f.prefill_end], self._idle())
                    f.prefilled, f.started, f.cached_tokens = f.prefill_end, True, s.cached_tokens
                f.decoding = True
        self._waiting = [s for s in self._waiting if not s.decoding]

    # ---- decode ----------------------------------------------------------------------------
    def _run_decode(self, seqs: list[Sequence]) -> Tensor:
        idle = self._idle()
        for s in seqs:
            self._memory.grow(s.slot, s.next_pos + 1, idle)
        tokens = torch.tensor([s.last_token for s in seqs])
        pos = torch.tensor([s.next_pos for s in seqs])
        kv_len = decode_window(max(s.next_pos for s in seqs) + 1, self.max_seq_len)
        logits = self._decode(tokens.to(self.device), self._memory.table.tensor([s.slot for s in seqs], self.device),
                              pos.to(self.device), kv_len)
        for s in seqs:
            self._memory.cache.extend(s.slot, [s.last_token])
        return logits

    def _advance(self, seqs: list[Sequence], logits: Tensor) -> list[StepOutput]:
        # logits: [len(seqs), V], row i sequence i's
        constrain(seqs, logits, self._eos_ids)
        next_ids = sample_next(logits, [s.params for s in seqs], [s.generator for s in seqs])
        outputs = [record(s, t, logits[row], self.tokenizer, self.max_seq_len) for row, (s, t) in enumerate(zip(seqs, next_ids))]
        for s in seqs:
            if s.finish_reason is not None:
                self._slots[s.slot] = None  # its pages stay, for the prefix cache
        return outputs
