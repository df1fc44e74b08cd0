"""The step's fill: which open masks of every row get a token, and which.

The device computes, for every mask column of the batch at once, the entropy the rule needs and the greedy token;
the host reads both in the step's one transfer (`step_readout`) and applies the rule (`window_filling.choose_fills`,
docs/algorithm.md section 3.d) row by row, on a few floats per row. A row with its own draw draws here, after the
commit, at the masks the rule fills (rows that share a sampler draw together, each row's in slot order), except
where the step drew before its read (an accelerator, `step_draws`): there a row takes the token drawn at that
mask, and only a grammar row, and a lossless row under a context-reading processor, still draw here.
"""

import torch

from .context_ids import row_contexts
from .decoding_state import DecodingRow, Fill
from .sampler_batch import merged
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
    # Rows with their own draw: their (batch row, mask column) keys in slot order, grouped by sampler, with each key's
    # window slot and whether it passed the threshold; and which rows keep the distributions their fills came from.
    groups, slots, sure, keeps, taken = {}, {}, {}, {}, []
    for b, row in enumerate(rows):
        pairs = open_masks(row, masks[b], n_masks) if masks[b] and not row.done else ()
        if not pairs:
            continue
        settings, columns = row.settings, [c for c, _ in pairs]
        offsets, row_entropies = [slot for _, slot in pairs], [entropies[b][c] for c in columns]
        picks = choose_fills(row_entropies, offsets, settings.entropy_threshold, settings.pos_penalty_factor)
        verifies = row.verifies
        if verifies and picks[0] != 0:  # the leftmost mask is the next draft a verification reaches
            picks = [0, *picks]
        confident = _confident(picks, row_entropies, offsets, settings)
        if verifies and not settings.lossless:  # the masks the next step feeds: what these earned (3.m)
            row.model_window.fitted(settings.window_size, sum(confident))
        if not settings.sampler.own_choice:  # the batch's greedy tokens
            window, tops = row.window, top[b]
            for i, sure_i in zip(picks, confident):
                window[offsets[i]] = Fill(int(tops[columns[i]]), confident=sure_i)
            continue
        keys = [(b, columns[i]) for i in picks]
        late = [key for key in keys if key not in early] if early else keys
        if len(late) < len(keys):  # drawn before the read: the row takes those draws
            taken += [key for key in keys if key in early]
        if late:  # samplers draw in the order of their first row that draws here
            groups.setdefault(id(settings.sampler), []).extend(late)
        slots.update(zip(keys, [offsets[i] for i in picks]))
        sure.update(zip(keys, confident))
        keeps[b] = (verifies or settings.keep_logits, verifies and settings.sampler.do_sample, keys)
    if not keeps:
        return
    drawn = _draw(rows, readout.scores, list(groups.values()), slots, keeps)
    if taken:
        drawn |= {key: early[key] for key in taken}
        chosen_distributions(drawn, taken)
    for b, (_, checks_draws, keys) in keeps.items():
        window = rows[b].window
        for key in keys:
            token, q = drawn[key]
            window[slots[key]] = Fill(token, q=q, confident=sure[key])
        if checks_draws:  # a verifying sampled row: a draft drawn after a mask before it was filled may have
            first_mask = rows[b].leading_run()  # steered that one
            for key in keys:
                window[slots[key]].verifiable = slots[key] <= first_mask


def _confident(picks: list[int], entropies: list[float], offsets: list[int], settings) -> list[bool]:
    """For each pick, whether its adjusted entropy is under the threshold (not the rule's fallback, the lowest)."""
    threshold, penalty = settings.entropy_threshold, settings.pos_penalty_factor
    if threshold is None:
        return [False] * len(picks)
    return [entropies[i] + penalty * (offsets[i] - offsets[0]) < threshold for i in picks]


def _draw(rows: list[DecodingRow], scores: torch.Tensor, groups: list[list[tuple]], slots: dict, keeps: dict) -> dict:
    """(row, column) -> (token, the distribution it was drawn from where a verifying row or keep_logits needs it:
    (the block, its row)) for the chosen (row, column) masks (at window slots `slots[row, column]`) of rows with
    their own draw, in `groups` of rows that share one sampler, each in row and slot order (samplers with the same
    warpers and generators of their own drawing as one: `sampler_batch`). A context-reading processor sees, at each
    mask, the committed text and the window's filled slots before it, up to the first mask (exact for the leftmost
    mask; docs/usage.md)."""
    out = {}
    for sampler, keys in merged([(rows[keys[0][0]].settings.sampler, keys) for keys in groups]):
        block = scores[[b for b, _ in keys], [c for _, c in keys]]
        contexts = None
        if sampler.reads_context:  # each row's contexts from one tensor (keys are in row order)
            runs: dict[int, int] = {}  # by row: its leading run, past which no key's context reaches
            for b, _ in keys:
                if b not in runs:
                    runs[b] = rows[b].leading_run()
            wanted: dict[int, list[int]] = {b: [] for b in runs}
            for key in keys:
                slot, run = slots[key], runs[key[0]]
                wanted[key[0]].append(slot if slot < run else run)
            contexts = row_contexts([(rows[b], ks) for b, ks in wanted.items()], scores.device)
        probs = sampler.probabilities(block, contexts) if sampler.do_sample else None
        tokens = sampler.draw(probs) if sampler.do_sample else sampler(block, contexts)
        keep = probs is not None
        out |= {
            key: (token, (probs, i) if keep and keeps[key[0]][0] else None)
            for i, (key, token) in enumerate(zip(keys, tokens.tolist()))
        }
    return out
