"""The step's one read from the device, between the forward and the commit.

What the host needs from a forward, for every row at once: the entropy the fill rule reads and the greedy token of
every fed mask (`batch_fill`), and, for lossless rows that verify greedily, the argmax of every AR row
(`draft_verification`). They are computed on the device and copied to the host in one transfer (token ids travel as
float32, exact below 2**24, vocabularies far below it), before the commit, since neither depends on what commits:
the commit and the fill then choose on the host. A sampled row's draws stay on the device until it draws.
"""

from dataclasses import dataclass

import torch

from .decoding_state import DecodingRow
from .window_filling import entropy, greedy, suppress_token


@dataclass
class StepReadout:
    """`scores`: the mask logits with the mask token suppressed (device, for draws); `entropies` / `top`: per row,
    per mask column, on the host (`top` None where no greedy row fills); `ar_top`: per row, per logits column, the
    argmax (None where no lossless row verifies greedily)."""

    scores: torch.Tensor | None = None
    entropies: list | None = None
    top: list | None = None
    ar_top: list | None = None


def greedy_verifier(row: DecodingRow) -> bool:
    """A lossless row whose AR choice is the plain argmax (no sampling, no processors)."""
    sampler = row.settings.sampler
    return row.settings.lossless and not sampler.do_sample and not sampler.warpers


def own_draw(row: DecodingRow) -> bool:
    """Whether a row's fills need more than the batch's greedy tokens: a draw, or processors that change them."""
    return row.settings.sampler.do_sample or bool(row.settings.sampler.warpers)


def read_step(
    rows: list[DecodingRow], logits: torch.Tensor, n_masks: int, mask_token_id: int, ar_rows: dict
) -> StepReadout:
    """The readout of a forward's `logits` (batch, columns, vocab), whose last `n_masks` columns are masks;
    `ar_rows`: each row's AR columns."""
    out, parts = StepReadout(), []
    filling = [row for row in rows if not row.done]
    greedy_fills = any(not own_draw(row) for row in filling)
    if n_masks and filling:
        out.scores = suppress_token(logits[:, logits.shape[1] - n_masks :], mask_token_id)
        parts.append(entropy(out.scores))
        if greedy_fills:
            parts.append(greedy(out.scores).to(parts[0].dtype))
    if any(greedy_verifier(rows[b]) for b in ar_rows):
        parts.append(greedy(logits).to(parts[0].dtype if parts else torch.float32))
    if not parts:
        return out
    host = _unflatten(torch.cat([part.flatten() for part in parts]).tolist(), parts)  # the one read
    if out.scores is not None:
        out.entropies = host.pop(0)
        out.top = host.pop(0) if greedy_fills else None
    out.ar_top = host.pop(0) if host else None
    return out


def _unflatten(values: list, parts: list[torch.Tensor]) -> list:
    """`values`, the flattened `parts` one after the other, as one nested (batch, columns) list per part."""
    out, start = [], 0
    for part in parts:
        batch, width = part.shape
        out.append([values[start + b * width : start + (b + 1) * width] for b in range(batch)])
        start += batch * width
    return out
