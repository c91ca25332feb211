"""The engine over one budget of KV pages (handler.engine.kv.pages) on the real Transformer with tiny
seeded weights: a request may use the whole context while the budget is smaller than slots x
max_seq_len, a request waits (EngineFull) while pages are promised to running ones and none is
ever evicted, and what idle slots keep for the prefix cache is taken back when pages run short."""
from __future__ import annotations

import pytest

from handler.engine.engine import Engine, EngineFull
from handler.engine.kv.pages import pages_for
from handler.engine.sampling import SamplingParams
from tests.engine.test_engine_prefix import ids, reference, run
from tests.support.tiny_model import tiny_engine

MAX_SEQ = 128  # as test_engine_prefix's reference engine
LONG = "thequickbrownfoxjumpsoverthelazydog" * 3  # 105 tokens


def params(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, ignore_eos=True, logprobs=3)


def tokens(outputs) -> list[list[int]]:
    return [o.token_ids for o in outputs]


@pytest.fixture
def small() -> Engine:
    """4 slots, but KV pages for one whole context and a few pages more."""
    return tiny_engine(slots=4, max_seq_len=MAX_SEQ, pages=pages_for(MAX_SEQ) + 3, prefix_caching=True)


def test_one_request_fills_the_whole_context_of_a_budget_smaller_than_the_slots(small):
    small.add("long", ids(small, LONG), params(MAX_SEQ - len(LONG)))
    assert tokens(run(small)["long"]) == tokens(reference(LONG, MAX_SEQ - len(LONG)))


def test_a_request_waits_while_the_pages_are_promised_and_starts_when_they_are_back(small):
    small.add("long", ids(small, LONG), params(20))  # promised pages_for(125) = 8 of 11
    assert small.free_slots == 3 and not small.fits(40, [params(20)])
    with pytest.raises(EngineFull, match="pages of 16 positions are promised to running requests but 3"):
        small.add("next", ids(small, "abc" * 13), params(20))
    small.add("short", ids(small, "hello"), params(10))  # 15 positions: 1 page
    done = run(small)
    assert small.fits(40, [params(20)])
    assert tokens(done["short"]) == tokens(reference("hello", 10))
    assert tokens(done["long"]) == tokens(reference(LONG, 20))


def test_idle_slots_give_their_pages_back_to_new_prompts():
    engine = tiny_engine(slots=4, max_seq_len=MAX_SEQ, pages=pages_for(MAX_SEQ), prefix_caching=True)
    for text in ("abcdefghijklmnopqrstuvwxyz" * 3, "zyxwvutsrqponmlkjihgfedcba" * 3, LONG):
        engine.add(text, ids(engine, text), params(12))
        assert tokens(run(engine)[text]) == tokens(reference(text, 12))


def test_a_shared_prefix_is_read_from_the_same_pages():
    engine = tiny_engine(slots=4, max_seq_len=MAX_SEQ, prefix_caching=True)
    engine.add("a", ids(engine, LONG[:64] + "sky"), params(2))
    run(engine)
    prefix_pages = engine._memory.table.row(0)[:4]  # a ran alone, in slot 0
    b = ids(engine, LONG[:64] + "red")
    engine.add("b", b, params(2))
    done = run(engine)
    assert done["b"][0].cached_tokens == 64
    slot = next(i for i in range(4) if engine._memory.cache.held(i)[:len(b)] == b)
    assert engine._memory.table.row(slot)[:4] == prefix_pages
    assert tokens(done["b"]) == tokens(reference(LONG[:64] + "red", 2))


def test_a_slot_holding_more_than_its_new_sequence_is_promised_gives_the_rest_back():
    """Else a sequence not yet started would hold pages beyond its promise, which a running one
    that grows could then not find."""
    engine = tiny_engine(slots=1, max_seq_len=MAX_SEQ, pages=pages_for(MAX_SEQ), prefix_caching=True)
    engine.add("long", ids(engine, LONG), params(20))
    run(engine)
    assert len(engine._memory.table.row(0)) == pages_for(len(LONG) + 19)
    engine.add("short", ids(engine, "hello"), params(5))
    assert len(engine._memory.table.row(0)) == 1 and engine._memory.table.free == pages_for(MAX_SEQ) - 1
