"""Prompt reuse as transformers does it: `generate(strategy="wedlm", cache=prompt_cache)` with a DynamicCache that
holds the K/V of input_ids[:, :n] feeds only the rest of the prompt, and decodes what it decodes without the cache."""

import contextlib
import copy

import pytest
import torch
from conftest import EOS_ID, prompts
from transformers import DynamicCache

from wedlm_hf.modeling import ragged_cache, slot_cache
from wedlm_hf.modeling.transformers_versions import CACHE_KWARG

COMMON = dict(
    strategy="wedlm",
    max_new_tokens=16,
    wedlm_window_size=6,
    wedlm_entropy_threshold=0.8,
    eos_token_id=EOS_ID,
    pad_token_id=EOS_ID,
    return_dict_in_generate=True,
    output_logits=True,
)


def prefill(model, ids, mask, n):
    """A prompt cache of input_ids[:, :n], computed at generate's positions (left padding skipped)."""
    cache = DynamicCache(config=model.config)
    head = mask[:, :n]
    with torch.no_grad():
        model(ids[:, :n], attention_mask=head, position_ids=(head.cumsum(-1) - 1).clamp_min(0), **{CACHE_KWARG: cache})
    return cache


@pytest.fixture
def fed(monkeypatch):
    """Per decoding forward, per row, the positions of the real tokens it fed (both decoding caches)."""
    calls = []
    for cls in (ragged_cache.RaggedCache, slot_cache.SlotCache):

        def record(self, input_ids, position_ids, new_valid, columns, *args, _original=cls.forward):
            calls.append([p[v].tolist() for p, v in zip(position_ids, new_valid)])
            return _original(self, input_ids, position_ids, new_valid, columns, *args)

        monkeypatch.setattr(cls, "forward", record)
    return calls


def prompt_positions(calls, lengths):
    """The prompt positions each row fed in the first forward (prompts are prefilled whole there)."""
    return [[p for p in row if p < n] for row, n in zip(calls[0], lengths)]


def assert_same_output(got, want):
    assert torch.equal(got.sequences, want.sequences)
    assert len(got.logits) == len(want.logits)
    for a, b in zip(got.logits, want.logits):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9)


def shared_prefix_prompts():
    """Three prompts; rows 0 and 1 (12 tokens) share their first 5, row 2 (4 tokens) is padded past them."""
    ids, mask = prompts(3, lengths=(12, 12, 4), seed=3)
    ids[1, :5] = ids[0, :5]
    return ids, mask


LAYOUTS = {
    # name: (ids, mask, cache rows taken from ids/mask, n)
    "single": lambda: (*prompts(1, lengths=(11,)), slice(0, 1), 6),
    "padded": lambda: (*prompts(3), slice(0, 3), 8),
    "padded-short-row-uncached": lambda: (*prompts(3), slice(0, 3), 5),
    "broadcast": lambda: (*shared_prefix_prompts(), slice(0, 1), 5),
}


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("lossless", [False, True], ids=["default", "lossless"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_prompt_cache_changes_nothing_but_the_prompt_fed(model64, fed, layout, lossless, static):
    ids, mask, cache_rows, n = LAYOUTS[layout]()
    settings = COMMON | {"wedlm_lossless": lossless} | ({"cache_implementation": "static"} if static else {})
    lengths = mask.sum(1).tolist()
    starts = [ids.shape[1] - length for length in lengths]

    want = model64.generate(ids, attention_mask=mask, **settings)
    assert prompt_positions(fed, lengths) == [list(range(length)) for length in lengths]
    fed.clear()
    cache = prefill(model64, ids[cache_rows], mask[cache_rows], n)
    got = model64.generate(ids, attention_mask=mask, **settings, **{CACHE_KWARG: cache})

    assert_same_output(got, want)
    cached = [max(0, n - start) for start in starts]
    assert prompt_positions(fed, lengths) == [list(range(c, length)) for c, length in zip(cached, lengths)]
    assert got.cache is cache  # refilled with the output's K/V, laid out as `sequences`, as without a prompt cache
    for a, b in zip(got.cache.layers, want.cache.layers):
        torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=1e-9)
        torch.testing.assert_close(a.values, b.values, rtol=0, atol=1e-9)


@pytest.mark.parametrize("name", ["cache", "past_key_values"])
def test_two_continuations_of_one_prefix(model64, fed, name):
    """transformers' recipe: prefill the common prefix once, deepcopy it for each prompt that starts with it."""
    prefix = torch.tensor([[5, 17, 3, 60, 22, 41, 8]])
    prompt_cache = prefill(model64, prefix, torch.ones_like(prefix), prefix.shape[1])
    kept = [layer.keys.clone() for layer in prompt_cache.layers]
    for tail in ([30, 2, 71], [88, 14, 9, 50, 6]):
        ids = torch.cat([prefix, torch.tensor([tail])], dim=1)
        want = model64.generate(ids, **COMMON)
        fed.clear()
        renamed = name != CACHE_KWARG and CACHE_KWARG == "cache"  # the old name warns from transformers 5.24 on
        with pytest.warns(FutureWarning, match="deprecated") if renamed else contextlib.nullcontext():
            got = model64.generate(ids, **COMMON, **{name: copy.deepcopy(prompt_cache)})
        assert_same_output(got, want)
        assert prompt_positions(fed, [ids.shape[1]]) == [list(range(prefix.shape[1], ids.shape[1]))]
    assert all(torch.equal(layer.keys, k) for layer, k in zip(prompt_cache.layers, kept))  # the copies took the writes


@pytest.mark.parametrize(
    "options",
    [{"wedlm_context_drafts": False}, {}, {"wedlm_lossless": True}],
    ids=["paper", "context-drafts", "lossless"],
)
def test_continuing_from_the_returned_cache(model64, fed, options):
    """The cache a generation returns serves the next turn's prompt (its output plus new tokens). Where the last
    token was AR's own (lossless mode, and the default mode with context drafts) it has no K/V (zeros, as AR
    generate never computes it): that token is fed again."""
    ids, _ = prompts(1, lengths=(9,))
    settings = COMMON | options | {"eos_token_id": None}
    first = model64.generate(ids, **settings)
    ids = torch.cat([first.sequences, torch.tensor([[12, 33, 7]])], dim=1)
    want = model64.generate(ids, **settings)
    fed.clear()
    got = model64.generate(ids, **settings, **{CACHE_KWARG: first.cache})
    assert_same_output(got, want)
    ar_last = "wedlm_context_drafts" not in options
    reused = first.sequences.shape[1] - (1 if ar_last else 0)
    assert prompt_positions(fed, [ids.shape[1]]) == [list(range(reused, ids.shape[1]))]


def test_sampled_return_sequences_share_the_prompt_cache(model64):
    ids, mask = prompts(2, lengths=(9, 6))
    settings = COMMON | {"do_sample": True, "num_return_sequences": 2, "wedlm_lossless": True}
    torch.manual_seed(7)
    want = model64.generate(ids, attention_mask=mask, **settings)
    cache = prefill(model64, ids, mask, 6)
    torch.manual_seed(7)
    got = model64.generate(ids, attention_mask=mask, **settings, **{CACHE_KWARG: cache})
    assert_same_output(got, want)
    assert len(got.sequences) == 4


def test_refusals(model64):
    ids, mask = prompts(3)  # width 11
    cases = [
        (prefill(model64, ids[:2], mask[:2], 4), ids, mask, f"`{CACHE_KWARG}`.*holds 2 rows for 3 prompts"),
        (prefill(model64, ids, mask, 11), ids, mask, r"the cache covers the whole prompt; .*cache\.crop\(10\)"),
        (prefill(model64, ids, mask, 11), ids[:, 3:], mask[:, 3:], "11 tokens .* 8 columns.*longer than the prompt"),
        (prefill(model64, ids[1:2], mask[1:2], 6), ids[:2], mask[:2], "one row.*prompts differ in their first 6"),
    ]
    for cache, prompt_ids, prompt_mask, message in cases:
        with pytest.raises(ValueError, match=message):
            model64.generate(prompt_ids, attention_mask=prompt_mask, **COMMON, **{CACHE_KWARG: cache})
    short = prefill(model64, ids, mask, 4)
    del short.layers[1:]
    with pytest.raises(ValueError, match="4 columns for each of this model's 2 layers"):
        model64.generate(ids, attention_mask=mask, **COMMON, **{CACHE_KWARG: short})


@pytest.mark.parametrize("lossless", [False, True], ids=["default", "lossless"])
def test_rows_under_a_grammar_reuse_the_cache_too(model64, char_tokenizer, lossless):
    pytest.importorskip("llguidance")
    ids, mask = prompts(2, lengths=(9, 6))
    settings = COMMON | {"wedlm_lossless": lossless, "grammar": ("regex", r"[a-z]{2,5}@[a-z]{2,4}\.(com|org)")}
    want = model64.generate(ids, attention_mask=mask, tokenizer=char_tokenizer, **settings)
    cache = prefill(model64, ids, mask, 7)
    got = model64.generate(ids, attention_mask=mask, tokenizer=char_tokenizer, **settings, **{CACHE_KWARG: cache})
    assert_same_output(got, want)
