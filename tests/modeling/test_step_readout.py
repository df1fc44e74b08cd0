"""`read_step`, the step's one read from the device: what the fill and the lossless commit need, for every row at
once, in one transfer, and nothing read where nothing needs it."""

import pytest
import torch

from wedlm_hf.evaluation.step_benchmark import HostReads
from wedlm_hf.modeling.decoding_state import DecodingRow, DecodingSettings
from wedlm_hf.modeling.step_readout import read_step
from wedlm_hf.modeling.window_filling import FillSampler

VOCAB, MASK = 10, 9


def row(lossless: bool = False, sampled: bool = False, done: bool = False) -> DecodingRow:
    settings = DecodingSettings(max_new_tokens=32, lossless=lossless, sampler=FillSampler(do_sample=sampled))
    out = DecodingRow(index=0, prompt=[1, 2], settings=settings, done=done)
    out.prompt_fed = 2
    return out


def logits_with_the_mask_token_on_top(batch: int, columns: int) -> torch.Tensor:
    logits = torch.randn((batch, columns, VOCAB), generator=torch.Generator().manual_seed(0))
    logits[..., MASK] = 100.0  # the mask token would win every argmax: it is never predicted
    return logits


def test_fills_read_each_mask_columns_entropy_and_greedy_token_without_the_mask_token():
    logits = logits_with_the_mask_token_on_top(2, 5)
    with HostReads() as reads:
        out = read_step([row(), row()], logits, 3, MASK, {})
    assert reads.count == 1
    scores = logits[:, 2:, :MASK]  # the last 3 columns are the masks; the mask token left out
    probs = scores.softmax(-1)
    want_entropy = -(probs * probs.log()).sum(-1)
    assert torch.allclose(torch.tensor(out.entropies), want_entropy, atol=1e-5)
    assert out.top == scores.argmax(-1).tolist() and all(MASK not in top for top in out.top)
    assert out.scores.shape == (2, 3, VOCAB) and out.ar_top is None


def test_a_greedy_lossless_row_also_reads_the_argmax_of_every_column_in_the_same_read():
    logits = logits_with_the_mask_token_on_top(2, 4)
    logits[1, :, MASK] = 0.0
    rows = [row(), row(lossless=True)]
    with HostReads() as reads:
        out = read_step(rows, logits, 2, MASK, {1: [0, 1]})
    assert reads.count == 1
    assert out.ar_top == logits.argmax(-1).tolist()  # AR's own choice: the raw argmax, over every column
    assert len(out.entropies) == 2 and len(out.top) == 2


def test_nothing_is_read_where_nothing_needs_it():
    logits = logits_with_the_mask_token_on_top(2, 3)
    with HostReads() as reads:
        no_masks = read_step([row(), row()], logits, 0, MASK, {})
        all_done = read_step([row(done=True), row(done=True)], logits, 3, MASK, {})
    assert reads.count == 0
    assert no_masks.scores is None and no_masks.entropies is None and no_masks.ar_top is None
    assert all_done.scores is None and all_done.top is None


def test_rows_that_draw_their_own_fills_read_entropies_but_no_greedy_tokens():
    """A sampled row's fill is drawn after the rule chose its masks; only the entropies travel."""
    logits = logits_with_the_mask_token_on_top(2, 3)
    with HostReads() as reads:
        out = read_step([row(sampled=True), row(sampled=True, lossless=True)], logits, 3, MASK, {})
    assert reads.count == 1
    assert out.top is None and len(out.entropies) == 2 and len(out.entropies[0]) == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_premasked_batch_reads_what_the_suppressed_read_gives(dtype):
    """Default rows that draft from the context have the mask token out of every column before the read
    (`premasked`): one `max` over every column gives the fills' greedy tokens and entropies' maxima and AR's argmax,
    the same values as suppressing it in the mask columns and taking both apart, in float32 and in bfloat16 (whose
    masks are read in float32)."""
    logits = logits_with_the_mask_token_on_top(3, 6).to(dtype)
    rows = [row(), row(), row()]
    ar_rows = {b: [0, 1, 2] for b in range(3)}
    premasked = logits.clone()
    premasked[..., MASK] = float("-inf")
    apart = premasked.clone()
    with HostReads() as reads:
        shared = read_step(rows, premasked, 3, MASK, ar_rows, premasked=True)
    assert reads.count == 1
    want = read_step(rows, apart, 3, MASK, ar_rows)
    assert shared.entropies == want.entropies and shared.top == want.top and shared.ar_top == want.ar_top
    assert shared.scores.dtype == torch.float32 and torch.equal(shared.scores, want.scores)
    assert torch.equal(premasked, apart)  # read in place, not written
    assert all(MASK not in top for top in shared.ar_top)
