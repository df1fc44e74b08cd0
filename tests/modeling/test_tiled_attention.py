"""Attention under the switch: a query's output depends only on the keys it attends to, dtype by dtype."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from wedlm_hf.modeling.tiled_attention import probe_attention_products, tiled_attention

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
HEADS, KV_HEADS, DIM = 4, 2, 64  # the shipped model's
MODULE = SimpleNamespace(is_causal=True)


def sdpa(query, key, value, mask):
    group = HEADS // KV_HEADS
    key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask).transpose(1, 2)


def one_row(dtype, cached: int, fed: int, seed: int = 0):
    """A row alone: `cached` keys in the cache, then `fed` new tokens attending causally among themselves."""
    g = torch.Generator().manual_seed(seed)
    query = torch.randn((1, HEADS, fed, DIM), generator=g).to(dtype)
    key = torch.randn((1, KV_HEADS, cached + fed, DIM), generator=g).to(dtype)
    value = torch.randn((1, KV_HEADS, cached + fed, DIM), generator=g).to(dtype)
    mask = torch.ones((fed, cached + fed), dtype=torch.bool).tril(cached)[None, None]
    return query, key, value, mask


def in_a_batch(row, place: int, batch: int, width: int, cache_length: int, seed: int = 1):
    """The same row at `place` of a batch whose other rows are other tokens: its cached keys scattered among holes
    in a longer cache, its fed tokens at the ends of a wider feed with padding between (as a decoding step lays
    them out). Returns the batch and the feed columns of the row's tokens."""
    query, key, value, _ = row
    fed = query.shape[2]
    cached = key.shape[2] - fed
    g = torch.Generator().manual_seed(seed)
    dtype = query.dtype
    q = torch.randn((batch, HEADS, width, DIM), generator=g).to(dtype)
    k = torch.randn((batch, KV_HEADS, cache_length + width, DIM), generator=g).to(dtype)
    v = torch.randn((batch, KV_HEADS, cache_length + width, DIM), generator=g).to(dtype)
    valid = torch.rand((batch, cache_length + width), generator=g) > 0.2
    columns = torch.sort(torch.randperm(cache_length, generator=g)[:cached]).values
    valid[place] = False
    valid[place, columns] = True
    k[place, :, columns], v[place, :, columns] = key[0, :, :cached], value[0, :, :cached]
    feed = list(range(fed // 2)) + list(range(width - (fed - fed // 2), width))  # [filled][padding][masks]
    for j, column in enumerate(feed):
        q[place, :, column] = query[0, :, j]
        k[place, :, cache_length + column], v[place, :, cache_length + column] = (
            key[0, :, cached + j],
            value[0, :, cached + j],
        )
        valid[place, cache_length + column] = True
    causal = torch.ones((width, cache_length + width), dtype=torch.bool).tril(cache_length)
    return (q, k, v, (causal & valid[:, None, :])[:, None]), feed


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_row_gets_the_same_bits_alone_and_in_any_batch(dtype):
    row = one_row(dtype, cached=70, fed=5)
    alone = tiled_attention(MODULE, *row)[0]
    sdpa_same = []
    for place, batch, width, cache_length in [(0, 2, 5, 70), (2, 4, 12, 300), (5, 6, 40, 130)]:
        batched, feed = in_a_batch(row, place, batch, width, cache_length)
        assert torch.equal(tiled_attention(MODULE, *batched)[place, feed], alone), (place, batch, width)
        sdpa_same.append(torch.equal(sdpa(*batched)[place, feed], sdpa(*row)[0]))
    assert not all(sdpa_same)  # sdpa, for comparison, rounds the same row differently in some of these batches


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_outputs_stay_close_to_sdpa(dtype):
    row = one_row(dtype, cached=130, fed=7)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(tiled_attention(MODULE, *row), sdpa(*row), atol=tolerance, rtol=tolerance)


def test_without_a_mask_it_is_sdpa_causal_from_the_top_left_or_every_key():
    query, key, value, _ = one_row(torch.float32, cached=0, fed=9)
    causal = torch.ones((9, 9), dtype=torch.bool).tril()[None, None]
    assert torch.equal(
        tiled_attention(MODULE, query, key, value, None), tiled_attention(MODULE, query, key, value, causal)
    )
    query, key, value, _ = one_row(torch.float32, cached=40, fed=1)
    every = torch.ones((1, 1, 1, 41), dtype=torch.bool)
    assert torch.equal(
        tiled_attention(MODULE, query, key, value, None), tiled_attention(MODULE, query, key, value, every)
    )


def test_an_additive_mask_is_read_as_attend_or_not():
    query, key, value, mask = one_row(torch.float32, cached=20, fed=4)
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    assert torch.equal(
        tiled_attention(MODULE, query, key, value, additive), tiled_attention(MODULE, query, key, value, mask)
    )
    with pytest.raises(ValueError, match="adds biases to the scores"):
        tiled_attention(MODULE, query, key, value, additive + 0.5)


def test_a_query_that_attends_nothing_gets_zeros():
    query, key, value, mask = one_row(torch.float32, cached=10, fed=3)
    mask = mask.clone()
    mask[..., 1, :] = False
    out = tiled_attention(MODULE, query, key, value, mask)
    assert torch.equal(out[0, 1], torch.zeros_like(out[0, 1])) and not out.isnan().any()


def test_the_products_pass_their_probe_here():
    probe_attention_products(DIM, torch.device("cpu"))
    probe_attention_products(128, torch.device("cpu"))


def test_more_queries_and_keys_than_one_product_takes():
    """A long prefill: its queries run in products of at most 1,024 rows and its keys in score products of at most
    1,024 keys; a query gets the bits it gets alone."""
    query, key, value, mask = one_row(torch.float32, cached=1100, fed=600)
    whole = tiled_attention(MODULE, query, key, value, mask)
    for j in (0, 599):
        alone = tiled_attention(MODULE, query[:, :, j : j + 1], key, value, mask[:, :, j : j + 1])
        assert torch.equal(alone[0, 0], whole[0, j])
