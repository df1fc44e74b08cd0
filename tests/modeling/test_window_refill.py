"""The refill before a step (`window_refill`): W masks after the leading run, within the budget, none after a filled
stop token; in lossless mode as many masks as the model's draft window holds (drafts: `test_draft_windows.py`)."""

from conftest import EOS_ID, window_tokens

from wedlm_hf.modeling.decoding_state import DecodingRow, DecodingSettings, Fill
from wedlm_hf.modeling.window_refill import refill


def decoding_row(window: list, max_new_tokens: int = 40, generated: int = 0, **settings) -> DecodingRow:
    settings = DecodingSettings(max_new_tokens=max_new_tokens, window_size=4, stop_ids={EOS_ID}, **settings)
    row = DecodingRow(index=0, prompt=[1, 2, 3], settings=settings, window=list(window), generated=[7] * generated)
    row.prompt_fed = len(row.prompt)
    return row


def test_a_window_is_topped_up_to_w_masks_after_its_leading_run():
    row = decoding_row([])
    refill(row)
    assert window_tokens(row) == [None] * 4
    # The leading run commits this step: W slots must remain after it. Fills beyond a mask stay where they are.
    row = decoding_row([Fill(5), Fill(6), None, Fill(8)])
    refill(row)
    assert window_tokens(row) == [5, 6, None, 8, None, None]


def test_the_budget_bounds_the_masks():
    row = decoding_row([Fill(5)], max_new_tokens=10, generated=7)  # 3 tokens of room, one already filled
    refill(row)
    assert window_tokens(row) == [5, None, None]
    full = decoding_row([Fill(5), Fill(6)], max_new_tokens=10, generated=8)
    refill(full)
    assert window_tokens(full) == [5, 6]


def test_no_mask_follows_a_filled_stop_token():
    row = decoding_row([None, Fill(EOS_ID)])
    refill(row)
    assert window_tokens(row) == [None, EOS_ID]  # the mask before it may still fill; nothing after it can commit


def test_a_lossless_rows_masks_follow_its_model_window():
    """The model's draft window decides how many masks a lossless row feeds after its final token; one mask alone
    would only draft what AR's next token gives anyway, so a window of 1 feeds the final token alone."""
    row = decoding_row([Fill(5, final=True)], lossless=True)
    row.model_window.size = 3
    refill(row)
    assert window_tokens(row) == [5, None, None, None]
    row.model_window.size = 1
    row.window = [Fill(5, final=True)]
    refill(row)
    assert window_tokens(row) == [5]
