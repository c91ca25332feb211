"""What each KV-cache slot holds, so that a new prompt skips the prefix some slot has cached.

A slot's KV stays after its sequence ends, until the slot is given to another one; the engine
records here which tokens have valid KV at positions 0..n-1 of each slot (prompt, then generated
tokens as decode writes them). Lookups go through a hash chain over full blocks of BLOCK tokens
(a block's hash covers every token before it; shorter prefixes are compared slot by slot), and a
match is then confirmed token by token, so a hash collision costs a comparison, never a wrong
prefix. Bounded by the slots and the KV pages: the least recently used free slot is the one given
to a prompt no slot shares, and the engine takes back the pages of the least recently used ones
when pages run short.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

BLOCK = 16  # tokens per hashed block

BlockHash = Callable[[int, tuple[int, ...]], int]  # (hash of the blocks before, this block's tokens) -> hash


def chain_hash(previous: int, block: tuple[int, ...]) -> int:
    return hash((previous, block))


class PrefixCache:
    def __init__(self, slots: int, block_hash: BlockHash = chain_hash):
        self._hash = block_hash
        self._tokens: list[list[int]] = [[] for _ in range(slots)]
        self._chains: list[list[int]] = [[] for _ in range(slots)]  # hash of each full block of the slot's tokens
        self._index: dict[int, set[int]] = {}  # block hash -> slots holding that chain
        self._last_used = [0] * slots
        self._clock = 0

    def held(self, slot: int) -> list[int]:
        """The tokens with valid KV at positions 0.. of `slot` (do not modify)."""
        return self._tokens[slot]

    def extend(self, slot: int, tokens: Iterable[int]) -> None:
        held, chain = self._tokens[slot], self._chains[slot]
        held.extend(tokens)
        while len(chain) < len(held) // BLOCK:
            at = len(chain) * BLOCK
            chain.append(self._hash(chain[-1] if chain else 0, tuple(held[at:at + BLOCK])))
            self._index.setdefault(chain[-1], set()).add(slot)
        self.touch(slot)

    def truncate(self, slot: int, length: int) -> None:
        """Positions from `length` on are about to be overwritten."""
        del self._tokens[slot][length:]
        chain = self._chains[slot]
        while len(chain) > length // BLOCK:
            h = chain.pop()
            slots = self._index.get(h, set())
            slots.discard(slot)
            if not slots:
                self._index.pop(h, None)

    def touch(self, slot: int) -> None:
        self._clock += 1
        self._last_used[slot] = self._clock

    def longest(self, prompt: list[int], prefer: int | None = None,
                among: Iterable[int] | None = None) -> tuple[int | None, int]:
        """(slot, n): the slot (of `among`, default all) whose held tokens share the longest
        prefix with `prompt` and its length n (confirmed token by token); (None, 0) when none
        shares a token. The slots sharing full blocks are found through the hash chain; when no
        slot shares the first block every slot is compared, so a short prompt (a chat turn, a
        completion) reuses what it shares too, as llama.cpp's prompt cache does. Ties go to `prefer`."""
        allowed = set(range(len(self._tokens))) if among is None else set(among)
        candidates: set[int] = set()
        h = 0
        for at in range(0, len(prompt) - BLOCK + 1, BLOCK):
            h = self._hash(h, tuple(prompt[at:at + BLOCK]))
            found = self._index.get(h, set()) & allowed
            if not found:
                break
            candidates = found
        best: tuple[int | None, int] = (None, 0)
        for slot in sorted(candidates or allowed, key=lambda s: (s != prefer, s)):
            n = common_prefix(self._tokens[slot], prompt)
            if n > best[1]:
                best = (slot, n)
        return best

    def best_slots(self, prompts: list[list[int]], slots: list[int]) -> list[int | None]:
        """A slot of `slots` for each prompt, each slot once: the longest shared prefix first (ties
        to the earlier prompt); None for a prompt left with no slot sharing a token with it."""
        matches = sorted((-common_prefix(self._tokens[slot], prompt), i, slot)
                         for i, prompt in enumerate(prompts) for slot in slots)
        best: list[int | None] = [None] * len(prompts)
        for negative_length, i, slot in matches:
            if negative_length < 0 and best[i] is None and slot not in best:
                best[i] = slot
        return best

    def free_slot(self, taken: list[bool], prompt: list[int]) -> int:
        """The slot a new sequence takes (taken[i]: slot i is busy): the free one holding the longest
        prefix of the prompt (empty: prefix caching is off), else the one least recently used. A
        prefix held elsewhere is shared when the prefill starts."""
        free = [i for i, busy in enumerate(taken) if not busy]
        slot, _ = self.longest(prompt, among=free) if prompt else (None, 0)
        return slot if slot is not None else self.least_recently_used(free)

    def least_recently_used(self, slots: Iterable[int]) -> int:
        return min(slots, key=self._last_used.__getitem__)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case, compared in C
        return n
    return next(i for i in range(n) if a[i] != b[i])
