"""What each slot holds of the KV cache: its tokens (handler.engine.kv.prefix_cache) and the pages they
are on (handler.engine.kv.pages).

The engine promises a sequence, when it is added, the pages its prompt and max_new_tokens could
fill, and adds one only while enough pages are unpromised (Engine.fits). The pages running
sequences hold are within their promises, so every other page is free or held by an idle slot for
the prefix cache, and a running sequence that grows always finds its page here: taken back from
the least recently used idle slots where none is free. No running sequence is ever evicted.
"""
from __future__ import annotations

from collections.abc import Callable

from handler.engine.kv.pages import PAGE, PagesExhausted, PageTable, pages_for
from handler.engine.kv.prefix_cache import PrefixCache

CopyPageFn = Callable[[int, int], None]  # (source page, destination page): every layer's KV


def promised_pages(prompt_len: int, max_new_tokens: int) -> int:
    """The pages a sequence is promised at its add: what its prompt and max_new_tokens could fill."""
    return pages_for(prompt_len + max_new_tokens)


class SlotMemory:
    def __init__(self, slots: int, pages: int, max_seq_len: int, copy_page: CopyPageFn | None):
        self.cache = PrefixCache(slots)  # what each slot holds, kept track of with caching off too
        self.table = PageTable(pages, slots, max_seq_len)  # which pages hold it
        self._copy_page = copy_page  # None: nothing is ever shared (no prefix caching, one sample a prompt)
        self._slots = slots

    @property
    def can_share(self) -> bool:
        return self._copy_page is not None

    def settle(self, slot: int, context: list[int], end: int, idle: list[int], caching: bool) -> int:
        """Before `slot` prefills `context`: the length of the prefix it starts after (at most
        `end`), what its own slot holds or what another slot holds, the pages shared (down to a
        whole page when the part-filled one cannot be copied). `idle`: the free slots."""
        if caching:
            source, n = self.cache.longest(context, prefer=slot)
            n = min(n, end)
            self._park(slot, keep=n if source == slot else 0, busy=source, idle=idle)
        else:
            source, n = None, 0
        if source is not None and n % PAGE and not self.free_up(1, idle, keep={source, slot}):
            n -= n % PAGE
        if source is not None and source != slot and n > 0:
            self.share(source, slot, context[:n], idle)
        else:
            self.truncate(slot, n, idle)
        return n

    def _park(self, slot: int, keep: int, busy: int | None, idle: list[int]) -> None:
        """Before `slot`'s tokens after `keep` are overwritten, share what it holds with the least
        recently used idle slot (not `busy`, the new prompt's source), unless another slot holds
        it too: the cache keeps up to one prefix a slot however few requests run at once, as
        llama.cpp's prompt cache does. Only while at least half the slots are idle: under load
        prompts stay spread over the slots anyway."""
        held = self.cache.held(slot)
        if len(held) <= keep or len(idle) * 2 < self._slots:
            return
        others = [i for i in range(self._slots) if i != slot]
        if self.cache.longest(held, among=others)[1] >= len(held):
            return
        spare = [i for i in idle if i not in (slot, busy)]
        if not spare:
            return
        parked = self.cache.least_recently_used(spare)
        if self.free_up(1, idle, keep={slot, parked} | ({busy} if busy is not None else set())):
            self.share(slot, parked, list(held), idle)

    def share(self, source: int, slot: int, tokens: list[int], idle: list[int]) -> None:
        """`slot` holds `tokens`, the first positions of slot `source`: its pages shared, a
        part-filled last one copied."""
        self.table.share(source, slot, len(tokens))
        self._own_last(slot, len(tokens), idle, keep={source, slot})
        self.cache.truncate(slot, 0)
        self.cache.extend(slot, tokens)
        self.cache.touch(source)

    def truncate(self, slot: int, length: int, idle: list[int]) -> None:
        """`slot`'s positions from `length` on are about to be overwritten."""
        self.cache.truncate(slot, length)
        self.table.truncate(slot, length)
        self._own_last(slot, length, idle, keep={slot})

    def _own_last(self, slot: int, length: int, idle: list[int], keep: set[int]) -> None:
        """Copy the page `slot` writes position `length` into where another slot holds it too."""
        if not self.table.shared_at(slot, length):
            return
        assert self._copy_page is not None, "pages are shared only by prefix caching and samples"
        if not self.free_up(1, idle, keep):
            raise PagesExhausted(f"no KV page is free to copy slot {slot}'s shared page into")
        self._copy_page(*self.table.own(slot))

    def grow(self, slot: int, positions: int, idle: list[int]) -> None:
        """Pages for `slot`'s positions [0, positions), taken back from idle slots where needed."""
        missing = self.table.missing(slot, positions)
        if not self.free_up(missing, idle, keep={slot}):
            raise PagesExhausted(f"slot {slot} needs {missing} more KV pages and {self.table.free} are free: "
                                 "the pages promised at admission must be there")
        self.table.grow(slot, positions)

    def free_up(self, pages: int, idle: list[int], keep: set[int]) -> bool:
        """At least `pages` pages free, taking back what idle slots (not `keep`) hold for the prefix
        cache, least recently used first; False when even that is not enough."""
        holding = [i for i in idle if i not in keep and self.table.row(i)]
        while self.table.free < pages and holding:
            oldest = self.cache.least_recently_used(holding)
            holding.remove(oldest)
            self.cache.truncate(oldest, 0)
            self.table.truncate(oldest, 0)
        return self.table.free >= pages
