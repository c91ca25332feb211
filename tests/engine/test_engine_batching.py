"""Batched generation on the real Transformer with tiny seeded weights (tests/support/tiny_model.py):
every sequence in a batch gets the tokens it would get alone, whatever its slot and length.

The real-checkpoint versions of these (test_engine.py) also compare with transformers; these
check the engine's slots and KV cache alone, in a second.
"""
from __future__ import annotations

import pytest

from handler.engine.engine import Engine, EngineFull
from handler.engine.sampling import SamplingParams
from tests.support.generate import generate
from tests.support.tiny_model import tiny_engine

PROMPTS = ["hello", "abc", "thequickbrownfoxjumps", "z"]


def fixed_length(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, ignore_eos=True)


@pytest.fixture
def engine() -> Engine:
    return tiny_engine(slots=4, max_seq_len=64)


def alone(engine: Engine, ids: list[int], n: int) -> list[int]:
    return generate(engine, [ids], [fixed_length(n)])[0]


def test_a_batch_of_different_lengths_decodes_as_each_sequence_alone(engine):
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
    together = generate(engine, prompts, [fixed_length(16)] * len(prompts))
    assert together == [alone(engine, ids, 16) for ids in prompts]


def test_a_sequence_joining_mid_batch_decodes_as_it_would_alone(engine):
    a, b = (engine.tokenizer.encode(p) for p in PROMPTS[2:4])
    expected = alone(engine, b, 10)
    engine.add("a", a, fixed_length(30))
    for _ in range(5):
        engine.step()
    engine.add("b", b, fixed_length(10))
    got = [t for _ in range(10) for out in engine.step() if out.request_id == "b" for t in out.token_ids]
    assert got == expected


def test_a_slot_freed_and_refilled_serves_the_new_sequence_as_alone(engine):
    """The new sequence reuses a slot whose cache holds another sequence's positions."""
    first, second = (engine.tokenizer.encode(p) for p in PROMPTS[:2])
    expected = alone(engine, second, 8)
    engine.add("first", first, fixed_length(12))
    engine.step()
    engine.cancel("first")
    engine.add("second", second, fixed_length(8))
    got = [t for _ in range(8) for out in engine.step() for t in out.token_ids]
    assert got == expected


def test_a_fixed_seed_gives_the_same_sample_twice(engine):
    ids = engine.tokenizer.encode(PROMPTS[0])
    params = SamplingParams(max_new_tokens=20, temperature=1.0, seed=1234, ignore_eos=True)
    first, second = generate(engine, [ids, ids], [params, params])
    assert first == second


def _run(engine: Engine) -> dict[tuple[str, int], list[int]]:
    got: dict[tuple[str, int], list[int]] = {}
    while engine.running:
        for out in engine.step():
            got.setdefault((out.request_id, out.index), []).extend(out.token_ids)
    return got


def test_samples_of_one_prompt_are_prefilled_once_and_sample_as_alone():
    """n samples: one prefill, its KV copied to the other slots; each sample (its own seed) gets
    the tokens it gets alone, beside a running sequence whose slot sits between theirs."""
    engine = tiny_engine(slots=4, max_seq_len=64)
    ids = engine.tokenizer.encode(PROMPTS[2])
    params = [SamplingParams(max_new_tokens=12, temperature=1.0, seed=s, ignore_eos=True) for s in (1, 2, 3)]
    expected = [generate(engine, [ids], [p])[0] for p in params]
    calls = []
    prefill = engine._prefill
    engine._prefill = lambda tokens, *rest: calls.append(tokens.shape[0]) or prefill(tokens, *rest)
    engine.add("other", engine.tokenizer.encode(PROMPTS[0]), fixed_length(20))
    engine.step()
    engine.add_samples("s", ids, params)
    got = _run(engine)
    assert calls == [1, 1], "one prefill row for the running sequence, one for the three samples"
    assert [got[("s", i)] for i in range(3)] == expected
    assert len({tuple(g) for g in expected}) == 3, "distinct seeds, distinct samples"


def test_samples_need_that_many_free_slots():
    engine = tiny_engine(slots=3, max_seq_len=64)
    engine.add("running", [1, 2], fixed_length(4))
    with pytest.raises(EngineFull, match="2 of 3 slots are free, 3 asked"):
        engine.add_samples("s", [1, 2], [fixed_length(4)] * 3)
    assert engine.free_slots == 2


def test_cancel_frees_every_sample():
    engine = tiny_engine(slots=4, max_seq_len=64)
    engine.add_samples("s", [1, 2], [fixed_length(6)] * 3)
    engine.step()
    engine.cancel("s")
    assert engine.free_slots == 4 and engine.step() == []
