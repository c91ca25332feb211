"""A decode step's next token for each sequence: its logits constrained (logit controls, a grammar,
no end-of-text under ignore_eos) before sampling, then the sampled token recorded: the text it adds,
whether a stop, the grammar, the length or the context ends the sequence, and its log-probability."""
from __future__ import annotations

from torch import Tensor

from handler.engine.sampling import token_logprob
from handler.engine.sequence import Sequence, StepOutput, cut_at_stop, take_text
from handler.engine.tokenizer import Tokenizer


def constrain(seqs: list[Sequence], logits: Tensor, eos_ids: list[int]) -> None:
    """Each sequence's row of logits [len(seqs), V], in place, as its controls and grammar allow."""
    for row, s in enumerate(seqs):
        if s.controls is not None:
            s.controls.apply(logits[row])
        if s.matcher is not None:
            s.matcher.mask_logits(logits[row])
        if s.params.ignore_eos:  # never sampled, as llama.cpp does: no empty end-of-turn tokens mid-text
            logits[row, eos_ids] = float("-inf")


def record(seq: Sequence, token: int, logits: Tensor, tokenizer: Tokenizer, max_seq_len: int) -> StepOutput:
    """`token`, sampled from `logits` [V], appended to `seq` (or ending it), as the step's output."""
    new_ids: tuple[int, ...] = ()
    if seq.controls is not None:
        seq.controls.accept(token)
    if (token in tokenizer.eos_ids and not seq.params.ignore_eos) or token in seq.params.stop_token_ids:
        seq.finish_reason = "stop"
    else:
        seq.output_ids.append(token)
        new_ids = (token,)
        if seq.matcher is not None:
            seq.matcher.accept(token)
        seq.text = tokenizer.decode(seq.output_ids)
        if cut_at_stop(seq) or (seq.matcher is not None and seq.matcher.complete):
            seq.finish_reason = "stop"
        elif len(seq.output_ids) >= seq.params.max_new_tokens or seq.next_pos + 1 >= max_seq_len:
            seq.finish_reason = "length"
    delta = take_text(seq)
    logprobs = (token_logprob(logits, token, seq.params),) if new_ids and seq.params.logprobs is not None else ()
    return StepOutput(seq.request_id, seq.index, delta, new_ids, seq.finish_reason, len(seq.prompt_ids),
                      len(seq.output_ids), logprobs, seq.cached_tokens)
