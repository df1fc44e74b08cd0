"""`SlotCache`, the static decoding cache: rows take the lowest free slots, a step sees the committed prefix and its
own real tokens up to itself, its bounds are refused with the fix, and a generation feeds a handful of shapes."""

import pytest
import torch
from conftest import WEDLM_COMMON, build_model, prompts

from wedlm_hf.modeling import slot_cache
from wedlm_hf.modeling.slot_cache import SlotCache


def test_rows_take_the_lowest_free_slots_and_a_full_cache_says_how_to_fix_it(model64):
    cache = SlotCache(model64, slots=3, max_length=20)
    cache.add_rows(2)
    assert cache.slot_of == [0, 1] and cache._slots is None  # in order: the step's logits are a slice
    cache.lengths[0], cache.lengths[1] = 7, 5
    cache.select_rows([1])  # row 0 leaves: its slot is free and empty
    assert cache.slot_of == [1] and cache.lengths[:2] == [0, 5]
    cache.add_rows(2)
    assert cache.slot_of == [1, 0, 2] and cache._slots.tolist() == [1, 0, 2]
    assert cache.feed_layout() == (3, [1, 0, 2])
    with pytest.raises(RuntimeError, match="3 slots and 3 are taken: 1 more rows cannot join. Decode fewer rows"):
        cache.add_rows(1)
    cache.select_rows([2])
    assert cache.feed_layout() == (3, [2])  # the fed slots reach the highest occupied one


def test_a_step_past_a_slots_length_is_refused_with_the_fix(model64):
    cache = SlotCache(model64, slots=2, max_length=20)
    cache.add_rows(1)
    cache.lengths[0] = cache.max_length - 2
    ids = torch.ones((2, 4), dtype=torch.long)
    valid = torch.tensor([[True] * 4, [False] * 4])
    with pytest.raises(RuntimeError, match=r"holds \d+ tokens per row.*make the cache longer \(max_cache_len\)"):
        cache.forward(ids, torch.zeros_like(ids), valid, [3], counts=[4])


def test_the_step_mask_sees_a_rows_committed_prefix_and_its_real_tokens_up_to_itself(model64):
    cache = SlotCache(model64, slots=2, max_length=5)
    cache.keys_length = 8  # as if the step attended over 8 columns (the last two unwritten)
    start = torch.tensor([3, 0])  # slot 0 holds 3 committed tokens, slot 1 none
    valid = torch.tensor([[True, True, False, True], [True, False, False, False]])
    rank = valid.long().cumsum(1) - 1
    seen = cache._attention_mask(start, rank)[:, 0] == 0
    want = [
        [  # 3 committed columns, then the real tokens written at 3, 4, 5; the padding query sees as its rank does
            [1, 1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 0, 0],
        ],
        [  # nothing committed: the one real token sees itself
            [1, 0, 0, 0, 0, 0, 0, 0],
            [1, 0, 0, 0, 0, 0, 0, 0],
            [1, 0, 0, 0, 0, 0, 0, 0],
            [1, 0, 0, 0, 0, 0, 0, 0],
        ],
    ]
    assert seen.int().tolist() == want


def test_fine_buckets_pad_a_feed_of_nine_or_more_by_at_most_half():
    for n in range(1, 200):
        size = slot_cache.bucket(n, fine=True)
        assert n <= size <= slot_cache.bucket(n) and (n < 9 or 2 * size <= 3 * n)
    assert [slot_cache.bucket(n, fine=True) for n in (9, 12, 13, 17, 25)] == [12, 12, 16, 24, 32]


def test_feeds_take_a_handful_of_shapes(monkeypatch):
    """Every decoding forward's (slots, width, logits kept) is a bucket (powers of two; widths on a CPU also 3/4 of
    one), and a 200-token batched generation sees few of them; a prefill's width is a bucket too up to the prefill
    step, a multiple of it beyond."""
    model = build_model(max_position_embeddings=1024)
    shapes = set()
    original = slot_cache.SlotCache.forward

    def record(self, input_ids, position_ids, new_valid, columns, prefill=False, counts=None):
        fed = slot_cache.bucket(max(self.slot_of) + 1, self.slots)
        keep = slot_cache.bucket(len(columns), input_ids.shape[1])
        shapes.add((prefill, fed, input_ids.shape[1], keep))
        return original(self, input_ids, position_ids, new_valid, columns, prefill, counts)

    monkeypatch.setattr(slot_cache.SlotCache, "forward", record)
    ids, mask = prompts(3)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=200, cache_implementation="static", **WEDLM_COMMON)
    decode = {shape for shape in shapes if not shape[0]}
    prefill = {shape for shape in shapes if shape[0]}
    powers = {1 << k for k in range(1, 8)}
    widths = powers | {12, 24, 48, 96}
    step = slot_cache.PREFILL_STEP
    assert all(width in widths if width <= step else width % step == 0 for _, _, width, _ in prefill)
    assert all(fed in powers | {3} and width in widths and keep in widths for _, fed, width, keep in decode)
    assert len(decode) <= 10 < sum(s.forwards for s in out.wedlm_stats) // 3
    shapes.clear()
    short, _ = prompts(1, lengths=(3,))  # 3 prompt tokens and 6 masks: a prefill 12 wide, not 32
    model.generate(short, max_new_tokens=8, cache_implementation="static", **WEDLM_COMMON)
    assert [width for is_prefill, _, width, _ in shapes if is_prefill] == [12]
