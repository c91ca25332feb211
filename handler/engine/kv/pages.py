"""Which KV-cache pages hold each slot's positions: one pool of pages for every sequence, handed out
as sequences grow, instead of a fixed max_seq_len positions per slot.

Slot s's positions [j * PAGE, (j + 1) * PAGE) are in page rows[s][j]. A page may be in several
rows (a prefix two sequences share: a request's samples, a prompt the prefix cache holds), counted
by its references. A slot writes only from its own length on, so only a part-filled last page
could be written while shared: the caller copies it first (shared_at, own). The steps read a row as a
tensor of `columns` page indices, padded with the scratch page (index `pages`), where padding
writes land and nothing is read. Pure bookkeeping: the caller copies pages and frees them up.
"""
from __future__ import annotations

import torch
from torch import Tensor

from handler.engine import EngineError
from handler.engine.model.attention import PAGE

Copy = tuple[int, int]  # (source page, destination page): copy the KV of one into the other


class PagesExhausted(EngineError, RuntimeError):
    """No page is free; the caller frees pages other slots hold for the cache, or waits."""


def pages_for(positions: int) -> int:
    """Pages that hold positions [0, positions)."""
    return -(-positions // PAGE)


def page_columns(max_seq_len: int) -> int:
    """A page table row's entries: position max_seq_len too, which padding writes."""
    return max_seq_len // PAGE + 1


class PageTable:
    def __init__(self, pages: int, slots: int, max_seq_len: int):
        self.pages = pages  # page `pages` is the scratch page
        self.columns = page_columns(max_seq_len)
        self._rows: list[list[int]] = [[] for _ in range(slots)]
        self._refs = [0] * pages
        self._free = list(range(pages - 1, -1, -1))  # popped from the end: lowest page first

    @property
    def free(self) -> int:
        return len(self._free)

    def row(self, slot: int) -> list[int]:
        """The pages of `slot`'s positions, in order (do not modify)."""
        return self._rows[slot]

    def missing(self, slot: int, positions: int) -> int:
        """Pages `slot` lacks to hold positions [0, positions)."""
        return max(0, pages_for(positions) - len(self._rows[slot]))

    def grow(self, slot: int, positions: int) -> None:
        """Give `slot` pages until it holds positions [0, positions); PagesExhausted (and nothing
        given) when too few are free."""
        missing = self.missing(slot, positions)
        if missing > len(self._free):
            raise PagesExhausted(f"slot {slot} needs {missing} more pages, {len(self._free)} are free")
        for _ in range(missing):
            self._rows[slot].append(self._take())

    def truncate(self, slot: int, length: int) -> None:
        """Keep `slot`'s positions [0, length) and release the pages after them."""
        row, kept = self._rows[slot], pages_for(length)
        for page in row[kept:]:
            self._release(page)
        del row[kept:]

    def share(self, source: int, slot: int, length: int) -> None:
        """`slot` (emptied first) holds what `source` holds at positions [0, length), by reference."""
        self.truncate(slot, 0)
        self._rows[slot] = list(self._rows[source][:pages_for(length)])
        for page in self._rows[slot]:
            self._refs[page] += 1

    def shared_at(self, slot: int, length: int) -> bool:
        """Whether `slot` writing position `length` would write a page another slot holds too: the
        part-filled page of a slot holding [0, length), shared."""
        row = self._rows[slot]
        return bool(length % PAGE) and len(row) == pages_for(length) and self._refs[row[-1]] > 1

    def own(self, slot: int) -> Copy:
        """`slot`'s last page replaced by a free one of its own; returns the copy to make."""
        if not self._free:
            raise PagesExhausted(f"slot {slot} must copy a shared page and no page is free")
        row = self._rows[slot]
        shared, row[-1] = row[-1], self._take()
        self._release(shared)
        return shared, row[-1]

    def tensor(self, slots: list[int], device: torch.device) -> Tensor:
        """The rows of `slots` as page indices [len(slots), columns], padded with the scratch page."""
        table = torch.full((len(slots), self.columns), self.pages, dtype=torch.long)
        for i, slot in enumerate(slots):
            row = self._rows[slot]
            table[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        return table.to(device)

    def _take(self) -> int:
        page = self._free.pop()
        self._refs[page] = 1
        return page

    def _release(self, page: int) -> None:
        self._refs[page] -= 1
        if not self._refs[page]:
            self._free.append(page)


def own_pages(batch: int, max_seq_len: int) -> Tensor:
    """Page table rows for `batch` sequences stepped without an engine (tests, benches): row b holds
    pages b * columns, b * columns + 1, ... of a cache of at least batch * columns pages."""
    columns = page_columns(max_seq_len)
    return torch.arange(batch * columns).view(batch, columns)
