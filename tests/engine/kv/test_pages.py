"""The KV cache's page table (handler.engine.kv.pages): pages handed out as slots grow, taken back
as they shrink, shared by reference, copied before a shared page could be written."""
from __future__ import annotations

import pytest
import torch

from handler.engine.kv.pages import PAGE, PagesExhausted, PageTable, own_pages, page_columns, pages_for


def test_a_slot_grows_page_by_page_from_the_lowest_free_page():
    table = PageTable(pages=6, slots=2, max_seq_len=64)
    table.grow(0, 1)
    assert table.row(0) == [0]
    table.grow(0, PAGE + 1)
    table.grow(1, 2 * PAGE)
    assert (table.row(0), table.row(1), table.free) == ([0, 1], [2, 3], 2)
    assert table.missing(0, 4 * PAGE) == 2 and table.missing(0, PAGE) == 0


def test_growing_past_the_free_pages_gives_nothing_and_says_so():
    table = PageTable(pages=2, slots=2, max_seq_len=64)
    table.grow(0, PAGE)
    with pytest.raises(PagesExhausted, match="slot 1 needs 2 more pages, 1 are free"):
        table.grow(1, 2 * PAGE)
    assert table.row(1) == [] and table.free == 1


def test_truncating_gives_back_the_pages_past_the_length():
    table = PageTable(pages=4, slots=1, max_seq_len=64)
    table.grow(0, 4 * PAGE)
    table.truncate(0, PAGE + 3)
    assert table.row(0) == [0, 1] and table.free == 2
    assert not table.shared_at(0, PAGE + 3), "its own page: written in place"


def test_a_shared_prefix_is_the_same_pages():
    table = PageTable(pages=8, slots=2, max_seq_len=64)
    table.grow(0, 3 * PAGE)
    table.share(0, 1, 2 * PAGE + 5)
    assert table.row(1) == [0, 1, 2] and table.free == 5
    assert table.shared_at(1, 2 * PAGE + 5) and not table.shared_at(1, 3 * PAGE)


def test_owning_a_shared_page_gives_the_copy_to_make():
    table = PageTable(pages=8, slots=2, max_seq_len=64)
    table.grow(0, 3 * PAGE)
    table.share(0, 1, 2 * PAGE + 5)
    assert table.own(1) == (2, 3)
    assert table.row(0) == [0, 1, 2] and table.row(1) == [0, 1, 3] and not table.shared_at(1, 2 * PAGE + 5)


def test_owning_with_no_free_page_says_so():
    table = PageTable(pages=1, slots=2, max_seq_len=64)
    table.grow(0, 5)
    table.share(0, 1, 5)
    with pytest.raises(PagesExhausted, match="slot 1 must copy a shared page and no page is free"):
        table.own(1)


def test_a_shared_page_outlives_the_slot_it_came_from():
    table = PageTable(pages=4, slots=2, max_seq_len=64)
    table.grow(0, 2 * PAGE)
    table.share(0, 1, 2 * PAGE)
    table.truncate(0, 0)
    assert table.free == 2 and table.row(1) == [0, 1]
    table.truncate(1, 0)
    assert table.free == 4


def test_rows_as_a_tensor_are_padded_with_the_scratch_page():
    table = PageTable(pages=3, slots=2, max_seq_len=40)
    table.grow(1, PAGE + 1)
    rows = table.tensor([1, 0], torch.device("cpu"))
    assert rows.tolist() == [[0, 1, 3], [3, 3, 3]] and rows.shape[1] == page_columns(40)


def test_page_counts():
    assert [pages_for(n) for n in (0, 1, PAGE, PAGE + 1)] == [0, 1, 1, 2]
    assert page_columns(2 * PAGE) == 3, "position max_seq_len too, which padding writes"
    assert own_pages(2, PAGE).tolist() == [[0, 1], [2, 3]]
