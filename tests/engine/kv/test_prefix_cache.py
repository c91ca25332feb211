"""The prefix cache's bookkeeping alone: which slot holds which tokens, lookups by block hash
confirmed token by token (shorter prefixes slot by slot), least-recently-used choice."""
from __future__ import annotations

from handler.engine.kv.prefix_cache import BLOCK, PrefixCache, common_prefix

SHARED = list(range(100, 100 + 3 * BLOCK))  # three full blocks


def test_the_longest_shared_prefix_is_found_to_the_token():
    cache = PrefixCache(slots=3)
    cache.extend(0, SHARED[:BLOCK])
    cache.extend(1, [*SHARED, 7, 8, 9])
    assert cache.longest([*SHARED, 7, 8, 1]) == (1, len(SHARED) + 2)


def test_a_prefix_shorter_than_a_block_is_found_by_comparing_the_slots():
    cache = PrefixCache(slots=3)
    cache.extend(0, [5, 6])
    cache.extend(2, SHARED[:3])
    assert cache.longest(SHARED[:4]) == (2, 3)
    assert cache.longest(SHARED[: BLOCK - 1] + [0] * BLOCK) == (2, 3)
    assert cache.longest([9, 9]) == (None, 0)


def test_a_hash_collision_is_caught_by_comparing_tokens():
    cache = PrefixCache(slots=2, block_hash=lambda previous, block: 0)  # every block collides
    cache.extend(0, [1] * 2 * BLOCK)
    assert cache.longest([2] * 2 * BLOCK) == (None, 0)
    assert cache.longest([1] * BLOCK + [2] * BLOCK) == (0, BLOCK)


def test_truncated_tokens_are_no_longer_found():
    cache = PrefixCache(slots=1)
    cache.extend(0, SHARED)
    cache.truncate(0, BLOCK + 3)
    assert cache.held(0) == SHARED[: BLOCK + 3]
    assert cache.longest(SHARED) == (0, BLOCK + 3)
    cache.truncate(0, 0)
    assert cache.longest(SHARED) == (None, 0)


def test_ties_go_to_the_preferred_slot_and_among_limits_the_search():
    cache = PrefixCache(slots=3)
    for slot in range(3):
        cache.extend(slot, SHARED)
    assert cache.longest(SHARED, prefer=2) == (2, len(SHARED))
    assert cache.longest(SHARED, among=[1]) == (1, len(SHARED))
    assert cache.longest(SHARED, among=[]) == (None, 0)


def test_best_slots_gives_each_prompt_the_slot_sharing_most_of_it_longest_first():
    cache = PrefixCache(slots=3)
    cache.extend(0, [1, 2, 3])
    cache.extend(1, [4, 5])
    cache.extend(2, [8])
    # the first prompt shares two tokens with slot 0, the second all three: the second gets it
    assert cache.best_slots([[1, 2, 7], [1, 2, 3], [4, 5, 6]], [0, 1, 2]) == [None, 0, 1]


def test_best_slots_leaves_a_prompt_no_slot_shares_without_one():
    cache = PrefixCache(slots=3)
    cache.extend(0, [1, 2])
    cache.extend(2, [1, 2])
    assert cache.best_slots([[1, 2], [1, 2], [7], []], [0, 1, 2]) == [0, 2, None, None]


def test_the_least_recently_used_slot_is_the_one_written_or_used_longest_ago():
    cache = PrefixCache(slots=3)
    cache.extend(0, [1])
    cache.extend(1, [1])
    cache.extend(2, [1])
    cache.touch(0)
    assert cache.least_recently_used([0, 1, 2]) == 1


def test_a_free_slot_is_chosen_by_prefix_then_by_age():
    cache = PrefixCache(4)
    cache.extend(0, [1, 2, 3])
    cache.extend(1, [7, 8, 9])
    taken = [False, False, False, True]
    assert cache.free_slot(taken, [7, 8, 5]) == 1, "the slot sharing the longest prefix"
    cache.touch(0)
    cache.touch(1)
    assert cache.free_slot(taken, []) == 2, "no prompt (caching off): the least recently used"
    assert cache.free_slot([False, True, False, False], [7, 8, 9]) == 2, "the slot holding it is busy: the oldest free one"


def test_common_prefix_counts_leading_equal_tokens():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
