"""The step's fill: which open masks of every row get a token, and which, decided for the whole batch at once.

The entropy rule (`window_filling.choose_fills`, docs/algorithm.md section 3.d) runs as tensor operations over the
batch's mask logits; the host learns the step's fills in one read. Per-row Python is left to what differs by row:
placing the fills, and a sampled row's draws (rows that share a sampler draw together, each row's in slot order, so
what a row draws never depends on the other rows).
"""

import torch

from .decoding_state import DecodingRow, Fill
from .step_feed import open_masks
from .window_filling import entropy, greedy, suppress_token


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
    picks = _choose(rows, slots, scores).tolist()  # the step's one read: a token (or 0, sampled) where chosen, else -1
    sampled = [
        (b, c) for b, row in enumerate(rows) if row.settings.sampler.do_sample for c in slots[b] if picks[b][c] >= 0
    ]
    drawn = _sample(rows, scores, sampled) if sampled else {}
    for b, row in enumerate(rows):
        placed = [(c, slots[b][c]) for c, token in enumerate(picks[b]) if token >= 0]
        for c, slot in placed:
            token, q = drawn[b, c] if (b, c) in drawn else (picks[b][c], None)
            row.window[slot] = Fill(token, q=q)
        if row.settings.lossless and row.settings.sampler.do_sample:
            for _, slot in placed:  # a draft drawn after a mask before it was filled may have steered that one
                row.window[slot].verifiable = all(s is not None for s in row.window[:slot])


def _choose(rows: list[DecodingRow], slots: list[dict], scores: torch.Tensor):
    """(batch, n_masks): -1 at the columns the entropy rule leaves as masks; at the chosen ones the argmax token,
    or 0 where every row with open masks samples (its draws come after). The adjusted entropies are float64 sums of
    the float32 entropies, as `choose_fills` computes them."""
    batch, n_masks = scores.shape[:2]
    inf = float("inf")
    extra = [[inf] * n_masks for _ in range(batch)]  # the position penalty of open masks, +inf elsewhere
    thresholds, leftmost = [], []
    for b, row in enumerate(rows):
        settings, open_slots = row.settings, slots[b]
        threshold = settings.entropy_threshold
        thresholds.append(-inf if threshold is None else threshold)
        leftmost.append(-1)
        if not open_slots:
            continue
        columns = sorted(open_slots)
        first = open_slots[columns[0]]
        for c in columns:
            extra[b][c] = settings.pos_penalty_factor * (open_slots[c] - first)
        if settings.lossless:
            leftmost[b] = columns[0]
    device = scores.device
    extra = torch.tensor(extra, dtype=torch.float64, device=device)
    adjusted = entropy(scores).double() + extra
    chosen = adjusted < torch.tensor(thresholds, dtype=torch.float64, device=device)[:, None]
    has_open = torch.tensor([bool(s) for s in slots], device=device)
    lowest = torch.nn.functional.one_hot(adjusted.argmin(1), n_masks).bool()
    chosen |= lowest & (has_open & ~chosen.any(1))[:, None]
    leftmost = torch.tensor(leftmost, device=device)
    chosen |= torch.arange(n_masks, device=device)[None] == leftmost[:, None]
    if all(row.settings.sampler.do_sample for row, s in zip(rows, slots) if s):
        return torch.where(chosen, 0, -1)
    return torch.where(chosen, greedy(scores), -1)


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
