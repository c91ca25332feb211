"""Engine scheduling on counting steps (tests/support/tiny_model.py): slots, steps, stopping.

The counting steps make `last token + 1` the next token, so every expected output is written
out here; no model runs.
"""
from __future__ import annotations

import pytest

from handler.engine.engine import Engine, EngineFull
from handler.engine.sampling import SamplingParams
from handler.engine.sequence import StepOutput
from tests.support.generate import generate
from tests.support.tiny_model import CharTokenizer, counting_engine

TOK = CharTokenizer()


def greedy(n: int, **extra) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, **extra)


def run_to_end(engine: Engine) -> list[StepOutput]:
    outputs = []
    while engine.running:
        outputs += engine.step()
    return outputs


def test_greedy_output_follows_the_counting_steps():
    engine, _ = counting_engine()
    assert TOK.decode(generate(engine, [TOK.encode("abc")], [greedy(4)])[0]) == "defg"


def test_add_takes_a_free_slot():
    engine, _ = counting_engine(slots=2)
    engine.add("a", TOK.encode("a"), greedy(3))
    assert (engine.running, engine.free_slots) == (1, 1)


def test_add_when_every_slot_is_taken_raises_engine_full():
    engine, _ = counting_engine(slots=1)
    engine.add("a", TOK.encode("a"), greedy(3))
    with pytest.raises(EngineFull, match="all 1 slots are busy"):
        engine.add("b", TOK.encode("b"), greedy(3))


def test_prefill_stops_before_the_prompts_last_token_which_decode_takes():
    engine, steps = counting_engine()
    engine.add("a", TOK.encode("abc"), greedy(3))
    run_to_end(engine)
    assert [name for name, _, _ in steps.calls] == ["prefill", "decode", "decode", "decode"]
    assert steps.of("prefill") == [(1, 4)], "a, b: padded to 4"


def test_a_one_token_prompt_needs_no_prefill():
    engine, steps = counting_engine()
    engine.add("a", TOK.encode("a"), greedy(2))
    assert [o.text for o in run_to_end(engine)] == ["b", "c"]
    assert steps.of("prefill") == []


def test_prompts_of_different_lengths_share_one_prefill_padded_to_the_longest():
    engine, steps = counting_engine()
    engine.add("short", TOK.encode("ab"), greedy(2))
    engine.add("long", TOK.encode("abcdefghijklmnopqr"), greedy(2))  # 17 tokens before its last: 5 x 4
    engine.step()
    assert steps.of("prefill") == [(2, 20)]


def test_a_finished_sequence_frees_its_slot_in_the_step_that_finishes_it():
    engine, _ = counting_engine(slots=1)
    engine.add("a", TOK.encode("a"), greedy(1))
    [out] = engine.step()
    assert out.finished and engine.free_slots == 1


def test_a_request_added_while_others_decode_joins_the_next_step():
    engine, steps = counting_engine()
    engine.add("a", TOK.encode("ab"), greedy(5))
    engine.step()
    engine.add("b", TOK.encode("kl"), greedy(5))
    outputs = engine.step()
    assert [(o.request_id, o.text) for o in outputs] == [("a", "d"), ("b", "m")]
    assert [name for name, _, _ in steps.calls] == ["prefill", "decode", "prefill", "decode"]
    assert steps.of("decode") == [(1, 64), (2, 64)], "b's first token in the step its prefill ends"


def test_decode_runs_only_the_running_sequences_whatever_their_slots():
    engine, steps = counting_engine(slots=4)
    for rid in "abc":
        engine.add(rid, TOK.encode(rid), greedy(5))
    engine.step()
    engine.cancel("b")
    engine.step()
    assert steps.of("decode")[-1] == (2, 64), "slots 0 and 2: a batch of two"


def test_cancel_frees_a_running_slot():
    engine, _ = counting_engine(slots=1)
    engine.add("a", TOK.encode("a"), greedy(5))
    engine.step()
    engine.cancel("a")
    assert engine.free_slots == 1 and engine.step() == []


def test_a_request_cancelled_before_its_first_step_is_never_prefilled():
    engine, steps = counting_engine()
    engine.add("a", TOK.encode("a"), greedy(5))
    engine.cancel("a")
    assert engine.step() == [] and steps.calls == []


def test_max_new_tokens_ends_with_length():
    engine, _ = counting_engine()
    engine.add("a", TOK.encode("a"), greedy(3))
    outputs = run_to_end(engine)
    assert [o.completion_tokens for o in outputs] == [1, 2, 3]
    assert [o.finish_reason for o in outputs] == [None, None, "length"]


def test_eos_ends_with_stop_and_adds_no_token():
    engine, _ = counting_engine()
    engine.add("a", TOK.encode("x"), greedy(10))  # y, z, then EOS
    outputs = run_to_end(engine)
    assert "".join(o.text for o in outputs) == "yz"
    assert outputs[-1].finish_reason == "stop" and outputs[-1].token_ids == ()
    assert outputs[-1].completion_tokens == 2


def test_ignore_eos_never_samples_eos_and_runs_to_max_new_tokens():
    engine, _ = counting_engine()
    engine.add("a", TOK.encode("y"), greedy(4, ignore_eos=True))  # z, then EOS masked: a, b
    outputs = run_to_end(engine)
    assert [t for o in outputs for t in o.token_ids] == [26, 1, 2, 3]
    assert "".join(o.text for o in outputs) == "zabc" and outputs[-1].finish_reason == "length"


def test_a_stop_string_cuts_the_text_and_ends_with_stop():
    engine, _ = counting_engine()
    engine.add("a", TOK.encode("a"), greedy(10, stop=("de",)))
    outputs = run_to_end(engine)
    assert "".join(o.text for o in outputs) == "bc" and outputs[-1].finish_reason == "stop"


def test_text_that_may_begin_a_stop_string_is_held_back():
    engine, _ = counting_engine()
    engine.add("a", TOK.encode("a"), greedy(10, stop=("de",)))
    assert [o.text for o in run_to_end(engine)] == ["b", "c", "", ""], "d waits: it may begin \"de\""


def test_held_back_text_is_released_when_the_stop_string_does_not_follow():
    engine, _ = counting_engine()
    engine.add("a", TOK.encode("a"), greedy(5, stop=("dx",)))
    assert [o.text for o in run_to_end(engine)] == ["b", "c", "", "de", "f"]


def test_generate_runs_more_prompts_than_slots():
    engine, steps = counting_engine(slots=2)
    prompts = [TOK.encode(p) for p in ("a", "h", "p")]
    outputs = generate(engine, prompts, [greedy(3)] * 3)
    assert [TOK.decode(o) for o in outputs] == ["bcd", "ijk", "qrs"]
    assert max(batch for _, batch, _ in steps.calls) == 2


def test_a_long_prompt_beside_a_decoding_stream_is_prefilled_in_paced_chunks(monkeypatch):
    """While a sequence decodes, a step prefills only what fits prefill_stall_s at the measured speed."""
    engine, steps = counting_engine(slots=2, max_seq_len=128, prefill_stall_s=0.2)
    ticks = iter(range(10**6))
    monkeypatch.setattr(engine._pace, "_clock", lambda: next(ticks) * 0.5)  # each prefill call: 0.5 s
    engine.add("a", TOK.encode("abcdefgh" * 4), greedy(20))
    engine.step()  # alone: its prompt in one chunk, 31 tokens in 0.5 s (16 ms each)
    assert steps.of("prefill") == [(1, 32)]
    engine.add("b", TOK.encode("z" * 100), greedy(2))
    engine.step()
    assert steps.of("prefill")[-1] == (1, 12), "12 tokens fit 0.2 s beside a's decode steps"
