"""A generation cut at token k and resumed in a fresh engine run (prompt + the k tokens
prefilled, the generator's state restored) equals the uninterrupted run, token for token and
character for character: greedy, seeded, and with logit controls whose state the tokens set."""
from __future__ import annotations

import pytest

from handler.engine.sampling import SamplingParams
from handler.engine.sequence import Continuation

PROMPT = "Once upon a time, in a small village by the sea,"
GREEDY = SamplingParams(max_new_tokens=12, ignore_eos=True)
SEEDED = SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True)
PENALIZED = SamplingParams(max_new_tokens=12, temperature=0.7, seed=5, frequency_penalty=0.8,
                           repetition_penalty=1.3, ignore_eos=True)


def _run(engine, params, cut_at=None, resume=None):
    """(tokens, text, continuation at the cut); cut_at: cancel once this many tokens were generated."""
    ids = engine.tokenizer.encode(PROMPT)
    engine.add_samples("r", ids, [params], resume=None if resume is None else [resume])
    tokens, text = [], ""
    while engine.running:
        for out in engine.step():
            tokens += out.token_ids
            text += out.text
        if cut_at is not None and len(tokens) >= cut_at and engine.running:
            [cut] = engine.continuations("r")
            engine.cancel("r")
            return tokens, text, cut
    return tokens, text, None


@pytest.mark.parametrize("params", [GREEDY, SEEDED, PENALIZED], ids=["greedy", "seeded", "penalized"])
def test_cut_then_resumed_equals_the_uninterrupted_run(engine, params):
    cut_at = 7
    full_tokens, full_text, _ = _run(engine, params)
    tokens, text, cut = _run(engine, params, cut_at=cut_at)
    assert cut is not None and list(cut.output_ids) == tokens and cut.sent_chars == len(text)
    more_tokens, more_text, _ = _run(engine, params, resume=cut)
    assert tokens + more_tokens == full_tokens
    assert text + more_text == full_text


def test_a_client_that_missed_the_last_events_gets_their_text_again(engine):
    """The resume point is the client's (Last-Event-ID), not the cut's: what it did not receive
    is sent first, and nothing is generated twice."""
    full_tokens, full_text, _ = _run(engine, SEEDED)
    tokens, text, cut = _run(engine, SEEDED, cut_at=8)
    assert cut is not None
    held = len(text) // 2
    more_tokens, more_text, _ = _run(engine, SEEDED, resume=Continuation(cut.output_ids, held, cut.rng_state))
    assert tokens + more_tokens == full_tokens
    assert text[:held] + more_text == full_text


def test_an_unseeded_sampled_generation_resumes_with_the_state_it_was_cut_with(engine):
    unseeded = SamplingParams(max_new_tokens=10, temperature=1.0, ignore_eos=True)
    tokens, _, cut = _run(engine, unseeded, cut_at=4)
    assert cut is not None and cut.rng_state is not None
    again = [_run(engine, unseeded, resume=cut)[0] for _ in range(2)]
    assert again[0] == again[1] and len(tokens) + len(again[0]) == 10
