"""Lossless mode's window (`draft_windows`, placed by `window_refill`): which drafts and masks a row feeds, and how the
model's draft window adapts."""

from conftest import EOS_ID, window_tokens

from wedlm_hf.modeling.commit_rules import verify_and_commit
from wedlm_hf.modeling.decoding_state import DecodingRow, DecodingSettings, Fill
from wedlm_hf.modeling.draft_verification import ArPredictions
from wedlm_hf.modeling.draft_windows import COPY_TOKENS, GROWTH, JOIN_MASKS, PATIENCE, PROBE, ContextWindow, DraftWindow
from wedlm_hf.modeling.window_filling import FillSampler
from wedlm_hf.modeling.window_refill import refill


def lossless_row(window: list, prefilled: bool = True, grammar=None, prompt=(5, 6, 7), **settings) -> DecodingRow:
    """A lossless row unless the settings say otherwise."""
    settings = DecodingSettings(**{"max_new_tokens": 50, "lossless": True, "stop_ids": frozenset({EOS_ID}), **settings})
    row = DecodingRow(index=0, prompt=list(prompt), settings=settings, window=list(window), grammar=grammar)
    row.prompt_fed = len(row.prompt) if prefilled else 0
    return row


def test_nothing_is_fed_past_a_drafted_stop_token():
    """A draft after a stop token could only commit if the text went on past it: it is dropped, and no mask is
    added, however large the model's window."""
    row = lossless_row([Fill(9, final=True), Fill(10), Fill(EOS_ID), Fill(11), None, Fill(12)])
    row.model_window.size = 16
    refill(row)
    assert window_tokens(row) == [9, 10, EOS_ID]
    # The same with a mask before the stop token: it stays (the stop token may still commit after it).
    row = lossless_row([Fill(9, final=True), None, Fill(EOS_ID), None, None])
    row.model_window.size = 16
    refill(row)
    assert window_tokens(row) == [9, None, EOS_ID]


def test_the_last_draft_is_unfed_only_where_a_whole_run_ends_the_row():
    """Its row's logits would predict past the row's end and its K/V would never be read."""
    assert lossless_row([Fill(9, final=True), Fill(10), Fill(EOS_ID)]).unfed_end() == 1
    assert lossless_row([Fill(9, final=True), Fill(EOS_ID)]).unfed_end() == 1
    # A mask before the stop token sees it (drafts are fed before masks), so it is fed.
    assert lossless_row([Fill(9, final=True), None, Fill(EOS_ID)]).unfed_end() == 0
    assert lossless_row([Fill(9, final=True), Fill(10), Fill(11)]).unfed_end() == 0  # the text goes on
    budget = lossless_row([Fill(9, final=True), Fill(10), Fill(11)])
    budget.generated = [8] * 47  # 3 tokens of room: the run's last token is the budget's
    assert budget.unfed_end() == 1
    budget.generated = [8] * 46
    assert budget.unfed_end() == 0
    assert lossless_row([Fill(9, final=True)]).unfed_end() == 0  # the final token is always fed
    assert lossless_row([Fill(9), Fill(EOS_ID)], prefilled=False).unfed_end() == 0
    default = lossless_row([Fill(9), Fill(10), Fill(EOS_ID)], lossless=False, context_drafts=False)
    assert default.unfed_end() == 0  # the paper's rule verifies nothing: no row checks the last one
    default = lossless_row([Fill(9), Fill(10), Fill(EOS_ID)], lossless=False, context_drafts=True)
    assert default.unfed_end() == 1  # its last slot is committed or judged by the row before, as lossless


def test_a_drafted_stop_token_does_not_keep_drafts_past_the_adapted_window():
    """The window is cut to the model's draft window even when it holds a stop token: a row whose drafts rest
    feeds its final token alone."""
    row = lossless_row([Fill(9, final=True), None, Fill(10), Fill(EOS_ID)])
    row.model_window.size = 0
    refill(row)
    assert window_tokens(row) == [9]


def test_a_joining_row_feeds_join_masks_beside_its_prompt():
    row = lossless_row([], prefilled=False)
    refill(row)
    assert window_tokens(row) == [None] * JOIN_MASKS
    capped = lossless_row([], prefilled=False, window_size=2)  # W caps it
    refill(capped)
    assert window_tokens(capped) == [None, None]


def test_a_draft_window_whose_drafts_held_grows_from_what_was_checked():
    window = DraftWindow(smallest=2, size=2)
    window.update(16, checked=3, rejected=False)  # the joining forward's drafts, more than the window's 2
    assert window.size == 12
    window.update(16, checked=12, rejected=False)
    assert window.size == 16  # capped by W
    small = DraftWindow(smallest=2, size=2)
    small.update(16, checked=1, rejected=False)
    assert small.size == 8  # quadrupled: more than four times the one draft checked
    small.update(16, checked=1, rejected=True)
    assert small.size == 4 and not small.held


def test_a_joining_rows_drafts_size_the_window_of_its_first_check():
    """Each fill of a joining row's masks passed the entropy rule: the first check's window is what their holding
    would make it (GROWTH times their number, capped by W), unless the model's window rests."""
    joined = [Fill(4, final=True), Fill(10), Fill(11), Fill(12)]
    row = lossless_row(joined, context_drafts=False)
    refill(row)
    assert window_tokens(row) == [4, 10, 11, 12] + [None] * 3 * GROWTH
    capped = lossless_row(joined, context_drafts=False, window_size=8)
    refill(capped)
    assert window_tokens(capped) == [4, 10, 11, 12] + [None] * 8
    none = lossless_row([Fill(4, final=True)], context_drafts=False)  # no fills: the model window's own size
    refill(none)
    assert window_tokens(none) == [4, None, None]
    checked = lossless_row(joined, context_drafts=False)  # after a check the model window decides alone
    checked.model_window.held = True
    refill(checked)
    assert window_tokens(checked) == [4, 10, 11, 12, None, None]
    resting = lossless_row(joined, context_drafts=False)
    resting.model_window.size = 0
    refill(resting)
    assert window_tokens(resting) == [4, 10, 11, 12]


def test_context_drafts_rest_after_a_streak_of_failed_copies():
    """A copy is whole (up to W) while copies pay off; PATIENCE copies in a row that fail at their first token send
    the source to rest, a probe of PROBE drafts follows, and a probe that commits a draft makes copies whole again."""
    window = ContextWindow()
    for _ in range(PATIENCE - 1):
        window.update(16, checked=1, rejected=True)
        assert window.size == 16
    window.update(16, checked=3, rejected=True)  # two drafts held before the third failed: the streak ends
    for _ in range(PATIENCE):
        window.update(16, checked=1, rejected=True)
    assert window.size == 0
    rest = []
    for _ in range(2):  # quiet steps: the first rest is two steps long
        rest.append(window.size)
        window.update(16, checked=0, rejected=False)
    assert rest == [0, 0] and window.size == PROBE
    window.update(16, checked=1, rejected=True)  # the probe fails: back to rest, twice as long
    for _ in range(4):
        assert window.size == 0
        window.update(16, checked=0, rejected=False)
    assert window.size == PROBE
    window.update(16, checked=2, rejected=False)  # the probe held
    assert window.size == 16


def test_a_resting_context_source_looks_nothing_up(monkeypatch):
    """While the context source rests its copies would be dropped whole, so no look-up is made; once it probes
    again, the index catches up with everything committed meanwhile."""
    from wedlm_hf.modeling import context_drafts

    row = lossless_row([Fill(8, final=True), None, None], prompt=[5, 6, 7, 8, 9, 5, 6, 7])
    row.context_window.size = 0
    looked_up = []
    original = context_drafts.ContextIndex.lookup
    monkeypatch.setattr(
        context_drafts.ContextIndex, "lookup", lambda self, *args: looked_up.append(args) or original(self, *args)
    )
    assert not context_drafts.copy_from_context(row) and looked_up == []
    row.context_window.size = PROBE
    assert context_drafts.copy_from_context(row) and len(looked_up) == 1
    assert row.context.length == len(row.prompt) and window_tokens(row)[:2] == [8, 9]


def test_a_resting_model_window_waits_while_paused():
    """Quiet steps count towards the model's next try only when not paused (while copies are being tried)."""
    window = DraftWindow(smallest=2, size=2)
    window.update(16, checked=2, rejected=True)  # 2 halves to 1, under the smallest: rest for two quiet steps
    assert window.size == 0 and window.wait == 2
    for _ in range(5):
        window.update(16, checked=0, rejected=False, paused=True)
    assert window.size == 0 and window.quiet == 0
    window.update(16, checked=0, rejected=False)
    window.update(16, checked=0, rejected=False)
    assert window.size == 2  # the try


def test_copies_are_being_tried_once_one_was_checked_and_while_the_source_does_not_rest():
    window = ContextWindow()
    assert not window.trying  # no copy yet (text with nothing to copy)
    window.update(16, checked=3, rejected=False)
    assert window.trying
    for _ in range(PATIENCE):
        window.update(16, checked=1, rejected=True)
    assert window.size == 0 and not window.trying


def test_the_model_source_rests_on_while_copies_are_being_tried():
    """Steps that check a copy (or nothing) leave a resting model source resting while copies are being tried;
    without context drafts, or once the context source rests, quiet steps lead to the model's try."""
    for context_drafts, copies_rest in ((True, False), (False, False), (True, True)):
        row = lossless_row([Fill(9, final=True), Fill(10, source="context")], context_drafts=context_drafts)
        row.model_window = DraftWindow(smallest=2, size=0, wait=3)
        row.context_window.tried = True
        for step in range(3):
            if copies_rest:
                row.context_window.size, row.context_window.wait = 0, 100
                row.window = row.window[:1]  # a resting source copies nothing
            run = row.leading_run()
            assert verify_and_commit(row, run, ArPredictions(FillSampler(), [10, 11 + step])) == run
        assert row.model_window.size == (0 if context_drafts and not copies_rest else 2)


def copying_row(text: list, window: list, held: bool | None, resting: bool = False, grammar=None) -> DecodingRow:
    row = lossless_row(window, grammar=grammar, prompt=text)
    row.model_window.held = held
    row.model_window.size = 0
    if resting:
        row.context_window.size = 0
    return row


def test_while_the_model_drafts_hold_only_a_long_match_is_copied():
    short = [1, 2, 3, 4, 9, 3]  # with the final token 4: "3 4" occurred before, a match of two tokens
    row = copying_row(short, [Fill(4, final=True)], held=True)
    refill(row)
    assert window_tokens(row) == [4]
    row = copying_row(short, [Fill(4, final=True)], held=False)
    refill(row)
    assert window_tokens(row) == [4, 9, 3]  # what followed "3 4", up to the end of the committed text
    long = [20, 21, 22, 23, 24, 25, 26, 27, 30, 20, 21, 22, 23, 24, 25]
    row = copying_row(long, [Fill(26, final=True)], held=True)
    refill(row)
    assert window_tokens(row) == [26, 27, 30, 20, 21, 22, 23, 24, 25]  # seven tokens agree ("20 ... 26")
    row = copying_row(long, [Fill(26, final=True)], held=True, resting=True)  # a resting source copies nothing
    refill(row)
    assert window_tokens(row) == [26]


def test_after_a_joining_rows_unchecked_drafts_only_a_match_through_them_is_copied():
    """The joining row's drafts must be a copy of the context themselves, with the final token before them: where
    only their tail matches (the digits of a number in the prompt), the copy would continue text they have already
    left, and a copy that failed would leave the next forward no drafts, where the model's masks would have
    drafted on."""
    one = [1, 2, 3, 9, 8, 7]  # the draft 3 occurred before, after 2, not after the final token 4
    row = copying_row(one, [Fill(4, final=True), Fill(3)], held=None)
    row.model_window.size = 2
    refill(row)
    assert window_tokens(row) == [4, 3] + [None] * GROWTH  # the model's masks instead
    tail = [1, 3, 9, 8, 7, 2]  # the drafts "3 9" occurred before (two tokens agree), but after 1, not the final 4
    row = copying_row(tail, [Fill(4, final=True), Fill(3), Fill(9)], held=None)
    row.model_window.size = 2
    refill(row)
    assert window_tokens(row) == [4, 3, 9] + [None] * 2 * GROWTH
    whole = [1, 4, 3, 9, 8, 7]  # "4 3 9" occurred before: the final token and both drafts agree
    row = copying_row(whole, [Fill(4, final=True), Fill(3), Fill(9)], held=None)
    row.model_window.size = 2
    refill(row)
    assert window_tokens(row) == [4, 3, 9, 8, 7]
    assert [slot.source for slot in row.window[1:]] == ["model", "model", "context", "context"]
    row = copying_row([2, 4, 9, 8, 7], [Fill(4, final=True)], held=None)  # no unchecked drafts: one token will do
    refill(row)
    assert window_tokens(row) == [4, 9, 8, 7]


def test_once_the_model_drafts_failed_a_copy_takes_their_place():
    """The model's unverified drafts stand before a copy: after its last drafts failed, the copy continues the final
    token in their place. Before any of its drafts were checked (a joining row's), the copy follows them."""
    text = [1, 2, 3, 4, 9, 8, 7, 3]  # with the final token 4: "3 4" occurred before, followed by "9 8 7 3"
    row = copying_row(text, [Fill(4, final=True), Fill(40), Fill(41), None], held=False)
    row.model_window.size = 2
    refill(row)
    assert window_tokens(row) == [4, 9, 8, 7, 3]  # no masks after a copy
    assert [slot.source for slot in row.window[1:]] == ["context"] * 4
    row = copying_row(text, [Fill(4, final=True), Fill(9), Fill(8), None], held=None)
    row.model_window.size = 2
    refill(row)
    assert window_tokens(row) == [4, 9, 8, 7, 3]  # "3 4 9 8" matched through the drafts: the copy goes on after them
    assert [slot.source for slot in row.window[1:]] == ["model", "model", "context", "context"]
    # A grammar's forced tokens are no guess: the copy goes on after them.
    row = copying_row(text, [Fill(4, final=True), Fill(9, source="forced"), Fill(41), None], held=False)
    row.model_window.size = 2
    refill(row)
    assert window_tokens(row) == [4, 9, 8, 7, 3]
    assert [slot.source for slot in row.window[1:]] == ["forced", "context", "context", "context"]
    # No copy to make: the model's drafts stay, with the masks of its window.
    row = copying_row([1, 2, 5], [Fill(4, final=True), Fill(40), None], held=False)
    row.model_window.size = 2
    refill(row)
    assert window_tokens(row) == [4, 40, None, None]


def test_a_copy_is_at_most_copy_tokens_long():
    text = list(range(10, 40))  # the final token 10 occurred before, followed by 29 tokens
    row = copying_row(text, [Fill(10, final=True)], held=False)
    row.settings.window_size = 32
    refill(row)
    assert window_tokens(row) == [10] + list(range(11, 11 + COPY_TOKENS))


class PrefixGrammar:
    """A grammar state stand-in that accepts exactly the prefixes of `text` (from the end of the committed text)."""

    def __init__(self, text: list):
        self.text, self.at = list(text), 0

    def accepted(self, tokens: list) -> int:
        n = 0
        while n < len(tokens) and self.at + n < len(self.text) and self.text[self.at + n] == tokens[n]:
            n += 1
        return n

    def advance(self, tokens: list) -> None:
        assert self.accepted(tokens) == len(tokens)
        self.at += len(tokens)

    def rollback(self, count: int) -> None:
        self.at -= count

    def accepting(self) -> bool:
        return self.at == len(self.text)


def test_under_a_grammar_a_copy_ends_where_the_grammar_rejects_it():
    """AR under a grammar never chooses a token the grammar rejects, so copying one would only cost rows."""
    text = [1, 2, 3, 4, 9, 8, 7, 3]  # with the final token 4: "3 4" occurred before, followed by "9 8 7 3"
    row = copying_row(text, [Fill(4, final=True)], held=False, grammar=PrefixGrammar([4, 9, 8, 5]))
    refill(row)
    assert window_tokens(row) == [4, 9, 8]
    assert row.grammar.at == 0  # the grammar's state is still the committed text's
    # A grammar that rejects the copy's first token: no copy.
    row = copying_row(text, [Fill(4, final=True)], held=False, grammar=PrefixGrammar([4, 6]))
    refill(row)
    assert window_tokens(row) == [4]


def test_after_a_grammars_fixed_string_a_row_feeds_a_mask_to_draft_past_ars_next_token():
    """The slot after a fixed string is AR's next token; a second mask drafts the token after it (a separator,
    after which the grammar's next fixed string needs no forward of its own), even while the model's drafts rest."""
    forced = [Fill(4, final=True), Fill(9, source="forced"), Fill(8, source="forced")]
    row = lossless_row(forced, context_drafts=False, grammar=PrefixGrammar([4, 9, 8, 5, 6]))
    row.model_window.size = 0
    refill(row)
    assert window_tokens(row) == [4, 9, 8, None, None]
    drafted = [Fill(4, final=True), Fill(9, source="forced"), Fill(8)]  # the run ends with a draft: it rests
    row = lossless_row(drafted, context_drafts=False, grammar=PrefixGrammar([4, 9, 8, 5, 6]))
    row.model_window.size = 0
    refill(row)
    assert window_tokens(row) == [4, 9, 8]
