"""The step's fill: which open masks of every row get a token, and which, with one read from the device.

The device computes, for every mask column of the batch at once, the entropy the rule needs and the greedy token;
the host reads both in one transfer and applies the rule (`window_filling.choose_fills`, docs/algorithm.md section
3.d) row by row, on a few floats per row. Per-row work on the device is left to what differs by row: a sampled row's
draws (rows that share a sampler draw together, each row's in slot order, so what a row draws never depends on the
other rows).
"""

import torch

from .decoding_state import DecodingRow, Fill
from .step_feed import open_masks
from .window_filling import choose_fills, entropy, greedy, suppress_token


def fill_masks(rows: list[DecodingRow], masks: list[list[int]], mask_logits: torch.Tensor, mask_token_id: int) -> None:
    """Fills the open masks of `rows` from this step's `mask_logits` (batch, n_masks, vocab), row b's fed masks
    at logical positions `masks[b]`, right-aligned. Every mask under the threshold (entropy plus the position
    penalty from the row's leftmost open mask) is filled, else the row's lowest one; lossless mode always fills its
    leftmost open mask, the next draft a verification reaches."""
    n_masks = mask_logits.shape[1]
    slots = [{} if row.done or not masks[b] else dict(open_masks(row, masks[b], n_masks)) for b, row in enumerate(rows)]
    if not any(slots):
        return
    scores = suppress_token(mask_logits, mask_token_id)
    greedy_rows = any(s and not row.settings.sampler.do_sample for row, s in zip(rows, slots))
    entropies = entropy(scores)
    if greedy_rows:  # the step's one read; token ids are exact in float32 below 2**24, vocabularies far below it
        entropies, top = torch.stack([entropies, greedy(scores).to(entropies.dtype)]).tolist()
    else:
        entropies, top = entropies.tolist(), None
    chosen = []  # (batch row, mask column), each row's in slot order
    for b, row in enumerate(rows):
        if not slots[b]:
            continue
        settings, open_columns = row.settings, list(slots[b])  # ascending
        picks = choose_fills(
            [entropies[b][c] for c in open_columns],
            [slots[b][c] for c in open_columns],
            settings.entropy_threshold,
            settings.pos_penalty_factor,
        )
        if settings.lossless and 0 not in picks:  # the leftmost mask is the next draft a verification reaches
            picks = [0, *picks]
        chosen += [(b, open_columns[i]) for i in picks]
    sampled = [(b, c) for b, c in chosen if rows[b].settings.sampler.do_sample]
    drawn = _sample(rows, scores, sampled) if sampled else {}
    for b, c in chosen:
        token, q = drawn[b, c] if (b, c) in drawn else (int(top[b][c]), None)
        rows[b].window[slots[b][c]] = Fill(token, q=q)
    for b, c in sampled:
        row = rows[b]
        if row.settings.lossless:  # a draft drawn after a mask before it was filled may have steered that one
            slot = slots[b][c]
            row.window[slot].verifiable = all(s is not None for s in row.window[:slot])


def _sample(rows: list[DecodingRow], scores: torch.Tensor, chosen: list[tuple[int, int]]) -> dict:
    """(row, column) -> (token, the distribution it was drawn from where a lossless row needs it) for the
    chosen (row, column) masks of sampled rows; rows sharing one sampler draw together, in `chosen`'s order."""
    groups: dict[int, list[int]] = {}
    for k, (b, _) in enumerate(chosen):
        groups.setdefault(id(rows[b].settings.sampler), []).append(k)
    out = {}
    for members in groups.values():
        sampler = rows[chosen[members[0]][0]].settings.sampler
        probs = sampler.probabilities(scores[[chosen[k][0] for k in members], [chosen[k][1] for k in members]])
        for i, token in enumerate(sampler.draw(probs).tolist()):
            b, c = chosen[members[i]]
            out[b, c] = (token, probs[i] if rows[b].settings.lossless else None)
    return out
