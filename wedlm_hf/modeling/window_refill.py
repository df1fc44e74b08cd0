"""The window's refill before a step: masks appended so that W slots follow the step's commit.

By the paper's default rule a window is simply topped up to W masks (within the token budget, never after a filled
stop token). A verifying row's draft sources (`draft_sources`) place their drafts first, in order: in lossless mode
the model's cuts the window to how many of its drafts held (`draft_windows`), in default mode it asks for W slots
(section 3.m); the context's may copy drafts right after the leading run; the masks each leaves room for are
appended last.
"""

from .decoding_state import DecodingRow
from .draft_sources import draft_sources


def refill(row: DecodingRow) -> None:
    """Appends masks so W slots remain after this step's commit, within the token budget and never after a
    filled stop token."""
    masks = row.settings.window_size
    sources = draft_sources(row)
    stop = _stop_slot(row)
    if stop is not None and not sources:
        return
    if stop is not None:  # drafts past a stop token could only commit if the text went on after it
        del row.window[stop + 1 :]
    for source in sources:
        masks = source.place(row, masks)
        # A source only cuts the window, except the context's copy, after which no masks are appended (it returns
        # none): so only a stop token already there can end the refill here (if the cut left it).
        if stop is not None and _stop_slot(row) is not None:
            return
    slots = len(row.window)
    wanted = min(masks + row.leading_run(), row.settings.max_new_tokens - len(row.generated)) - slots
    if wanted > 0:
        row.window += [None] * wanted


def _stop_slot(row: DecodingRow) -> int | None:
    """The window's first filled stop token, if any."""
    stop_ids = row.settings.stop_ids
    if stop_ids.isdisjoint([slot.token for slot in row.window if slot is not None]):
        return None
    return next(i for i, slot in enumerate(row.window) if slot is not None and slot.token in stop_ids)
