"""What one step feeds the model: every row's window reordered, a joining row's prompt (chunk), the logit columns.

Per row the feed is [its prompt (chunk), if it joins now][filled slots][padding][masks] (docs/algorithm.md section
3.b). Masks last, so that the kept logits are the tail; filled slots right after what the row has in the cache, so
that the leading run is fed in logical order. A joining row's prompt takes the columns other rows use for their
windows: the feed is as wide as the widest row, not prompt plus window. A prompt chunk that is not the last feeds no
window. Everything here is decided on the host from the rows' windows; the tensors are built in one transfer.
"""

from array import array
from dataclasses import dataclass

import torch

from .decoding_state import DecodingRow
from .grammar_hook import logit_slots


@dataclass
class StepFeed:
    """One step's feed. `ids`, `positions`, `valid`: (feed rows, width), laid out as the cache asks
    (`feed_layout`: a static cache's free slots are rows of padding); the per-row lists are by active row.
    `starts[b]`: prompt tokens row b feeds (where its filled slots begin); `decodes[b]`: whether
    its window is fed (a decoding row, or a joining prompt's last chunk); `filled[b]`: its filled slots fed;
    `masks[b]`: the logical positions of its masks fed, right-aligned in the step's last `n_masks` columns;
    `runs[b]`: its leading run of filled slots; `counts[b]`: its real (not padding) tokens."""

    ids: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor
    starts: list[int]
    decodes: list[bool]
    filled: list[int]
    masks: list[list[int]]
    runs: list[int]
    counts: list[int]
    width: int
    n_masks: int
    prefill: bool


def prompt_chunk(row: DecodingRow, cap: int | None) -> tuple[int, bool]:
    """How many prompt tokens `row` feeds this step, and whether its window joins them (the last chunk). The last
    chunk always holds the prompt's last token: its row predicts the first slot (lossless mode)."""
    remaining = len(row.prompt) - row.prompt_fed
    if remaining == 0:
        return 0, True
    if cap is None or remaining + len(row.window) <= cap or remaining == 1:
        return remaining, True
    return min(remaining - 1, cap), False


def build_feed(rows: list[DecodingRow], kv, mask_token_id: int, cap: int | None) -> StepFeed:
    """The step's feed for `rows` on cache `kv`, which sets its width (`feed_width`) and its rows (`feed_layout`);
    `cap`: the prompt tokens a row may feed (None: all)."""
    per_row = []  # (start, decode, filled, masks, run, count, fills, their positions) by row, transposed below
    for row in rows:
        start, decode = prompt_chunk(row, cap)
        if not decode:
            per_row.append((start, False, 0, [], 0, start, [], []))
            continue
        base, window = len(row.prompt) + len(row.generated), row.window
        if row.unfed_end():
            window = window[:-1]
        at = [i for i, slot in enumerate(window) if slot is not None]
        mask_positions = [base + i for i, slot in enumerate(window) if slot is None]
        fills, filled = [window[i].token for i in at], len(at)
        count = start + filled + len(mask_positions)
        per_row.append((start, True, filled, mask_positions, row.leading_run(), count, fills, [base + i for i in at]))
    starts, decodes, filled, masks, runs, counts, fills, fill_positions = map(list, zip(*per_row))
    prefill = any(starts)
    width = kv.feed_width(max(counts), prefill)
    height, places = kv.feed_layout()
    order = range(len(rows))  # the active row each feed row holds (None: padding)
    if places is not None:
        order = [None] * height
        for b, place in enumerate(places):
            order[place] = b
    ids, positions, valid = array("q"), array("q"), array("q")  # one buffer, one tensor, one transfer
    for b in order:
        if b is None:  # a row of the cache's that no active row holds: all padding
            ids.extend([mask_token_id] * width)
            positions.extend([0] * width)
            valid.extend([0] * width)
            continue
        fed, start, n, mask_positions = rows[b].prompt_fed, starts[b], filled[b], masks[b]
        gap, real = width - counts[b], start + n
        ids.extend(rows[b].prompt[fed : fed + start] + fills[b] + [mask_token_id] * (width - real))
        positions.extend([*range(fed, fed + start), *fill_positions[b], *[0] * gap, *mask_positions])
        valid.extend([1] * real + [0] * gap + [1] * (counts[b] - real))
    data = torch.frombuffer(ids + positions + valid, dtype=torch.int64).view(3, height, width)
    ids, positions, valid = data.to(kv.device, copy=True)  # a copy: the tensors outlive the buffer
    n_masks = max(map(len, masks))
    return StepFeed(ids, positions, valid.bool(), starts, decodes, filled, masks, runs, counts, width, n_masks, prefill)


def logit_columns(rows: list[DecodingRow], feed: StepFeed) -> tuple[list[int], dict, dict]:
    """The feed columns whose logits the step needs, ascending: every mask column, and for a row that follows its
    AR logits (lossless mode, keep_logits, a grammar) its run's rows and, joining, its last prompt token's (which
    predicts slot 0). Also, per such row, its AR columns; and for a default-mode grammar row, which run slots those
    are (`logit_slots`: only the rows its commit can use)."""
    ar_columns, sparse = {}, {}
    for b, row in enumerate(rows):
        settings = row.settings
        if not feed.decodes[b] or not (row.verifies or row.tracks_logits):
            continue
        start, run = feed.starts[b], feed.runs[b]
        slots = range(min(run, feed.filled[b]))  # each fed run row predicts the slot after it
        if row.grammar is not None and not (settings.lossless or settings.keep_logits or start):
            slots = sparse[b] = logit_slots(row, run)
        ar_columns[b] = ([start - 1] if start else []) + [start + j for j in slots]
    wanted = set(range(feed.width - feed.n_masks, feed.width)).union(*ar_columns.values())
    return sorted(wanted) or [feed.width - 1], ar_columns, sparse


def open_masks(row: DecodingRow, masks: list[int], n_masks: int) -> list[tuple[int, int]]:
    """(mask column, window slot) of the masks fed this step that are still masks (lossless mode may have placed its
    final token on one; a commit moves the slots). Masks are right-aligned in the step's mask columns."""
    first, base, window = n_masks - len(masks), len(row.prompt) + len(row.generated), row.window
    if not row.verifies and row.grammar is None:  # the paper's default commit moves only filled slots
        return [(first + j, position - base) for j, position in enumerate(masks)]
    end = base + len(window)
    return [(first + j, p - base) for j, p in enumerate(masks) if base <= p < end and window[p - base] is None]
