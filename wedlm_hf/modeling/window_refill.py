"""The window's refill before a step: masks appended so that W slots follow the step's commit.

In default mode a window is simply topped up to W masks (within the token budget, never after a filled stop
token). In lossless mode its size follows how many of the model's drafts held (`draft_windows`), and the masks
right after the leading run may first take drafts copied from the context (`context_drafts.copy_from_context`).
"""

from .context_drafts import LONG_MATCH, copy_from_context
from .decoding_state import DecodingRow
from .draft_windows import GROWTH, JOIN_MASKS


def refill(row: DecodingRow) -> None:
    """Appends masks so W slots remain after this step's commit, within the token budget and never after a
    filled stop token."""
    stop_ids = row.settings.stop_ids
    size = row.settings.window_size
    if row.settings.lossless:  # drafts past the adapted window are dropped: the output does not depend on them
        stop = next((i for i, slot in enumerate(row.window) if slot is not None and slot.token in stop_ids), None)
        if stop is not None:  # a draft past a stop token could only commit if the text went on after it
            del row.window[stop + 1 :]
        size = min(size, row.model_window.size if row.prefilled else JOIN_MASKS)
        run = row.leading_run()
        if row.prefilled and row.model_window.held is None and size:
            # Before the first check, the fills of the joining row's masks say how easy the text is (each
            # passed the entropy rule): the window (unless it rests) is what their holding would make it, so
            # easy text does not spend a forward growing it.
            size = min(row.settings.window_size, max(size, GROWTH * row.own_drafts()))
        if row.grammar is not None and row.prefilled and run > 1 and row.window[run - 1].source == "forced":
            # After a grammar's fixed string the next token is AR's own; the mask after it drafts the token
            # after that (e.g. the separator after a one-token value), and the grammar's next fixed string
            # then follows it without a forward of its own.
            size = max(size, 2)
        if size < 2 and row.prefilled:  # the slot after the final token is always taken by the next one
            size = 0
        del row.window[size + row.leading_run() :]
    if any(slot is not None and slot.token in stop_ids for slot in row.window):
        return
    if row.settings.lossless and row.settings.context_drafts and row.prefilled:
        # While the model's own last drafts all held (counting, copying), only a long match is copied: a wrong
        # context draft would displace good model drafts. After a joining row's unchecked drafts, only a match
        # through all of them and the final token (or a long one): the drafts are then a copy of the context
        # themselves, and the copy goes on with it; where only their tail matches (the digits of a number),
        # they have already left the text it would copy. Once they failed (code), a copy continues the final
        # token in place of their unverified drafts, which would stand before it and could take it down with
        # them. A step that drafts from the context adds no masks after its drafts: their rows would cost as
        # much as the drafts, for guesses drawn with unverified drafts in view.
        held = row.model_window.held
        shortest = LONG_MATCH if held else 1
        if held is None and row.own_drafts():
            shortest = min(row.leading_run(), LONG_MATCH)
        if copy_from_context(row, shortest, replace_model_drafts=held is False):
            size = 0
    room = row.settings.max_new_tokens - len(row.generated) - len(row.window)
    wanted = size + row.leading_run() - len(row.window)
    row.window.extend([None] * max(0, min(wanted, room)))
