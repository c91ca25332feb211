"""ts_llm::attention against attention in float64: one query (decode) and a chunk of queries
(prefill), grouped heads, contexts inside one block and across several, bfloat16 and float32 caches
read through the KV cache's pages (in any order) and strides, masks that hide positions (causal
chunks, a sliding window, a sequence's unwritten tail), and the same bits whatever the batch, the
chunk, the pages or the threads; and the checks that keep bad tensors out of C."""
from __future__ import annotations

import pytest
import torch

from handler.engine.kernels import build
from handler.engine.kernels.attention import attention as paged_attention

PAGE = 16


def _pages(keys, values, order=None):
    """Dense keys and values [B, KV, S, D] as the engine passes them: pages [P, KV, PAGE, D] of a larger
    cache (strided), in the order `order` (default: shuffled), and each sequence's page table [B, N]."""
    b, kv, s, d = keys.shape
    n = -(-s // PAGE)
    order = torch.randperm(b * n) if order is None else order
    caches = []
    for dense in (keys, values):
        cache = torch.zeros(b * n, kv, PAGE + 3, d, dtype=dense.dtype)[:, :, :PAGE]
        padded = torch.zeros(b, kv, n * PAGE, d, dtype=dense.dtype)
        padded[:, :, :s] = dense
        cache[order] = padded.view(b, kv, n, PAGE, d).transpose(1, 2).reshape(b * n, kv, PAGE, d)
        caches.append(cache)
    return caches[0], caches[1], order.view(b, n)


def attention(q, keys, values, visible, scale, order=None):
    """The kernel on dense keys and values, paged first. visible [B, T, S]."""
    k, v, table = _pages(keys, values, order)
    return paged_attention(q, k, v, table, visible, scale)


def decode_attention(q, keys, values, visible, scale):
    """One query per sequence, as Attention.decode calls it: visible [B, S]."""
    return attention(q, keys, values, visible[:, None], scale)


def _reference(q, keys, values, visible, scale):
    """q [B, H, T, D]; visible [B, T, S] (or [B, S] for one query)."""
    h, kv = q.shape[1], keys.shape[1]
    k = keys.double().repeat_interleave(h // kv, dim=1)  # [B, H, S, D]
    v = values.double().repeat_interleave(h // kv, dim=1)
    scores = (q.double() @ k.transpose(-1, -2)) * scale  # [B, H, T, S]
    mask = visible[:, None, None, :] if visible.dim() == 2 else visible[:, None]
    return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v


def _cache(b, kv, s, d, dtype):
    """Dense keys and values [B, KV, S, D] (attention() pages them)."""
    return torch.randn(b, kv, s, d).to(dtype), torch.randn(b, kv, s, d).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("b,h,kv,s,d", [(1, 9, 3, 7, 64), (3, 8, 2, 300, 64), (2, 4, 4, 600, 40), (1, 32, 8, 1030, 128)])
def test_matches_attention_in_float64(dtype, b, h, kv, s, d):
    torch.manual_seed(b * s + d)
    q = torch.randn(b, h, 1, d).to(dtype)
    keys, values = _cache(b, kv, s, d, dtype)
    visible = torch.arange(s)[None, :] <= torch.randint(0, s, (b,))[:, None]
    out = decode_attention(q, keys, values, visible, d**-0.5)
    assert out.shape == (b, h, 1, d) and out.dtype == dtype
    ref = _reference(q, keys, values, visible, d**-0.5)
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-5  # bf16: the output's own rounding
    assert (out.double() - ref).abs().max() < tolerance


def test_sees_only_the_visible_positions():
    torch.manual_seed(1)
    q = torch.randn(1, 4, 1, 32)
    keys, values = _cache(1, 2, 700, 32, torch.float32)
    window = (torch.arange(700) > 400) & (torch.arange(700) <= 650)  # a sliding window: blocks 0 and 1 all hidden
    out = decode_attention(q, keys, values, window[None], 0.3)
    assert (out.double() - _reference(q, keys, values, window[None], 0.3)).abs().max() < 1e-5
    changed = keys.clone()
    changed[:, :, :400] = 100.0  # what it must not see
    assert torch.equal(out, decode_attention(q, changed, values, window[None], 0.3))


def test_a_row_that_sees_nothing_gets_zeros():
    q = torch.randn(1, 2, 1, 16)
    keys, values = _cache(1, 1, 20, 16, torch.float32)
    assert torch.equal(decode_attention(q, keys, values, torch.zeros(1, 20, dtype=torch.bool), 1.0), torch.zeros(1, 2, 1, 16))


def test_a_rows_bits_do_not_depend_on_the_batch():
    torch.manual_seed(2)
    q = torch.randn(5, 8, 1, 64).bfloat16()
    keys, values = _cache(5, 2, 900, 64, torch.bfloat16)
    visible = torch.arange(900)[None, :] <= torch.tensor([899, 10, 500, 256, 700])[:, None]
    together = decode_attention(q, keys, values, visible, 0.125)
    for row in range(5):
        alone = decode_attention(q[row:row + 1], keys[row:row + 1], values[row:row + 1], visible[row:row + 1], 0.125)
        assert torch.equal(alone, together[row:row + 1])


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_the_same_bits_on_any_threads(threads):
    torch.manual_seed(3)
    q = torch.randn(2, 8, 1, 64)
    keys, values = _cache(2, 2, 2000, 64, torch.bfloat16)
    visible = torch.ones(2, 2000, dtype=torch.bool)
    kernels = build.load()
    try:
        kernels.ts_llm_set_threads(1)
        one = decode_attention(q, keys, values, visible, 0.125)
        kernels.ts_llm_set_threads(threads)
        assert torch.equal(decode_attention(q, keys, values, visible, 0.125), one)
    finally:
        kernels.ts_llm_set_threads(-1)


def _causal(b, t, s, start):
    """[B, T, S]: query t of row b sits at position start[b] + t and sees every position up to it."""
    positions = torch.as_tensor(start)[:, None] + torch.arange(t)[None, :]
    return torch.arange(s)[None, None, :] <= positions[:, :, None]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("b,h,kv,t,d,start", [(1, 9, 3, 40, 64, [0]), (2, 8, 2, 300, 64, [5, 700]), (1, 32, 8, 70, 128, [500])])
def test_a_chunk_of_queries_matches_attention_in_float64(dtype, b, h, kv, t, d, start):
    torch.manual_seed(t + d)
    s = max(start) + t
    q = torch.randn(b, h, t, d).to(dtype)
    keys, values = _cache(b, kv, s, d, dtype)
    visible = _causal(b, t, s, start)
    out = attention(q, keys, values, visible, d**-0.5)
    assert out.shape == (b, h, t, d) and out.dtype == dtype
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert (out.double() - _reference(q, keys, values, visible, d**-0.5)).abs().max() < tolerance


def test_a_prefilled_query_has_the_bits_of_the_same_query_decoded():
    torch.manual_seed(4)
    t, start = 600, 100  # a chunk across three blocks, after a cached prefix
    q = torch.randn(1, 9, t, 64)
    keys, values = _cache(1, 3, start + t, 64, torch.bfloat16)
    chunk = attention(q, keys, values, _causal(1, t, start + t, [start]), 0.125)
    for i in (0, 155, 156, 411, t - 1):  # positions 100, 255, 256, 511, 699
        seen = torch.arange(start + t)[None, :] <= start + i
        assert torch.equal(decode_attention(q[:, :, i:i + 1], keys, values, seen, 0.125), chunk[:, :, i:i + 1])


def test_a_long_chunk_in_passes_has_the_bits_of_short_chunks():
    torch.manual_seed(5)
    t = 2048  # 32 heads of 128 over 2,048 positions: the partials of one pass hold ~120 queries
    q = torch.randn(1, 32, t, 128).bfloat16()
    keys, values = _cache(1, 8, t, 128, torch.bfloat16)
    whole = attention(q, keys, values, _causal(1, t, t, [0]), 0.1)
    part = attention(q[:, :, 1000:1100], keys, values, _causal(1, 100, t, [1000]), 0.1)
    assert torch.equal(whole[:, :, 1000:1100], part)


def test_the_same_bits_whatever_pages_hold_the_positions():
    torch.manual_seed(6)
    q = torch.randn(2, 8, 3, 64)
    keys, values = _cache(2, 2, 500, 64, torch.bfloat16)
    visible = _causal(2, 3, 500, [497, 300])
    in_order = attention(q, keys, values, visible, 0.125, order=torch.arange(64))
    assert torch.equal(attention(q, keys, values, visible, 0.125), in_order)


def test_refuses_keys_of_another_head_dimension():
    q, visible = torch.randn(1, 4, 1, 64), torch.ones(1, 1, 10, dtype=torch.bool)
    keys = torch.randn(1, 2, PAGE, 32)
    with pytest.raises(RuntimeError, match=r"attention: k \[1, 2, 16, 32\] and v"):
        torch.ops.ts_llm.attention(q, keys, keys, torch.zeros(1, 1, dtype=torch.long), visible, 1.0)


def test_refuses_a_mask_for_another_batch():
    q, keys = torch.randn(1, 4, 1, 64), torch.randn(1, 2, PAGE, 64)
    with pytest.raises(RuntimeError, match=r"visible must be bool \[B, T, S\] = \[1, 1, S\], got \[2, 1, 9\]"):
        torch.ops.ts_llm.attention(q, keys, keys, torch.zeros(1, 1, dtype=torch.long), torch.ones(2, 1, 9, dtype=torch.bool), 1.0)


def test_refuses_a_page_table_too_short_for_the_mask():
    q, keys = torch.randn(1, 4, 1, 64), torch.randn(2, 2, PAGE, 64)
    with pytest.raises(RuntimeError, match=r"pages must be int64 \[B, N\] with N \* 16 >= 20"):
        torch.ops.ts_llm.attention(q, keys, keys, torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, 20, dtype=torch.bool), 1.0)


def test_refuses_a_page_outside_the_cache():
    q, keys = torch.randn(1, 4, 1, 64), torch.randn(2, 2, PAGE, 64)
    with pytest.raises(RuntimeError, match="sequence 0's page 1 is 2, outside the cache's 2 pages"):
        torch.ops.ts_llm.attention(q, keys, keys, torch.tensor([[0, 2]]), torch.ones(1, 1, 20, dtype=torch.bool), 1.0)


def test_refuses_more_query_heads_per_kv_head_than_it_holds():
    q, keys = torch.randn(1, 64, 1, 16), torch.randn(1, 1, PAGE, 16)
    with pytest.raises(RuntimeError, match="query heads per KV head"):
        torch.ops.ts_llm.attention(q, keys, keys, torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, 10, dtype=torch.bool), 1.0)
