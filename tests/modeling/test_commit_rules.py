"""The two commit rules (`commit_rules`): default mode commits the leading run, lossless mode what AR's own choices
confirm, and a window that already runs to its row's end commits without another forward."""

from conftest import EOS_ID, window_tokens

from wedlm_hf.modeling.commit_rules import commit, commit_ending
from wedlm_hf.modeling.decoding_state import DecodingRow, DecodingSettings, Fill
from wedlm_hf.modeling.draft_verification import ArPredictions
from wedlm_hf.modeling.window_filling import FillSampler


def decoding_row(window: list, lossless: bool = False, max_new_tokens: int = 20, **settings) -> DecodingRow:
    """A prefilled row; default mode with the paper's rule unless `context_drafts=True` is given."""
    settings = {"context_drafts": lossless, **settings}
    settings = DecodingSettings(max_new_tokens=max_new_tokens, lossless=lossless, stop_ids={EOS_ID}, **settings)
    row = DecodingRow(index=0, prompt=[1, 2, 3], settings=settings, window=list(window))
    row.prompt_fed = len(row.prompt)
    return row


def test_default_mode_commits_the_leading_run_and_keeps_the_rest():
    row = decoding_row([Fill(5), Fill(6), None, Fill(7), None])
    assert commit(row, 2, None) == (2, False)
    assert row.generated == [5, 6] and window_tokens(row) == [None, 7, None]
    assert row.stats.tokens == 2 and not row.done


def test_the_default_mode_with_context_drafts_commits_its_fills_and_the_copies_ar_confirms():
    """Section 3.m: the final token and the entropy rule's fills under its threshold commit unjudged; a copy, and
    the rule's fallback fill, commit only where AR's token there agrees, and AR's token after the last one
    committed is the next final token."""
    copy = lambda token: Fill(token, source="context")  # noqa: E731
    sure = lambda token: Fill(token, confident=True)  # noqa: E731
    # AR says 16 after the fill 6 (which it would not have chosen: AR says 9 there), agreeing with the first copy
    row = decoding_row([Fill(5, final=True), sure(6), copy(16), copy(17), None], context_drafts=True)
    assert commit(row, 4, ArPredictions(FillSampler(), [9, 16, 18])) == (3, False)
    assert row.generated == [5, 6, 16] and window_tokens(row) == [18, None] and row.window[0].final
    assert (row.stats.accepted_context_drafts, row.stats.rejected_context_drafts) == (1, 1)
    row = decoding_row([Fill(5, final=True), sure(6), sure(7)], context_drafts=True)  # no copy: nothing judged
    assert commit(row, 3, ArPredictions(FillSampler(), [1, 2, 8])) == (3, False)
    assert row.generated == [5, 6, 7] and window_tokens(row) == [8] and row.stats.accepted_drafts == 0
    # The fallback fill (over the threshold) is judged: AR says 9 there, which takes its place as the final token.
    row = decoding_row([Fill(5, final=True), Fill(6), None], context_drafts=True)
    assert commit(row, 2, ArPredictions(FillSampler(), [9, 4])) == (1, False)
    assert row.generated == [5] and window_tokens(row) == [9, None] and row.stats.rejected_drafts == 1
    row = decoding_row([Fill(5, final=True), Fill(6), None], context_drafts=True)  # AR agrees: it commits
    assert commit(row, 2, ArPredictions(FillSampler(), [6, 4])) == (2, False) and row.generated == [5, 6]
    ending = decoding_row([Fill(5, final=True), sure(EOS_ID), None], context_drafts=True)
    assert commit_ending(ending) == 2 and ending.done  # a run that ends the row commits without a forward
    copied = decoding_row([Fill(5, final=True), copy(EOS_ID)], context_drafts=True)
    assert commit_ending(copied) == 0 and not copied.done  # a copy that would end the row waits for its check
    unsure = decoding_row([Fill(5, final=True), Fill(EOS_ID)], context_drafts=True)
    assert commit_ending(unsure) == 0 and not unsure.done  # and so does the fallback fill


def test_a_default_rows_fills_rest_only_after_a_fill_ar_judged_failed():
    """Section 3.m: an unsure fill AR rejects rests the row's fills (two masks at most); a sampled fill drawn with a
    mask before it, which a fresh draw replaces without a verdict, does not, even after a kept one."""
    row = decoding_row([Fill(5, final=True), Fill(6), None], context_drafts=True)
    row.model_window.fitted(8, confident=0)
    assert commit(row, 2, ArPredictions(FillSampler(), [9, 4])) == (1, False)
    assert row.model_window.size == 0 and row.unsure_fill_held is False
    sampled = FillSampler(do_sample=True)
    row = decoding_row([Fill(5, final=True), Fill(6, q=object()), Fill(7, verifiable=False)], context_drafts=True)
    row.settings.sampler = sampled
    row.model_window.fitted(8, confident=0)
    verdicts = [(6, True, 0), None, None]  # the first kept; the second has no verdict: AR's fresh draw 8 replaces it
    assert commit(row, 3, ArPredictions(sampled, [6, 8, 3], verdicts=verdicts)) == (2, False)
    assert row.generated == [5, 6] and window_tokens(row) == [8]
    assert row.model_window.size == 2 and row.unsure_fill_held is True


def test_lossless_mode_commits_the_drafts_ar_confirms_and_places_ars_token_after_them():
    # Slot 0 is the final token; AR agrees with the draft at slot 1, not with the one at slot 2 (it says 12).
    row = decoding_row([Fill(5, final=True), Fill(6), Fill(7), Fill(8), None], lossless=True)
    assert commit(row, 4, ArPredictions(FillSampler(), [6, 12, 13])) == (2, False)
    assert row.generated == [5, 6]
    assert window_tokens(row) == [12, None, None] and row.window[0].final  # later fills saw the rejected draft
    assert (row.stats.accepted_drafts, row.stats.rejected_drafts) == (1, 1)
    # Every draft confirmed: AR's token after the run is the next final token.
    row = decoding_row([Fill(5, final=True), Fill(6), Fill(7)], lossless=True)
    assert commit(row, 3, ArPredictions(FillSampler(), [6, 7, 9])) == (3, False)
    assert row.generated == [5, 6, 7] and window_tokens(row) == [9] and row.window[0].final


def test_a_run_that_reaches_a_stop_token_commits_now():
    row = decoding_row([Fill(5), Fill(EOS_ID), Fill(6), None])
    assert commit_ending(row) == 2
    assert row.generated == [5, EOS_ID] and row.done and row.finish_reason == "stop"


def test_a_run_that_fills_the_budget_commits_now():
    row = decoding_row([Fill(5), Fill(6), Fill(7), None], max_new_tokens=3)
    assert commit_ending(row) == 3
    assert row.done and row.finish_reason == "length"


def test_a_window_that_does_not_end_the_row_waits_for_the_next_forward():
    assert commit_ending(decoding_row([Fill(5), Fill(6), None, Fill(EOS_ID)])) == 0  # a mask before the stop token
    assert commit_ending(decoding_row([Fill(5), Fill(6)])) == 0  # the text goes on
    # keep_logits needs the next forward's logits; a guess under a grammar commits only as AR confirms it.
    assert commit_ending(decoding_row([Fill(5), Fill(EOS_ID)], keep_logits=True)) == 0
    assert commit_ending(decoding_row([Fill(5, guess=True), Fill(EOS_ID)])) == 0
    joining = decoding_row([Fill(5), Fill(EOS_ID)])
    joining.prompt_fed = 0  # its prompt is not in the cache yet
    assert commit_ending(joining) == 0


def test_in_lossless_mode_the_final_token_and_forced_tokens_commit_without_a_check():
    assert commit_ending(decoding_row([Fill(EOS_ID, final=True), Fill(6)], lossless=True)) == 1
    # A model draft after the final token still needs AR's confirmation, even where it would end the row.
    row = decoding_row([Fill(5, final=True), Fill(EOS_ID)], lossless=True)
    assert commit_ending(row) == 0 and row.generated == []
    forced = decoding_row([Fill(5, final=True), Fill(EOS_ID, source="forced")], lossless=True)
    assert commit_ending(forced) == 2  # what a grammar forces, AR under it has no other choice for
