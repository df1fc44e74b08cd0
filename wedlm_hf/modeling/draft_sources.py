"""Where a lossless row's drafts come from: one interface for the model's own fills and the context's copies.

Verification (`draft_verification`, `commit_rules.verify_and_commit`) treats every draft alike; only the work
depends on where the drafts come from. A source, like transformers' `CandidateGenerator`, proposes before a step
and hears after it how its drafts fared:

- `place(row, masks)`: before the step, it sizes the window or puts its drafts right after the leading run, and
  returns how many masks the row still appends after them (the next source starts from that number);
- `update(row, checked, rejected, paused)`: after the verification, how many of its drafts were checked and whether
  one was rejected (a source adapts how many it tries, `draft_windows`);
- `trying(row)`: whether its drafts are being tried now: a resting source waits meanwhile (`paused`).

A source keeps its state on the row (`DecodingRow.model_window`, `context_window`, `context`): the sources
themselves are policies, one instance for every row. The model's drafts are masks the step's fill fills
(`batch_fill`); the context's are copies placed here (`context_drafts`). A new source (a smaller draft model, a
corpus index) implements these three and joins `draft_sources`.
"""

from .context_drafts import LONG_MATCH, copy_from_context, index_fed_prompt
from .decoding_state import OWN_SOURCES, DecodingRow
from .draft_windows import GROWTH, JOIN_MASKS

UNSURE = "unsure"  # the verdicts' kind of a default row's unsure fills (their `Fill.source` is the model's)


class DraftSource:
    """One source of drafts (see the module docstring). `kinds`: the kinds its drafts' verdicts are counted under
    (`Fill.source` values, or UNSURE for a default row's unsure fills)."""

    kinds: tuple[str, ...] = ()

    def place(self, row: DecodingRow, masks: int) -> int:
        raise NotImplementedError

    def update(self, row: DecodingRow, checked: int, rejected: bool, paused: bool) -> None:
        raise NotImplementedError

    def trying(self, row: DecodingRow) -> bool:
        return False


class ModelDrafts(DraftSource):
    """The model's own drafts: the masks a row feeds, which the step fills. Their number follows how many held
    (`draft_windows.DraftWindow`); it never pauses another source."""

    kinds = OWN_SOURCES

    def place(self, row: DecodingRow, masks: int) -> int:
        """Cuts the window to the model window after the leading run; returns the masks that size leaves room for."""
        window = row.model_window
        size = min(masks, window.size if row.prefilled else JOIN_MASKS)
        run = row.leading_run()
        if row.prefilled and window.held is None and size:
            # Before the first check, the fills of the joining row's masks say how easy the text is (each passed
            # the entropy rule): the window (unless it rests) is what their holding would make it, so easy text
            # does not spend a forward growing it.
            size = min(row.settings.window_size, max(size, GROWTH * row.own_drafts()))
        if row.grammar is not None and row.prefilled and run > 1 and row.window[run - 1].source == "forced":
            # After a grammar's fixed string the next token is AR's own; the mask after it drafts the token after
            # that (e.g. the separator after a one-token value), and the grammar's next fixed string then follows
            # it without a forward of its own.
            size = max(size, 2)
        if size < 2 and row.prefilled:  # the slot after the final token is always taken by the next one
            size = 0
        del row.window[size + run :]
        return size

    def update(self, row: DecodingRow, checked: int, rejected: bool, paused: bool) -> None:
        row.model_window.update(row.settings.window_size, checked, rejected, paused=paused)


class ModelFills(DraftSource):
    """A verifying default-mode row's own fills (docs/algorithm.md section 3.m): the masks the step fills by the
    entropy rule; the confident ones commit without a check as the paper's rule commits them, the unsure ones are
    judged by AR (their verdicts come as kind UNSURE; the context source reads the last, `unsure_fill_held`). As
    many slots after the leading run as its last fill earned (`DraftWindow.fitted`: four per fill the model was sure
    of, two where it was sure of nothing, none while resting after such a fill failed: `DraftWindow.judged`), W where
    a wider forward costs next to nothing (`DecodingRow.free_width`); none below two: the first slot after the run
    is taken by AR's next token whenever the run commits whole. Masks a wider window left past that are dropped
    (fills there stay)."""

    kinds = (UNSURE,)

    def place(self, row: DecodingRow, masks: int) -> int:
        window = row.model_window
        fitted = row.prefilled and not row.free_width and window.held is not None
        size = min(masks, window.size) if fitted else masks
        size = size if size >= 2 else 0
        if fitted:  # masks left past that size by a wider window before are not fed again
            end, run = len(row.window), row.leading_run()
            while end > run + size and row.window[end - 1] is None:
                end -= 1
            del row.window[end:]
        return size

    def update(self, row: DecodingRow, checked: int, rejected: bool, paused: bool) -> None:
        if not row.free_width:
            row.model_window.judged(checked, rejected, paused)


class ContextDrafts(DraftSource):
    """Drafts copied from the context (`context_drafts`), tried while copies pay off (`draft_windows.ContextWindow`).
    A step that copies adds no masks after the copy: their rows would cost as much as the drafts, for guesses drawn
    with unverified drafts in view."""

    kinds = ("context",)

    def place(self, row: DecodingRow, masks: int) -> int:
        """While the model's own last drafts all held (counting, copying), only a long match is copied: a wrong
        context draft would displace good model drafts. After a joining row's unchecked drafts, only a match
        through all of them and the final token (or a long one): the drafts are then a copy of the context
        themselves, and the copy goes on with it; where only their tail matches (the digits of a number), they
        have already left the text it would copy. Once they failed (code), a copy continues the final token in
        place of their unverified drafts, which would stand before it and could take it down with them."""
        if not row.prefilled:
            if row.settings.max_new_tokens > 1:  # a row of one token never looks up
                index_fed_prompt(row)
            return masks
        run = row.leading_run()
        if not row.settings.lossless:
            # Default mode: where the rule's fills pass its threshold the model is sure and copies cost its masks:
            # a long match only. Once an unsure fill failed, a copy takes the place of the next (as in lossless mode).
            drafts = row.window[1:run]
            sure = True in [slot.confident for slot in drafts]
            unsure = row.unsure_fill_held is False and any(row.judged_own(slot) for slot in drafts)
            copied = copy_from_context(row, LONG_MATCH if sure else 1, replace_model_drafts=unsure, run=run)
            return 0 if copied else masks
        held = row.model_window.held
        shortest = LONG_MATCH if held else 1
        if held is None and row.own_drafts():
            shortest = min(run, LONG_MATCH)
        return 0 if copy_from_context(row, shortest, replace_model_drafts=held is False, run=run) else masks

    def update(self, row: DecodingRow, checked: int, rejected: bool, paused: bool) -> None:
        row.context_window.update(row.settings.window_size, checked, rejected)

    def trying(self, row: DecodingRow) -> bool:
        return row.context_window.trying


MODEL_DRAFTS, MODEL_FILLS, CONTEXT_DRAFTS = ModelDrafts(), ModelFills(), ContextDrafts()


def draft_sources(row: DecodingRow) -> tuple[DraftSource, ...]:
    """The row's sources in the order they place their drafts: none for the paper's default rule (its masks are not
    drafts checked by anything), the model's drafts in lossless mode or its trusted fills in the default mode that
    drafts from the context, then the context's where `context_drafts` is on."""
    settings = row.settings
    if not row.verifies:
        return ()
    own = MODEL_DRAFTS if settings.lossless else MODEL_FILLS
    return (own, CONTEXT_DRAFTS) if settings.context_drafts else (own,)


def report_verdicts(row: DecodingRow, checked: dict[str, int], rejected_kind: str | None) -> None:
    """Tells each source how its drafts fared this step: `checked` counts the drafts verified by `Fill.source`,
    `rejected_kind` the source of the one rejected (None: none). The later sources hear first: a resting source
    waits while another's drafts are being tried, as they stand after this step's verdict."""
    sources = draft_sources(row)
    for source in reversed(sources):
        paused = False  # loops, not lists: every row runs this every step, and a list is one more call for each
        for other in sources:
            if other is not source and other.trying(row):
                paused = True
                break
        count = 0
        for kind in source.kinds:
            count += checked.get(kind, 0)
        source.update(row, count, rejected_kind in source.kinds, paused)
