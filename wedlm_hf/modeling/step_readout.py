"""The step's one read from the device, between the forward and the commit.

What the host needs from a forward, for every row at once: the entropy the fill rule reads and the greedy token of
every fed mask (`batch_fill`), and, for lossless rows that verify greedily, the argmax of every AR row
(`draft_verification`); for rows that sample, their random draws and the verdicts on their drafts (`step_draws`).
They are computed on the device and copied to the host in one transfer (token ids travel as float32, exact below
2**24, vocabularies far below it), before the commit, since none depends on what commits: the commit and the fill
then choose on the host.
"""

from dataclasses import dataclass, field

import torch

from .decoding_state import DecodingRow
from .step_draws import fill_draws, own_draw, verification_draws
from .window_filling import entropy, greedy, suppress_token


@dataclass
class StepReadout:
    """`scores`: the mask logits with the mask token suppressed (device, for draws; read only: with `premasked`, a view
    of the step's logits); `entropies` / `top`: per row, per mask column, on the host (`top` None where no greedy row
    fills); `ar_top`: per row, per logits column, the argmax (None where no lossless row verifies greedily);
    `predictions`: the `ArPredictions` of the lossless rows with their own AR choice, by row; `drawn`: (row, mask
    column) -> (token, q) of the fills drawn early."""

    scores: torch.Tensor | None = None
    entropies: list | None = None
    top: list | None = None
    ar_top: list | None = None
    predictions: dict = field(default_factory=dict)
    drawn: dict = field(default_factory=dict)


def greedy_verifier(row: DecodingRow) -> bool:
    """A verifying row (lossless, or default with context drafts) whose AR choice is the plain argmax (no sampling,
    no processors)."""
    return row.verifies and not row.settings.sampler.own_choice


def read_step(
    rows: list[DecodingRow],
    logits: torch.Tensor,
    n_masks: int,
    mask_token_id: int,
    ar_rows: dict,
    runs: list[int] | None = None,
    masks: list[list[int]] | None = None,
    premasked: bool = False,
) -> StepReadout:
    """The readout of a forward's `logits` (batch, columns, vocab), whose last `n_masks` columns are masks;
    `ar_rows`: each row's AR columns. With the feed's `runs` (each row's leading run), the lossless rows with
    their sampler's own choice are judged in the same read, and with its `masks` (each row's fed mask positions)
    the fills of rows with their own draw are drawn (`step_draws`); without, both come after the read.
    `premasked`: every column already has the mask token at -inf and no row draws its own fills (greedy default
    rows that draft from the context): one `max` over every column then gives the masks' maxima and greedy tokens
    and the AR argmax, and float32 mask columns are read in place (half ones in float32, as `suppress_token` reads
    them)."""
    out, parts = StepReadout(), []
    filling = [row for row in rows if not row.done]
    greedy_fills = any(not own_draw(row) for row in filling)
    verifying = any(greedy_verifier(rows[b]) for b in ar_rows)
    ar_top = None
    if n_masks and filling:
        mask_columns = logits[:, logits.shape[1] - n_masks :]
        if premasked and verifying:
            column_maxima, ar_top = logits.max(dim=-1)
            out.scores, maxima, top = mask_columns, column_maxima[:, -n_masks:], ar_top[:, -n_masks:]
            if mask_columns.dtype in (torch.float16, torch.bfloat16):  # as `suppress_token` reads them
                out.scores, maxima = mask_columns.float(), maxima.float()
        else:
            out.scores = suppress_token(mask_columns, mask_token_id)
            maxima, top = out.scores.max(dim=-1)  # `greedy`'s tokens, and the maxima the entropy shifts by
        parts.append(entropy(out.scores, maxima))
        if greedy_fills:
            parts.append(top.to(parts[0].dtype))
    if verifying:
        ar_top = greedy(logits) if ar_top is None else ar_top
        parts.append(ar_top.to(parts[0].dtype if parts else torch.float32))
    pending = []  # (tensors, what their values give, where it goes)
    if runs is not None:
        pending.append((*verification_draws(rows, logits, ar_rows, runs), out.predictions))
    if masks is not None and out.scores is not None:
        pending.append((*fill_draws(rows, out.scores, masks), out.drawn))
    drawn = [tensor for tensors, _, _ in pending for tensor in tensors]
    if not parts and not drawn:
        return out
    dtype = parts[0].dtype if parts else torch.float32  # token ids are exact in it (below 2**24)
    values = torch.cat([t.flatten().to(dtype) for t in parts + drawn]).tolist()  # the one read
    host = _unflatten(values, [t.shape for t in parts + drawn])
    if out.scores is not None:
        out.entropies = host.pop(0)
        out.top = host.pop(0) if greedy_fills else None
    out.ar_top = host.pop(0) if verifying else None
    for _, finish, result in pending:
        result.update(finish(host))
    return out


def _unflatten(values: list, shapes: list) -> list:
    """`values`, the flattened tensors of `shapes` one after the other: a (batch, columns) one as one list per
    batch row, a 1-D one as a list."""
    out, start = [], 0
    for shape in shapes:
        if len(shape) == 1:
            out.append(values[start : start + shape[0]])
            start += shape[0]
            continue
        batch, width = shape
        out.append([values[start + b * width : start + (b + 1) * width] for b in range(batch)])
        start += batch * width
    return out
