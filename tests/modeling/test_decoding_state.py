"""A row's state (`decoding_state`): its commit stops at a stop token or the budget, what it may stream early, the
contexts processors see, and its statistics."""

from conftest import EOS_ID

from wedlm_hf.modeling.decoding_config import WeDLMDecodingConfig
from wedlm_hf.modeling.decoding_state import DecodingRow, DecodingSettings, Fill, WeDLMStats


def decoding_row(window: list, max_new_tokens: int = 20, lossless: bool = False) -> DecodingRow:
    settings = DecodingSettings(max_new_tokens=max_new_tokens, lossless=lossless, stop_ids=[EOS_ID])
    row = DecodingRow(index=0, prompt=[1, 2, 3], settings=settings, window=list(window), padding=[0, 0])
    row.prompt_fed = len(row.prompt)
    return row


def test_a_commit_moves_window_tokens_into_the_text_up_to_a_stop_token():
    row = decoding_row([Fill(5), Fill(6), None])
    assert row.leading_run() == 2 and row.commit(2) == 2
    assert row.generated == [5, 6] and row.window == [None] and row.committed == 5 and not row.done
    row = decoding_row([Fill(5), Fill(EOS_ID), Fill(6)])
    assert row.commit(3) == 2
    assert row.generated == [5, EOS_ID] and row.done and row.finish_reason == "stop" and len(row.window) == 1


def test_a_commit_stops_at_the_budget():
    row = decoding_row([Fill(5), Fill(6), Fill(7)], max_new_tokens=2)
    assert row.commit(3) == 2
    assert row.generated == [5, 6] and row.done and row.finish_reason == "length" and row.stats.tokens == 2


def test_settled_tokens_are_those_the_next_forward_only_writes():
    """Default mode: the leading run up to a stop token, the budget and the first fill AR must judge (the fallback
    fill, under its threshold none); lossless mode: the final token only."""
    sure = lambda token: Fill(token, confident=True)  # noqa: E731
    assert decoding_row([Fill(5, final=True), sure(6), None, sure(7)]).settled() == [5, 6]
    assert decoding_row([Fill(5, final=True), sure(EOS_ID), sure(6)]).settled() == [5, EOS_ID]
    assert decoding_row([Fill(5, final=True), sure(6), sure(7)], max_new_tokens=2).settled() == [5, 6]
    assert decoding_row([Fill(5, final=True), Fill(6), sure(7)]).settled() == [5]
    assert decoding_row([Fill(5, final=True), Fill(6)], lossless=True).settled() == [5]
    joining = decoding_row([Fill(5)])
    joining.prompt_fed = 0
    assert joining.settled() == []


def test_contexts_are_what_ar_would_hand_its_processors_at_each_slot():
    row = decoding_row([Fill(5), Fill(6), None])
    row.generated = [4]
    first, third = row.contexts([0, 2], "cpu")
    assert first.tolist() == [0, 0, 1, 2, 3, 4] and third.tolist() == [0, 0, 1, 2, 3, 4, 5, 6]
    row.context_ids.ids[0, 0] = -1  # a mark: the committed ids grow with the text, not written again each step
    row.commit(2)
    assert row.contexts([0], "cpu")[0].tolist() == [-1, 0, 1, 2, 3, 4, 5, 6]


def test_settings_come_from_the_options_and_stats_from_the_counts():
    options = WeDLMDecodingConfig(window_size=8, lossless=True)
    settings = DecodingSettings.of(options, max_new_tokens=12, stop_ids=[EOS_ID, EOS_ID])
    assert settings.window_size == 8 and settings.lossless and settings.stop_ids == frozenset({EOS_ID})
    stats = WeDLMStats(forwards=4, tokens=10, rows_fed=20, accepted_drafts=3, rejected_drafts=1)
    assert (stats.tokens_per_forward, stats.p_cache, stats.acceptance_rate) == (2.5, 0.5, 0.75)
    assert WeDLMStats().acceptance_rate is None and WeDLMStats().to_dict()["tokens_per_forward"] == 0.0
