"""Chunked prefill and prefix caching on the real Transformer with tiny seeded weights
(tests/support/tiny_model.py): a prompt prefilled in chunks, or after a prefix taken from the
cache, gets the tokens and log-probabilities of one prefilled whole, from scratch."""
from __future__ import annotations

import pytest

from handler.engine.engine import Engine
from handler.engine.kv.prefix_cache import PrefixCache
from handler.engine.sampling import SamplingParams
from handler.engine.sequence import StepOutput
from tests.support.tiny_model import tiny_engine

SYSTEM = "youareahelpfulassistantanswerbrieflyandkindly"  # 45 tokens: two full blocks and some
MAX_SEQ = 128


def params(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, ignore_eos=True, logprobs=3)


@pytest.fixture
def cached() -> Engine:
    return tiny_engine(slots=4, max_seq_len=MAX_SEQ, prefix_caching=True)


def ids(engine: Engine, text: str) -> list[int]:
    return engine.tokenizer.encode(text)


def collect(outputs: list[StepOutput], into: dict[str, list[StepOutput]]) -> None:
    for out in outputs:
        into.setdefault(out.request_id, []).append(out)


def run(engine: Engine) -> dict[str, list[StepOutput]]:
    done: dict[str, list[StepOutput]] = {}
    while engine.running:
        collect(engine.step(), done)
    return done


def reference(text: str, n: int) -> list[StepOutput]:
    """The request alone on a fresh engine: no cache, the prompt in one prefill."""
    engine = tiny_engine(slots=4, max_seq_len=MAX_SEQ)
    engine.add("ref", ids(engine, text), params(n))
    return run(engine)["ref"]


def assert_same_generation(got: list[StepOutput], expected: list[StepOutput]) -> None:
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    for a, b in zip(got, expected):
        for x, y in zip(a.logprobs, b.logprobs):
            assert x.logprob == pytest.approx(y.logprob, abs=1e-5)
            assert [t for t, _ in x.top] == [t for t, _ in y.top]


def test_a_prompt_sharing_a_finished_requests_prefix_prefills_only_the_rest(cached):
    cached.add("a", ids(cached, SYSTEM + "whatisthesky"), params(4))
    run(cached)
    cached.add("b", ids(cached, SYSTEM + "nameacolor"), params(6))
    got = run(cached)["b"]
    assert got[0].cached_tokens == len(SYSTEM)
    assert_same_generation(got, reference(SYSTEM + "nameacolor", 6))


def test_a_repeated_prompt_shorter_than_a_block_prefills_only_its_last_token(cached):
    cached.add("a", ids(cached, "nameacolor"), params(4))  # 10 tokens: no full block
    run(cached)
    cached.add("b", ids(cached, "nameacolor"), params(4))
    got = run(cached)["b"]
    assert got[0].cached_tokens == len("nameacolor") - 1  # the last token is decoded
    assert_same_generation(got, reference("nameacolor", 4))


def test_a_prompt_the_cache_holds_up_to_its_last_token_joins_decode_without_a_prefill_call(cached):
    cached.add("a", ids(cached, "nameacolor"), params(2))
    run(cached)
    calls = []
    prefill = cached._prefill
    cached._prefill = lambda tokens, *rest: calls.append(tokens.shape) or prefill(tokens, *rest)
    cached.add("b", ids(cached, "nameacolor"), params(2))
    assert [o.token_ids for o in run(cached)["b"]] == [o.token_ids for o in reference("nameacolor", 2)]
    assert calls == []


def test_one_client_taking_turns_between_prompts_keeps_each_cached(cached):
    """A lone request always runs in slot 0; what slot 0 held is parked in a free slot first."""
    for text in ("nameacolor", SYSTEM + "whatisthesky"):
        cached.add(text, ids(cached, text), params(3))
        run(cached)
    cached.add("again", ids(cached, "nameacolor"), params(3))
    got = run(cached)["again"]
    assert got[0].cached_tokens == len("nameacolor") - 1
    assert_same_generation(got, reference("nameacolor", 3))
    cached.add("and again", ids(cached, SYSTEM + "whatisthesky"), params(3))
    assert run(cached)["and again"][0].cached_tokens == len(SYSTEM + "whatisthesky") - 1


def test_a_prefix_is_copied_from_a_sequence_still_running(cached):
    cached.add("a", ids(cached, SYSTEM + "tellmeastory"), params(30))
    done: dict[str, list[StepOutput]] = {}
    for _ in range(3):
        collect(cached.step(), done)
    cached.add("b", ids(cached, SYSTEM + "nameacolor"), params(6))
    while cached.running:
        collect(cached.step(), done)
    assert done["b"][0].cached_tokens == len(SYSTEM)
    assert_same_generation(done["b"], reference(SYSTEM + "nameacolor", 6))
    assert_same_generation(done["a"], reference(SYSTEM + "tellmeastory", 30))


def test_prompts_sharing_a_prefix_added_together_compute_it_once(cached):
    cached.add("a", ids(cached, SYSTEM + "one"), params(3))
    cached.add("b", ids(cached, SYSTEM + "two"), params(3))
    done = run(cached)
    assert (done["a"][0].cached_tokens, done["b"][0].cached_tokens) == (0, len(SYSTEM))
    assert_same_generation(done["b"], reference(SYSTEM + "two", 3))


def test_a_colliding_hash_never_serves_another_prompts_prefix(cached):
    cached._memory.cache = PrefixCache(cached.slots, block_hash=lambda previous, block: 0)  # every block collides
    cached.add("a", ids(cached, "a" * 40), params(3))
    run(cached)
    cached.add("b", ids(cached, "b" * 40), params(3))
    got = run(cached)["b"]
    assert got[0].cached_tokens == 0
    assert_same_generation(got, reference("b" * 40, 3))


def test_idle_slots_keep_their_cached_prefix_while_others_decode(cached):
    """Other sequences' decode steps (and their padding writes) never write over what an idle
    slot holds."""
    cached.add("a", ids(cached, SYSTEM + "short"), params(1))  # slot 0, done after its prefill
    cached.add("c", ids(cached, "keepsdecoding"), params(20))  # slot 1, decoding while slot 0 is idle
    for _ in range(5):
        cached.step()
    cached.add("b", ids(cached, SYSTEM + "again"), params(5))
    got = run(cached)["b"]
    assert got[0].cached_tokens == len(SYSTEM)
    assert_same_generation(got, reference(SYSTEM + "again", 5))


def test_chunked_prefill_gives_the_generation_of_one_prefill():
    engine = tiny_engine(slots=4, max_seq_len=MAX_SEQ, prefill_chunk=16)
    engine.add("a", ids(engine, SYSTEM + "andmore"), params(5))
    assert_same_generation(run(engine)["a"], reference(SYSTEM + "andmore", 5))


def test_a_long_prompt_is_prefilled_between_decode_steps_of_the_running():
    engine = tiny_engine(slots=4, max_seq_len=MAX_SEQ, prefill_chunk=16)
    engine.add("running", ids(engine, "abc"), params(20))
    engine.step()
    engine.add("long", ids(engine, SYSTEM), params(2))  # 45 tokens: chunks of 16, 16, 13
    steps = [engine.step() for _ in range(3)]
    assert all([o.request_id for o in outs] == ["running"] for outs in steps[:2])
    assert [o.request_id for o in steps[2]] == ["running", "long"], "the last chunk gives its first token"


def test_a_request_cancelled_mid_prefill_leaves_what_it_computed_usable():
    engine = tiny_engine(slots=4, max_seq_len=MAX_SEQ, prefill_chunk=16, prefix_caching=True)
    engine.add("gone", ids(engine, SYSTEM + "x"), params(3))
    engine.step()
    engine.step()  # 32 of its 46 tokens prefilled
    engine.cancel("gone")
    engine.add("b", ids(engine, SYSTEM + "y"), params(3))
    got = run(engine)["b"]
    assert got[0].cached_tokens == 32
    assert_same_generation(got, reference(SYSTEM + "y", 3))


def test_a_burst_into_an_idle_engine_finds_each_prompt_where_a_slot_holds_it(cached):
    """Requests added together start in the slots holding their prompts, whatever their order: taken
    in order, each start overwrote a prompt that a later request then prefilled again."""
    texts = ["nameacolor", "tellmeastory", "whatisthesky", "countto"]
    for text in texts:  # slots 0-3
        cached.add(text, ids(cached, text), params(2))
    run(cached)
    calls = []
    prefill = cached._prefill
    cached._prefill = lambda tokens, *rest: calls.append(tokens.shape) or prefill(tokens, *rest)
    for text in reversed(texts):
        cached.add("again " + text, ids(cached, text), params(2))
    done = run(cached)
    assert calls == []
    for text in texts:
        assert done["again " + text][0].cached_tokens == len(text) - 1
        assert_same_generation(done["again " + text], reference(text, 2))
