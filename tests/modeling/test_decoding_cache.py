"""The decoder's cache interface (`decoding_cache`): either cache holds an AR prefill of each row's committed text,
whatever rows join and leave; the cache `generate` returns is an AR prefill of its output."""

import pytest
import torch
from conftest import MASK_ID, WEDLM_COMMON, prompts
from transformers import DynamicCache

from wedlm_hf.modeling.decoding_state import DecodingSettings
from wedlm_hf.modeling.slot_cache import SlotCache
from wedlm_hf.modeling.streaming_decoder import StreamingDecoder
from wedlm_hf.modeling.transformers_versions import CACHE_KWARG


def ar_prefill(model, tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the (heads, tokens, dim) K/V of an AR prefill of `tokens`."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.tensor([tokens]), **{CACHE_KWARG: cache})
    return [(layer.keys[0], layer.values[0]) for layer in cache.layers]


@pytest.mark.parametrize("kind", ["ragged", "slot"])
def test_either_cache_holds_an_ar_prefill_of_each_rows_committed_text(model64, kind):
    """The contract both caches keep: after every step, each decoding row's K/V are exactly those of an AR prefill
    of its prompt and committed tokens, while rows commit different counts, join mid-way (into a freed slot) and
    leave."""
    cache = None if kind == "ragged" else SlotCache(model64, slots=3, max_length=64)
    decoder = StreamingDecoder(model64, MASK_ID, cache=cache)
    settings = DecodingSettings(max_new_tokens=40, window_size=4, entropy_threshold=0.8)
    first = decoder.add([3, 1, 4, 1, 5, 9, 2], settings)
    second = decoder.add([6, 5], settings)
    checked, uneven = 0, False
    for step in range(8):
        if step == 2:
            decoder.add([2, 7, 1, 8, 2, 8], settings)
        if step == 4:
            decoder.finish(second)  # a row leaves between steps; the next one takes its slot
            decoder.add([1, 4, 1], settings)
        before = {id(row): len(row.generated) for row in decoder.active}
        decoder.step()
        committed = {len(row.generated) - before[id(row)] for row in decoder.active if id(row) in before}
        uneven |= len(committed) > 1
        for i, row in enumerate(decoder.active):
            held = decoder.kv.row_kv(i)
            assert held[0][0].shape[1] == row.committed
            for (keys, values), (want_keys, want_values) in zip(held, ar_prefill(model64, row.prompt + row.generated)):
                torch.testing.assert_close(keys, want_keys, rtol=0, atol=1e-10)
                torch.testing.assert_close(values, want_values, rtol=0, atol=1e-10)
            checked += 1
    assert first in decoder.active and len(decoder.active) == 3 and checked >= 20
    assert uneven  # some step committed different counts in different rows


@pytest.mark.parametrize("batch", [1, 3])  # one padding-free row takes its own path
def test_final_cache_equals_ar_prefill_of_output(model64, batch):
    ids, mask = prompts(batch)
    out = model64.generate(ids, attention_mask=mask, max_new_tokens=20, **WEDLM_COMMON)
    seq = out.sequences
    width = ids.shape[1]
    full_mask = torch.zeros_like(seq)
    for b in range(batch):
        n_new = out.wedlm_stats[b].tokens
        full_mask[b, : width + n_new] = torch.cat([mask[b], torch.ones(n_new, dtype=torch.long)])
    prefill = DynamicCache(config=model64.config)
    positions = (full_mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        model64(seq, attention_mask=full_mask, position_ids=positions, **{CACHE_KWARG: prefill})
    assert out.cache.get_seq_length() == seq.shape[1]
    for b in range(batch):
        # The tokens that end a row commit without a forward (its last run, at most a window) and have no K/V.
        computed = (out.cache.layers[0].keys[b] != 0).any(-1).any(0)
        real = full_mask[b].bool()
        held = computed[real].tolist()
        n = held.count(True)
        assert held == [True] * n + [False] * (len(held) - n) and 1 <= len(held) - n <= 6
        cols = real & computed
        for layer_out, layer_ref in zip(out.cache.layers, prefill.layers):
            torch.testing.assert_close(layer_out.keys[b][:, cols], layer_ref.keys[b][:, cols], rtol=0, atol=1e-10)
            torch.testing.assert_close(layer_out.values[b][:, cols], layer_ref.values[b][:, cols], rtol=0, atol=1e-10)
            assert (layer_out.keys[b][:, ~cols] == 0).all()


def test_user_cache_is_filled_and_returned(model64):
    ids, _ = prompts(1)
    cache = DynamicCache(config=model64.config)
    out = model64.generate(ids, max_new_tokens=8, strategy="wedlm", cache=cache, return_dict_in_generate=True)
    assert out.cache is cache and cache.get_seq_length() == out.sequences.shape[1]
