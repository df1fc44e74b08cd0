"""The step's feed: per row [prompt chunk][filled slots][padding][masks] at their logical positions, built in one
transfer; the logit columns a step asks for; and a decoding row's commit (`DecodingRow.commit`)."""

import torch

from wedlm_hf.modeling.decoding_state import DecodingRow, DecodingSettings, Fill
from wedlm_hf.modeling.step_feed import build_feed, logit_columns, open_masks

MASK = 99


class Widths:
    """A cache stand-in: feeds are as wide as the widest row, on the CPU; its rows are the active rows in order, or
    `height` rows with active row b in row `places[b]` (as a static cache's slots)."""

    device = torch.device("cpu")

    def __init__(self, rows: int = 1, height: int | None = None, places: list[int] | None = None):
        self.layout = (rows, None) if places is None else (height, places)

    def feed_width(self, width: int, prefill: bool) -> int:
        return width

    def feed_layout(self):
        return self.layout


def row(prompt, window, fed=None, **settings) -> DecodingRow:
    """A row decoding by the paper's default rule unless the settings say otherwise."""
    settings = DecodingSettings(max_new_tokens=20, **{"context_drafts": False, **settings})
    out = DecodingRow(index=0, prompt=list(prompt), settings=settings, window=list(window))
    out.prompt_fed = len(prompt) if fed is None else fed
    return out


def test_filled_slots_come_first_then_padding_then_masks_at_their_positions():
    decoding = row([1, 2, 3], [Fill(7), None, Fill(8), None])  # committed length 3: slots at positions 3..6
    joining = row([4, 5, 6, 7, 8], [None, None], fed=0)
    feed = build_feed([decoding, joining], Widths(2), MASK, cap=None)
    assert feed.width == 7 and feed.n_masks == 2 and feed.prefill
    assert feed.ids.tolist() == [[7, 8, MASK, MASK, MASK, MASK, MASK], [4, 5, 6, 7, 8, MASK, MASK]]
    assert feed.positions.tolist() == [[3, 5, 0, 0, 0, 4, 6], [0, 1, 2, 3, 4, 5, 6]]
    assert feed.valid.tolist() == [[True, True, False, False, False, True, True], [True] * 7]
    assert feed.starts == [0, 5] and feed.decodes == [True, True] and feed.filled == [2, 0]
    assert feed.masks == [[4, 6], [5, 6]] and feed.runs == [1, 0] and feed.counts == [4, 7]
    # Only the masks' logits in default mode; a joining row that follows its AR logits adds its last prompt token.
    assert logit_columns([decoding, joining], feed)[0] == [5, 6]
    tracking = row([4, 5, 6, 7, 8], [None, None], fed=0, keep_logits=True)  # fed as `joining` is
    columns, ar_columns, _ = logit_columns([decoding, tracking], feed)
    assert columns == [4, 5, 6] and ar_columns == {1: [4]}
    # A row that verifies (context drafts in default mode, section 3.m) adds its run's rows, predicting the slots
    # after them, and its masks' slots exclude the one AR's next token takes.
    verifying = row([1, 2, 3], [Fill(7), None, Fill(8), None], context_drafts=True)
    assert logit_columns([verifying, tracking], feed)[1] == {0: [0], 1: [4]}
    verifying.commit(1)
    verifying.window[0] = Fill(9, final=True)
    assert open_masks(verifying, feed.masks[0], feed.n_masks) == [(1, 2)]
    # After a commit of the leading run, the masks fed are still open at their new slots.
    decoding.commit(1)
    assert open_masks(decoding, feed.masks[0], feed.n_masks) == [(0, 0), (1, 2)]


def test_a_feed_takes_the_rows_the_cache_lays_out():
    """Where the cache feeds its own rows (a static cache's slots), each active row is in its place and the others
    are padding: masks at position 0, none of them real."""
    first = row([1, 2, 3], [Fill(7), None])
    second = row([4, 5], [None])
    feed = build_feed([first, second], Widths(height=4, places=[2, 0]), MASK, cap=None)
    assert feed.width == 2 and feed.counts == [2, 1]
    assert feed.ids.tolist() == [[MASK, MASK], [MASK, MASK], [7, MASK], [MASK, MASK]]
    assert feed.positions.tolist() == [[0, 2], [0, 0], [3, 4], [0, 0]]
    assert feed.valid.tolist() == [[False, True], [False, False], [True, True], [False, False]]
    assert feed.masks == [[4], [2]] and feed.n_masks == 1


def test_a_long_prompt_under_a_cap_feeds_a_chunk_without_its_window():
    joining = row(list(range(10)), [None, None], fed=0)
    feed = build_feed([joining], Widths(), MASK, cap=4)
    assert feed.starts == [4] and feed.decodes == [False] and feed.masks == [[]] and feed.ids.tolist() == [[0, 1, 2, 3]]


def test_a_commit_stops_after_a_stop_token_or_at_the_budget():
    for window, budget, expected, reason in (
        ([5, 6, 7], 20, [5, 6, 7], None),
        ([5, 0, 7], 20, [5, 0], "stop"),
        ([5, 6, 7], 2, [5, 6], "length"),
        ([5, 0, 7], 2, [5, 0], "stop"),  # the stop token is also the budget's last: it stops
    ):
        decoding = row([1], [Fill(t) for t in window], stop_ids=frozenset({0}))
        decoding.settings.max_new_tokens = budget
        assert decoding.commit(3) == len(expected)
        assert decoding.generated == expected and decoding.finish_reason == reason
        assert decoding.done == (reason is not None) and decoding.stats.tokens == len(expected)
        assert [slot.token for slot in decoding.window] == window[len(expected) :]
