"""The draft-source interface: which sources a row drafts from, what each places, and how verdicts reach them."""

from conftest import EOS_ID

from wedlm_hf.modeling.decoding_state import DecodingRow, DecodingSettings, Fill
from wedlm_hf.modeling.draft_sources import (
    CONTEXT_DRAFTS,
    MODEL_DRAFTS,
    MODEL_FILLS,
    UNSURE,
    draft_sources,
    report_verdicts,
)
from wedlm_hf.modeling.draft_windows import PATIENCE


def row_with(window: list, text: list | None = None, grammar=None, **settings) -> DecodingRow:
    settings = DecodingSettings(max_new_tokens=50, stop_ids=frozenset({EOS_ID}), **settings)
    prompt = list(text or [5, 6, 7])
    row = DecodingRow(index=0, prompt=prompt, settings=settings, window=list(window), grammar=grammar)
    row.prompt_fed = len(prompt)
    return row


def test_lossless_rows_draft_from_the_model_then_the_context_and_default_rows_fill_then_copy():
    """Default rows: their trusted fills then the context's copies (section 3.m); the paper's rule (no context
    drafts) and a grammar row have none."""
    assert draft_sources(row_with([])) == (MODEL_FILLS, CONTEXT_DRAFTS)
    assert draft_sources(row_with([], context_drafts=False)) == ()
    assert draft_sources(row_with([], grammar=object())) == ()
    assert draft_sources(row_with([], lossless=True)) == (MODEL_DRAFTS, CONTEXT_DRAFTS)
    assert draft_sources(row_with([], lossless=True, context_drafts=False)) == (MODEL_DRAFTS,)


def test_default_fills_ask_for_what_the_last_fill_earned_and_copies_need_a_long_match_beside_confident_fills():
    row = row_with([Fill(4, final=True), Fill(10), None], window_size=8)
    assert MODEL_FILLS.place(row, masks=8) == 8 and len(row.window) == 3  # nothing cut: its fills commit anyway
    assert MODEL_FILLS.place(row_with([], window_size=1), masks=1) == 0  # one mask would be AR's next token's slot
    row.model_window.fitted(8, confident=1)  # a fill the model was sure of: four slots
    assert MODEL_FILLS.place(row, masks=8) == 4
    row.model_window.fitted(8, confident=0)  # only the rule's fallback: two, which it fills
    assert MODEL_FILLS.place(row, masks=8) == 2
    row.model_window.fitted(8, confident=3)
    assert MODEL_FILLS.place(row, masks=8) == 8  # up to W
    row.model_window.fitted(8, confident=0)
    row.free_width = True  # a wider forward costs next to nothing (an accelerator): W whatever the fills
    assert MODEL_FILLS.place(row, masks=8) == 8
    text = [1, 2, 3, 4, 9, 8, 7, 3]  # "3 4" occurred before, followed by "9 8 7 3"
    short = row_with([Fill(4, final=True)], text=text)
    assert CONTEXT_DRAFTS.place(short, masks=16) == 0  # no fill of the model's: any match is copied
    assert [slot.token for slot in short.window] == [4, 9, 8, 7, 3]
    # "3 4" again, with the 4 a confident fill of the model's: it is sure there, and a match that short is not worth
    # the masks a copy displaces
    confident = row_with([Fill(3, final=True), Fill(4, confident=True)], text=text[:7])
    assert CONTEXT_DRAFTS.place(confident, masks=16) == 16 and len(confident.window) == 2
    unsure = row_with([Fill(3, final=True), Fill(4)], text=text[:7])  # the rule's fallback fill: any match copies
    assert CONTEXT_DRAFTS.place(unsure, masks=16) == 0 and [s.token for s in unsure.window][2:] == [9, 8, 7]


def test_the_model_source_cuts_the_window_to_its_size_and_returns_the_masks_it_wants():
    row = row_with([Fill(4, final=True), Fill(10), None, Fill(11), None, None], lossless=True)
    row.model_window.held, row.model_window.size = True, 3
    assert MODEL_DRAFTS.place(row, masks=16) == 3
    assert [slot and slot.token for slot in row.window] == [4, 10, None, 11, None]  # the leading run (2) + 3 slots
    row.model_window.size = 8
    assert MODEL_DRAFTS.place(row, masks=5) == 5  # never more than the masks asked for (W)
    row.model_window.size = 1  # a single draft is not worth a try: the final token alone is fed
    assert MODEL_DRAFTS.place(row, masks=16) == 0
    assert [slot.token for slot in row.window] == [4, 10]


def test_the_context_source_places_a_copy_and_then_wants_no_masks():
    text = [1, 2, 3, 4, 9, 8, 7, 3]  # with the final token 4: "3 4" occurred before, followed by "9 8 7 3"
    row = row_with([Fill(4, final=True)], text=text, lossless=True)
    row.model_window.held = False
    assert CONTEXT_DRAFTS.place(row, masks=6) == 0
    assert [(slot.token, slot.source) for slot in row.window[1:]] == [(t, "context") for t in (9, 8, 7, 3)]
    unmatched = row_with([Fill(40, final=True)], text=text, lossless=True)  # 40 never occurred: no copy
    assert CONTEXT_DRAFTS.place(unmatched, masks=6) == 6
    assert len(unmatched.window) == 1


def test_verdicts_reach_the_source_whose_drafts_were_checked():
    """The model's fills and grammar-constrained drafts are the model source's, copies the context source's; a
    grammar's forced tokens belong to no source. A rejected copy does not shrink the model window."""
    row = row_with([], lossless=True, window_size=12)
    row.model_window.held, row.model_window.size = True, 4
    report_verdicts(row, {"model": 1, "constrained": 1, "context": 1, "forced": 5}, rejected_kind="context")
    assert row.model_window.held is True and row.model_window.size == 12  # its two drafts held: grown, up to W
    assert row.context_window.failures == 1 and row.context_window.tried
    report_verdicts(row, {"model": 2}, rejected_kind="model")
    assert row.model_window.held is False and row.model_window.size == 6  # halved
    assert row.context_window.failures == 1  # no copy checked: the context source heard nothing


def test_a_resting_model_source_waits_while_copies_are_tried_and_not_once_they_rest():
    row = row_with([], lossless=True)
    row.model_window.size, row.model_window.wait = 0, 1
    report_verdicts(row, {"context": 3}, rejected_kind=None)  # a copy held: copies are being tried
    report_verdicts(row, {}, rejected_kind=None)
    assert row.model_window.size == 0  # paused: its quiet steps do not count
    for _ in range(PATIENCE):  # copies fail at their first token until the context source rests
        report_verdicts(row, {"context": 1}, rejected_kind="context")
    assert row.context_window.size == 0
    assert row.model_window.size == 2  # the step that sent copies to rest was a quiet one for the model: its try


def test_default_fills_rest_where_the_model_is_sure_of_nothing_and_its_fill_failed():
    """Section 3.m: two masks a step while the model is sure of nothing; once AR rejects such a fill the row feeds
    no masks (AR's token and copies only, as a lossless row whose drafts rest) until its quiet steps pass; a fill
    the model is sure of ends the rest at once."""
    row = row_with([Fill(4, final=True)], window_size=8)
    window = row.model_window
    window.fitted(8, confident=0)
    report_verdicts(row, {UNSURE: 1}, rejected_kind=UNSURE)
    assert MODEL_FILLS.place(row, masks=8) == 0 and window.wait == 2
    window.fitted(8, confident=0)  # the fill of the masks fed with the rejected one: the rest goes on
    assert MODEL_FILLS.place(row, masks=8) == 0
    report_verdicts(row, {}, rejected_kind=None)
    assert MODEL_FILLS.place(row, masks=8) == 0  # one quiet step of the two
    report_verdicts(row, {}, rejected_kind=None)
    assert MODEL_FILLS.place(row, masks=8) == 2  # tried again
    report_verdicts(row, {UNSURE: 1}, rejected_kind=None)
    assert window.wait == 1  # a kept fill: the next rest is short again
    window.fitted(8, confident=2)
    report_verdicts(row, {UNSURE: 1}, rejected_kind=UNSURE)  # beside fills it was sure of: no rest
    assert MODEL_FILLS.place(row, masks=8) == 8
    window.size = 0
    window.fitted(8, confident=1)
    assert MODEL_FILLS.place(row, masks=8) == 4
    lossless = row_with([Fill(4, final=True)], lossless=True)
    report_verdicts(lossless, {UNSURE: 1}, rejected_kind=UNSURE)  # no lossless source hears this kind
    assert lossless.model_window.held is None
