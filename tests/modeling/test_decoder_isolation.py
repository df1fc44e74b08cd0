"""What one row of a shared `StreamingDecoder` batch cannot do to another: change a seeded row's draws, or widen
every forward with a long prompt (the token budget prefills it in chunks)."""

import pytest
import torch
from conftest import EOS_ID, MASK_ID, build_model
from transformers import (
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)

from wedlm_hf.modeling.decoding_state import DecodingSettings
from wedlm_hf.modeling.step_cost import keys_per_row, step_cost
from wedlm_hf.modeling.streaming_decoder import StreamingDecoder
from wedlm_hf.modeling.window_filling import FillSampler

GREEDY = FillSampler(False)


@pytest.fixture(scope="module")
def model():
    return build_model(seed=3)


def prompt(length: int, seed: int) -> list[int]:
    return torch.randint(0, EOS_ID, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def seeded(seed: int, temperature: float = 1.3) -> FillSampler:
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature), TopKLogitsWarper(20)])
    return FillSampler(True, warpers, generator=torch.Generator().manual_seed(seed))


def penalised() -> FillSampler:
    """A greedy sampler with processors that read each row's context (a server's penalties)."""
    return FillSampler(
        False, LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.8), NoRepeatNGramLogitsProcessor(2)])
    )


def settings(sampler=GREEDY, **kw) -> DecodingSettings:
    kw.setdefault("max_new_tokens", 40)
    kw.setdefault("entropy_threshold", 0.9)
    return DecodingSettings(sampler=sampler, stop_ids=frozenset({EOS_ID}), **kw)


class Widths:
    """Records the (batch, width) of every forward the model runs."""

    def __init__(self, model):
        self.shapes = []
        self.handle = model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        self.shapes.append(tuple(kwargs["input_ids"].shape))

    def close(self):
        self.handle.remove()


def run(model, plan, token_budget=None, before_read=False):
    """Decodes `plan`: (join at step, prompt, settings) entries; returns each row's committed tokens. `before_read`:
    the draws made before the step's read (an accelerator's way, `step_draws`), not after it (a CPU's)."""
    decoder = StreamingDecoder(model, MASK_ID, token_budget=token_budget)
    decoder.draws_before_read = before_read
    rows, step = {}, 0
    pending = sorted(enumerate(plan), key=lambda item: item[1][0])
    while pending or decoder.busy:
        while pending and pending[0][1][0] <= step:
            i, (_, ids, row_settings) = pending.pop(0)
            rows[i] = decoder.add(ids, row_settings)
        decoder.step()
        step += 1
    return [rows[i].generated for i in range(len(plan))]


def alone(model, ids, make_settings, before_read=False):
    return run(model, [(0, ids, make_settings())], before_read=before_read)[0]


@pytest.mark.parametrize("before_read", [False, True], ids=["draws-after-read", "draws-before-read"])
@pytest.mark.parametrize("lossless", [False, True], ids=["default", "lossless"])
def test_a_seeded_row_draws_the_same_tokens_alone_and_in_any_batch(model, lossless, before_read):
    """The row under test samples with its own generator; batches add greedy rows, rows sampling from the global
    RNG and other seeded rows, with other windows, prompt lengths, modes and join steps."""
    ids = prompt(9, seed=1)

    def mine():
        return settings(seeded(1234), window_size=6, lossless=lossless)

    expected = alone(model, ids, mine, before_read)
    assert len(expected) >= 10
    assert expected != alone(model, ids, lambda: settings(seeded(99), window_size=6, lossless=lossless), before_read)
    others = [
        (0, prompt(3, seed=2), settings(window_size=16)),
        (0, prompt(14, seed=3), settings(FillSampler(True), window_size=4, lossless=not lossless)),
        (2, prompt(6, seed=4), settings(seeded(7), window_size=11, entropy_threshold=None)),
        (5, prompt(21, seed=5), settings(FillSampler(True), window_size=2, lossless=True)),
        (1, prompt(9, seed=8), settings(penalised(), window_size=5, lossless=not lossless)),  # reads its context
    ]
    for join in (0, 3):
        for k in range(1, len(others) + 1):
            plan = others[:k] + [(join, ids, mine())]
            assert run(model, plan, before_read=before_read)[-1] == expected, f"joined at step {join} with {k} others"


@pytest.mark.parametrize("before_read", [False, True], ids=["draws-after-read", "draws-before-read"])
def test_a_sampled_default_rows_unsure_fills_carry_the_distribution_they_were_drawn_from(model, before_read):
    """AR judges a sampled default row's unsure fills against q, the distribution each was drawn from, whether the
    draws come before the step's read (an accelerator's way) or after it: without q a fill could only be replaced
    by AR's fresh draw, never kept."""
    decoder = StreamingDecoder(model, MASK_ID)
    decoder.draws_before_read = before_read
    rows = [decoder.add(prompt(9, seed=s), settings(seeded(s, temperature=0.7), window_size=6)) for s in range(4)]
    unsure = []
    while decoder.busy:
        decoder.step()
        for row in decoder.active:
            unsure += [slot for slot in row.window if slot is not None and slot.source == "model" and not slot.final]
            unsure = [slot for slot in unsure if not slot.confident]
    assert len(unsure) > 10 and all(slot.q is not None for slot in unsure)
    assert sum(row.stats.accepted_drafts + row.stats.rejected_drafts for row in rows) > 10  # judged


def test_seeded_rows_repeat_with_the_same_seed_in_one_batch(model):
    """Two rows with equal seeds and settings in one batch draw the same tokens as each other and as alone."""
    ids = prompt(8, seed=6)
    first, second = run(model, [(0, ids, settings(seeded(5))), (1, ids, settings(seeded(5)))])
    assert first == second == alone(model, ids, lambda: settings(seeded(5)))


@pytest.mark.parametrize("lossless", [False, True], ids=["default", "lossless"])
def test_a_token_budget_prefills_a_long_prompt_in_chunks_with_the_same_tokens(model, lossless):
    short = [(0, prompt(5, seed=s), settings(window_size=8, lossless=lossless)) for s in (7, 8, 9)]
    plan = short + [(3, prompt(300, seed=10), settings(window_size=8, lossless=lossless))]
    widths = Widths(model)
    try:
        free = run(model, plan)
        unbounded = max(b * w for b, w in widths.shapes)
        free_steps = len(widths.shapes)
        widths.shapes.clear()
        budget = 96
        bounded = run(model, plan, token_budget=budget)
    finally:
        widths.close()
    assert bounded == free
    assert unbounded >= 4 * 300  # without a budget, the long prompt widens the whole batch's forward
    worst = max(b * w for b, w in widths.shapes)
    assert worst <= max(budget, 4 * (2 * 8 + 1)), widths.shapes
    assert len(widths.shapes) > free_steps  # the prompt took extra steps


def test_a_token_budget_alone_prefills_in_chunks_and_keeps_the_answer(model):
    ids = prompt(200, seed=11)
    expected = run(model, [(0, ids, settings(window_size=4))])
    widths = Widths(model)
    try:
        chunked = run(model, [(0, ids, settings(window_size=4))], token_budget=32)
    finally:
        widths.close()
    assert chunked == expected
    assert max(w for _, w in widths.shapes) <= 32 and widths.shapes[0][1] < len(ids)


@pytest.mark.parametrize("lossless", [False, True], ids=["default", "lossless"])
def test_a_prompt_fed_in_chunks_is_indexed_with_them(model, lossless):
    """A row that drafts from the context indexes its prompt chunk by chunk as it is fed, at every n-gram size its
    look-ups take, so that the step after its prefill does not index it whole; its answer stays the one it gives
    fed at once."""
    ids, row_settings = prompt(200, seed=11), settings(window_size=4, context_ngram=4, lossless=lossless)
    decoder = StreamingDecoder(model, MASK_ID, token_budget=32)
    row, covered = decoder.add(ids, row_settings), []
    while not row.prefilled:
        fed = row.prompt_fed
        decoder.step()
        index = row.context
        assert index.tokens == ids[:fed] and index.indexed[1:] == [fed] * 4
        covered.append(fed)
    assert len(covered) > 4 and covered[-1] > len(ids) - 32  # the last chunk is indexed at the first look-up
    while decoder.busy:
        decoder.step()
    assert row.generated == run(model, [(0, ids, row_settings)])[0]


class Costs(Widths):
    """Records (batch, width, keys) of every forward: its token rows and the keys each reads."""

    def hook(self, module, args, kwargs):
        batch, width = kwargs["input_ids"].shape
        mask = kwargs["attention_mask"]
        if mask is None:  # a step of one token a row on a cache without holes: every key, cached or fed
            cache = next(value for value in kwargs.values() if hasattr(value, "get_seq_length"))
            self.shapes.append((batch, width, cache.get_seq_length() + width))
        else:
            self.shapes.append((batch, width, mask.shape[-1]))


def test_beside_decoding_rows_a_long_prompt_is_chunked_by_its_cost(model):
    """The budget counts attention as token rows (`step_cost`): while rows decode, the joining prompt's chunks get
    shorter as its context grows, each step costing about the budget at most; the tokens are an unbounded run's."""
    budget, long_prompt = 120, prompt(420, seed=10)
    endless = DecodingSettings(sampler=GREEDY, window_size=8, entropy_threshold=0.05, max_new_tokens=120)
    plan = [(0, prompt(5, seed=s), endless) for s in (7, 8)] + [(2, long_prompt, settings(window_size=8))]
    costs = Costs(model)
    try:
        free = run(model, plan)
        costs.shapes.clear()
        bounded = run(model, plan, token_budget=budget)
    finally:
        costs.close()
    assert bounded == free
    keys = keys_per_row(model.config)
    assert 200 <= keys <= 400  # the tiny model's: about six times its hidden size (64)
    steps = [(width, read) for batch, width, read in costs.shapes if batch == 3]
    last = next(i for i, (_, read) in enumerate(steps) if read >= len(long_prompt))  # its last chunk's step
    chunks = steps[: last + 1]
    widths = [width for width, _ in chunks]
    assert len(chunks) > len(long_prompt) // (budget // 3), widths  # more steps than counting token rows alone
    assert widths == sorted(widths, reverse=True) and widths[0] >= 2 * widths[-1], widths
    # The estimate counts the context the rows hold; the cache also keeps a few dead columns (`RaggedCache`).
    assert max(step_cost(3, width, read, keys) for width, read in chunks) <= 1.15 * budget, chunks


def test_a_short_prompt_joins_decoding_rows_in_one_step_under_a_budget(model):
    """A prompt whose chunk and window fit the budget at their cost is fed whole with its window, as without one."""
    plan = [(0, prompt(5, seed=7), settings(window_size=8)), (1, prompt(66, seed=8), settings(window_size=8))]
    widths = Widths(model)
    try:
        free = run(model, plan)
        joined_free = widths.shapes[1]
        widths.shapes.clear()
        bounded = run(model, plan, token_budget=4096)
    finally:
        widths.close()
    assert bounded == free and widths.shapes[1] == joined_free and joined_free[1] >= 66 + 8


def test_token_budget_must_be_positive(model):
    with pytest.raises(ValueError, match="token_budget"):
        StreamingDecoder(model, MASK_ID, token_budget=0)


@pytest.mark.parametrize("lossless", [False, True], ids=["default", "lossless"])
def test_rows_that_join_after_the_batch_ended_decode_as_in_a_new_decoder(model, lossless):
    """When every row has ended, the cache is left empty (no columns, no rows, no memory kept); rows that join later
    (a server's next requests) decode exactly what they would in a fresh decoder."""
    first, later = prompt(7, seed=12), [prompt(5, seed=13), prompt(9, seed=14)]
    decoder = StreamingDecoder(model, MASK_ID)
    decoder.add(first, settings(window_size=6, lossless=lossless))
    while decoder.busy:
        decoder.step()
    assert decoder.kv.length == 0 and decoder.kv.valid.shape == (0, 0)
    layers = decoder.kv.cache.layers
    assert all(layer.keys.shape[0] == layer.keys.shape[2] == 0 for layer in layers)
    assert not any(t.untyped_storage().nbytes() for layer in layers for t in (layer.keys, layer.values))
    rows = [decoder.add(ids, settings(window_size=6, lossless=lossless)) for ids in later]
    while decoder.busy:
        decoder.step()
    fresh = run(model, [(0, ids, settings(window_size=6, lossless=lossless)) for ids in later])
    assert [row.generated for row in rows] == fresh
    assert all(len(tokens) > 3 for tokens in fresh)
