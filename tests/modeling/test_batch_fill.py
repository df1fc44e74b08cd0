"""The batch fill: from one read of the batch's entropies and greedy tokens, every row gets exactly the fills the
rule (`window_filling.choose_fills`) gives that row alone, at the window slots its right-aligned mask columns stand
for; a sampled row draws the same fills alone or batched."""

import random

import torch

from wedlm_hf.evaluation.step_benchmark import HostReads
from wedlm_hf.modeling.batch_fill import fill_masks
from wedlm_hf.modeling.decoding_state import DecodingRow, DecodingSettings, Fill
from wedlm_hf.modeling.step_readout import read_step
from wedlm_hf.modeling.window_filling import FillSampler, choose_fills, entropy, greedy, suppress_token

VOCAB, MASK = 12, 11


def fill(rows, masks, logits, mask_token_id):
    """The step's fill on mask logits alone: its readout, then the fills."""
    fill_masks(rows, masks, read_step(rows, logits, logits.shape[1], mask_token_id, {}))


def random_rows(
    rng: random.Random, batch: int, lossless: float = 0.3
) -> tuple[list[DecodingRow], list[list[int]], int]:
    """Rows with windows of fills and masks (some done, some with no masks; a `lossless` share of them lossless),
    the fed mask positions per row and the step's mask columns."""
    rows, masks = [], []
    for index in range(batch):
        threshold = rng.choice([None, 0.5, 1.5, 2.2, 3.0])
        settings = DecodingSettings(
            max_new_tokens=64,
            window_size=8,
            entropy_threshold=threshold,
            pos_penalty_factor=rng.choice([0.0, 0.02, 0.3]),
            lossless=rng.random() < lossless,
        )
        window = [None if rng.random() < 0.6 else Fill(rng.randrange(MASK)) for _ in range(rng.randrange(0, 9))]
        row = DecodingRow(index=index, prompt=[1, 2, 3], settings=settings, window=window)
        row.prompt_fed = 3
        row.done = rng.random() < 0.1
        rows.append(row)
        masks.append([row.committed + i for i, slot in enumerate(window) if slot is None])
    return rows, masks, max((len(m) for m in masks), default=0)


def expected_fills(row: DecodingRow, masks: list[int], logits: torch.Tensor) -> dict[int, int]:
    """Window slot -> token, by the rule applied to this row alone (masks right-aligned in the columns)."""
    if row.done or not masks:
        return {}
    n_masks = logits.shape[0]
    scores = suppress_token(logits, MASK)
    entropies = entropy(scores).tolist()
    columns = [n_masks - len(masks) + j for j in range(len(masks))]
    slots = [p - row.committed for p in masks]
    settings = row.settings
    picks = choose_fills(
        [entropies[c] for c in columns], slots, settings.entropy_threshold, settings.pos_penalty_factor
    )
    if row.verifies and 0 not in picks:
        picks = [0, *picks]
    top = greedy(scores).tolist()
    return {slots[i]: top[columns[i]] for i in picks}


def test_the_batch_fill_chooses_what_the_rule_chooses_row_by_row():
    rng = random.Random(0)
    for trial in range(40):
        rows, masks, n_masks = random_rows(rng, batch=rng.randrange(1, 7))
        if not n_masks:
            continue
        # Sharp and flat logits, so that rows fall on both sides of the thresholds.
        logits = torch.randn((len(rows), n_masks, VOCAB), generator=torch.Generator().manual_seed(trial))
        logits *= torch.tensor([rng.choice([0.2, 1.0, 6.0]) for _ in range(n_masks)])[None, :, None]
        before = [list(row.window) for row in rows]
        expected = [
            expected_fills(row, m, logits[b, n_masks - len(m) :]) for b, (row, m) in enumerate(zip(rows, masks))
        ]
        fill(rows, masks, logits, MASK)
        for row, old, fills in zip(rows, before, expected):
            placed = {i: slot.token for i, slot in enumerate(row.window) if slot is not None and old[i] is None}
            assert placed == fills, (trial, row.settings)
            assert all(new is slot for new, slot in zip(row.window, old) if slot is not None)


def test_a_verifying_row_always_drafts_its_leftmost_mask():
    """Only a draft right after the leading run can be verified by the next forward: lossless mode, and the default
    mode drafting from the context, fill the leftmost mask even where the model is unsure, a draft AR judges (the
    paper's rule keeps the entropy rule alone)."""
    logits = torch.zeros((3, 3, 8))  # slots 1, 2, 3 (masks are right-aligned): uniform, uniform, confident
    logits[:, 2, 4] = 50.0
    rows = []
    for lossless, context_drafts in ((True, True), (False, True), (False, False)):
        settings = DecodingSettings(
            max_new_tokens=50, lossless=lossless, context_drafts=context_drafts, window_size=4, entropy_threshold=0.4
        )
        row = DecodingRow(
            index=0, prompt=[5, 6, 7], settings=settings, window=[Fill(2, final=context_drafts), None, None, None]
        )
        row.prompt_fed = 3
        rows.append(row)
    fill(rows, [[row.committed + 1, row.committed + 2, row.committed + 3] for row in rows], logits, 1)
    lossless_fills, default_fills, paper_fills = ([slot is not None for slot in row.window[1:]] for row in rows)
    assert lossless_fills == default_fills == [True, False, True]
    assert paper_fills == [False, False, True]
    default = rows[1].window
    assert not default[1].confident and default[3].confident  # the leftmost is judged, the sure fill trusted
    assert not rows[1].trusts(default[1]) and rows[1].trusts(default[3])


def test_greedy_fills_take_one_host_read_and_sampled_rows_draw_alone_or_batched():
    """Greedy rows: one read for the whole batch. A sampled row with its own generator draws the same fills beside
    other rows as alone."""
    rng = random.Random(3)
    rows, masks, n_masks = random_rows(rng, batch=6, lossless=0.0)
    for row in rows:
        row.done = False
    masks = [m or [row.committed + len(row.window)] for row, m in zip(rows, masks)]
    for row, m in zip(rows, masks):
        row.window += [None] * max(0, m[-1] - row.committed + 1 - len(row.window))
    n_masks = max(len(m) for m in masks)
    logits = torch.randn((len(rows), n_masks, VOCAB), generator=torch.Generator().manual_seed(1))
    with HostReads() as reads:
        fill(rows, masks, logits, MASK)
    assert reads.count == 1

    def sampled_fills(batch: list[int]) -> list:
        group = []
        for b in batch:
            settings = DecodingSettings(max_new_tokens=64, window_size=8, entropy_threshold=None)
            settings.sampler = FillSampler(True, generator=torch.Generator().manual_seed(b))
            row = DecodingRow(index=b, prompt=[1, 2, 3], settings=settings, window=[None] * 4)
            row.prompt_fed = 3
            group.append(row)
        fill(group, [[3, 4, 5, 6]] * len(group), logits[batch, :1].expand(-1, 4, -1).contiguous(), MASK)
        return [[None if slot is None else slot.token for slot in row.window] for row in group]

    alone = [sampled_fills([b])[0] for b in range(4)]
    assert sampled_fills([0, 1, 2, 3]) == alone


def test_samplers_draw_in_the_order_of_their_first_row_that_draws_after_the_read():
    """Where some rows drew before the read (an accelerator) and others draw in the fill (a grammar row), samplers
    that share a random stream draw in the order of their first row that draws there: the order the decoder had
    before the fill grouped draws per row (found by review)."""
    first_sampler, second_sampler = FillSampler(True), FillSampler(True)  # both on the global stream
    rows = []
    for b, sampler in enumerate([first_sampler, second_sampler, first_sampler]):
        settings = DecodingSettings(max_new_tokens=64, window_size=4, entropy_threshold=1e9, sampler=sampler)
        row = DecodingRow(index=b, prompt=[1, 2, 3], settings=settings, window=[None] * 4)
        row.prompt_fed = 3
        rows.append(row)
    logits = torch.randn((3, 4, VOCAB), generator=torch.Generator().manual_seed(0))
    readout = read_step(rows, logits, 4, MASK, {})
    readout.drawn = {(0, c): (7, None) for c in range(4)}  # row 0's fills were drawn before the read
    torch.manual_seed(123)
    fill_masks(rows, [[3, 4, 5, 6]] * 3, readout)
    torch.manual_seed(123)  # row 1 (second sampler) is the first to draw in the fill, then row 2 (first sampler)
    expected_1 = second_sampler.draw(second_sampler.probabilities(readout.scores[1])).tolist()
    expected_2 = first_sampler.draw(first_sampler.probabilities(readout.scores[2])).tolist()
    tokens = [[slot.token for slot in row.window] for row in rows]
    assert tokens == [[7] * 4, expected_1, expected_2]
