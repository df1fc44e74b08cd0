"""A row that joins with a cached prefix (`StreamingDecoder.add(..., prefix=)`) decodes what it decodes when it
prefills the whole prompt, on the dynamic and the static cache, default and lossless, beside rows without one."""

import pytest
import torch
from conftest import MASK_ID, prompts

from wedlm_hf.modeling.decoding_state import DecodingSettings
from wedlm_hf.modeling.slot_cache import SlotCache
from wedlm_hf.modeling.streaming_decoder import StreamingDecoder


def decode(model, rows, settings, prefixes, static):
    cache = SlotCache(model, len(rows), 64) if static else None
    decoder = StreamingDecoder(model, MASK_ID, keep_cache=True, cache=cache)
    added = [decoder.add(prompt, settings, prefix=prefix) for prompt, prefix in zip(rows, prefixes)]
    while decoder.busy:
        decoder.step()
    return added


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("lossless", [False, True], ids=["default", "lossless"])
def test_a_cached_prefix_decodes_as_a_full_prefill(model64, static, lossless):
    ids, mask = prompts(3)
    rows = [ids[b][mask[b].bool()].tolist() for b in range(3)]
    settings = DecodingSettings(max_new_tokens=20, window_size=6, entropy_threshold=0.8, lossless=lossless)
    reference = decode(model64, rows, settings, [None] * 3, static)
    prefixes = [[(k[:, :n], v[:, :n]) for k, v in reference[b].kv] if n else None for b, n in enumerate((4, 0, 3))]
    cached = decode(model64, rows, settings, prefixes, static)
    assert [r.generated for r in cached] == [r.generated for r in reference]
    for got, want in zip(cached, reference):
        for (k, v), (k0, v0) in zip(got.kv, want.kv):
            torch.testing.assert_close(k, k0, rtol=0, atol=1e-10)
            torch.testing.assert_close(v, v0, rtol=0, atol=1e-10)


def test_a_prefix_must_leave_the_last_prompt_token(model64):
    decoder = StreamingDecoder(model64, MASK_ID)
    kv = [(torch.zeros(2, 3, 16, dtype=torch.float64),) * 2] * 2
    with pytest.raises(ValueError, match="last token"):
        decoder.add([1, 2, 3], DecodingSettings(max_new_tokens=4), prefix=kv)


@pytest.mark.parametrize("lossless", [False, True], ids=["default", "lossless"])
def test_prefixes_joining_beside_a_running_row_go_into_their_own_free_columns(model64, lossless):
    """Rows that join a running batch with cached prefixes shorter than the cache take the columns that are free in
    their own rows (the cache does not grow by the prefix), and decode what a full prefill decodes."""
    ids, mask = prompts(3)
    rows = [ids[b][mask[b].bool()].tolist() for b in range(3)]
    settings = DecodingSettings(max_new_tokens=16, window_size=4, entropy_threshold=0.8, lossless=lossless)
    reference = decode(model64, rows, settings, [None] * 3, static=False)
    prefixes = [[(k[:, :n], v[:, :n]) for k, v in reference[b].kv] for b, n in ((1, 3), (2, 2))]

    def staggered(with_prefixes: bool):
        decoder = StreamingDecoder(model64, MASK_ID, keep_cache=True)
        long_running = decoder.add(rows[0] * 3, settings)  # a longer prompt: its columns outnumber the prefixes
        decoder.step()
        decoder.step()
        before = decoder.kv.length
        joined = [
            decoder.add(rows[b], settings, prefix=prefix if with_prefixes else None)
            for b, prefix in zip((1, 2), prefixes)
        ]
        decoder.step()
        grown = decoder.kv.length - before
        while decoder.busy:
            decoder.step()
        return [long_running, *joined], grown

    full, grown_full = staggered(False)
    cached, grown = staggered(True)
    assert [r.generated for r in cached] == [r.generated for r in full]
    assert [r.generated for r in cached[1:]] == [reference[1].generated, reference[2].generated]
    assert grown < grown_full  # fewer columns fed, and none added for the prefixes
    for got, want in zip(cached, full):
        for (k, v), (k0, v0) in zip(got.kv, want.kv):
            torch.testing.assert_close(k, k0, rtol=0, atol=1e-10)
            torch.testing.assert_close(v, v0, rtol=0, atol=1e-10)
