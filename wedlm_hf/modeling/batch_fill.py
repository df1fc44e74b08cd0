"""The step's fill: which open masks of every row get a token, and which.

The device computes, for every mask column of the batch at once, the entropy the rule needs and the greedy token;
the host reads both in the step's one transfer (`step_readout`) and applies the rule (`window_filling.choose_fills`,
docs/algorithm.md section 3.d) row by row, on a few floats per row. A row with its own draw draws here, after the
commit, at the masks the rule fills (rows that share a sampler draw together, each row's in slot order), except
where the step drew before its read (an accelerator, `step_draws`): there a row takes the token drawn at that
mask, and only a grammar row, and a lossless row under a context-reading processor, still draw here.
"""

import torch

from .decoding_state import DecodingRow, DrawnRow, Fill
from .step_draws import chosen_distributions
from .step_feed import open_masks
from .step_readout import StepReadout
from .window_filling import choose_fills


def fill_masks(rows: list[DecodingRow], masks: list[list[int]], readout: StepReadout) -> None:
    """Fills the open masks of `rows` from this step's `readout` (`step_readout`), row b's fed masks at logical
    positions `masks[b]`, right-aligned. Every mask under the threshold (entropy plus the position penalty from the
    row's leftmost open mask) is filled, else the row's lowest one; a verifying row (lossless, or default with
    context drafts) always fills its leftmost open mask, the next draft a verification reaches."""
    if readout.scores is None:
        return
    n_masks, entropies, top, early = readout.scores.shape[1], readout.entropies, readout.top, readout.drawn
    chosen, slots, sure = [], {}, {}  # (batch row, mask column) of the rows with their own draw, in slot order;
    # their slots and whether each passed the threshold
    for b, row in enumerate(rows):
        pairs = open_masks(row, masks[b], n_masks) if masks[b] and not row.done else ()
        if not pairs:
            continue
        settings, columns = row.settings, [c for c, _ in pairs]
        offsets, row_entropies = [slot for _, slot in pairs], [entropies[b][c] for c in columns]
        picks = choose_fills(row_entropies, offsets, settings.entropy_threshold, settings.pos_penalty_factor)
        if row.verifies and picks[0] != 0:  # the leftmost mask is the next draft a verification reaches
            picks = [0, *picks]
        confident = _confident(picks, row_entropies, offsets, settings)
        if row.verifies and not settings.lossless:  # the masks the next step feeds: what these earned (3.m)
            row.model_window.fitted(settings.window_size, sum(confident))
        if not settings.sampler.own_choice:  # the batch's greedy tokens
            window, tops = row.window, top[b]
            for i, sure_i in zip(picks, confident):
                window[offsets[i]] = Fill(int(tops[columns[i]]), confident=sure_i)
            continue
        for i, sure_i in zip(picks, confident):
            chosen.append((b, columns[i]))
            slots[b, columns[i]], sure[b, columns[i]] = offsets[i], sure_i
    if not chosen:
        return
    drawn = _draw(rows, readout.scores, [key for key in chosen if key not in early], slots)
    drawn |= {key: early[key] for key in chosen if key in early}
    chosen_distributions(drawn, chosen)
    for b, c in chosen:
        token, q = drawn[b, c]
        rows[b].window[slots[b, c]] = Fill(token, q=q, confident=sure[b, c])
    first_masks = {}  # per verifying sampled row, its window's first mask after this fill
    for b, c in chosen:
        row = rows[b]
        if row.verifies and row.settings.sampler.do_sample:  # a draft drawn after a mask before it was
            if b not in first_masks:  # filled may have steered that one
                first_masks[b] = row.leading_run()
            row.window[slots[b, c]].verifiable = slots[b, c] <= first_masks[b]


def _confident(picks: list[int], entropies: list[float], offsets: list[int], settings) -> list[bool]:
    """For each pick, whether its adjusted entropy is under the threshold (not the rule's fallback, the lowest)."""
    threshold, penalty = settings.entropy_threshold, settings.pos_penalty_factor
    if threshold is None:
        return [False] * len(picks)
    return [entropies[i] + penalty * (offsets[i] - offsets[0]) < threshold for i in picks]


def _draw(rows: list[DecodingRow], scores: torch.Tensor, chosen: list[tuple[int, int]], slots: dict) -> dict:
    """(row, column) -> (token, the distribution it was drawn from where a verifying row needs it) for the
    chosen (row, column) masks (at window slots `slots[row, column]`) of rows with their own draw; rows sharing one
    sampler draw together, in `chosen`'s order. A context-reading processor sees, at each mask, the committed text
    and the window's filled slots before it, up to the first mask (exact for the leftmost mask; docs/usage.md)."""
    groups: dict[int, list[int]] = {}
    for k, (b, _) in enumerate(chosen):
        groups.setdefault(id(rows[b].settings.sampler), []).append(k)
    out = {}
    for members in groups.values():
        sampler = rows[chosen[members[0]][0]].settings.sampler
        block = scores[[chosen[k][0] for k in members], [chosen[k][1] for k in members]]
        contexts = None
        if sampler.reads_context:  # each row's contexts from one tensor (members are in row order)
            wanted: dict[int, list[int]] = {}
            for k in members:
                b, c = chosen[k]
                wanted.setdefault(b, []).append(min(slots[b, c], rows[b].leading_run()))
            contexts = [ids for b, ks in wanted.items() for ids in rows[b].contexts(ks, scores.device)]
        probs = sampler.probabilities(block, contexts) if sampler.do_sample else None
        tokens = sampler.draw(probs) if sampler.do_sample else sampler(block, contexts)
        for i, token in enumerate(tokens.tolist()):
            b, c = chosen[members[i]]
            keep = probs is not None and (rows[b].verifies or rows[b].settings.keep_logits)
            out[b, c] = (token, DrawnRow(probs, i) if keep else None)
    return out
