"""A step's random draws, made on the device before the step's one read (`step_readout`).

On a GPU every read of a tensor's value is a synchronisation, so what a sampled row decides with random draws is
computed on the device for the whole batch, and only its outcome travels with the step's one read:

- lossless verification (`verification_draws`): for each draft, whether it is kept (u * q(x) < p(x)) and the draw
  from the residual max(0, p - q) that takes its place if not, beside AR's own fresh draw at every position; the
  host then walks the verdicts in order (`ArPredictions.judge`);
- fills (`fill_draws`): a draw at every fed mask of a row with its own draw (sampling, or processors that change
  its greedy choice), from which the fill rule then keeps the masks it fills.

Rows that share a sampler draw together; a row with a generator of its own draws the same tokens alone or in any
batch. Drawing every mask and every residual costs random numbers no host-side walk would use, never a read. Left to
the host, after the commit: a grammar row's fills (its grammar walks the window first) and a lossless row's fills
under a processor that reads the context (the fills see the final token the commit places). Only where a read is a
synchronisation (`draws_before_read`): on a CPU every draw follows the read.
"""

from collections.abc import Callable

import torch

from .context_ids import row_contexts
from .decoding_state import DecodingRow
from .draft_verification import ArPredictions, device_index, sampler_blocks, split_sizes
from .sampler_batch import merged

Pending = tuple[list[torch.Tensor], Callable[[list[list[float]]], dict]]  # tensors to read; what their values give


def draws_before_read(device) -> bool:
    """Whether a step on `device` makes its draws before its one read: where a read is a synchronisation (an
    accelerator). On a CPU a read costs no more than its copy, while drawing at every fed mask costs sampling work at
    masks the rule does not fill: there the draws follow the read, only where the rule fills, and the verdicts are
    judged on the host (`draft_verification.host_predictions`). Both are exact."""
    return torch.device(device).type != "cpu"


def own_draw(row: DecodingRow) -> bool:
    """Whether a row's fills need more than the batch's greedy tokens: a draw, or processors that change them."""
    return row.settings.sampler.own_choice


def draws_early(row: DecodingRow) -> bool:
    """Whether the row's fills are drawn before the step's read (see the module docstring). Not a default-mode row
    that this step's commit ends (its run reaches a stop token or the budget): it fills nothing, and a draw for it
    would move the draws of the rows that share its sampler."""
    settings = row.settings
    if not own_draw(row) or row.done or row.grammar is not None:
        return False
    if row.verifies:  # (its fills see the final token the commit places)
        return not settings.sampler.reads_context
    run = row.window[: row.leading_run()]
    room = settings.max_new_tokens - len(row.generated)
    return len(run) < room and not any(slot.token in settings.stop_ids for slot in run)


def _groups(rows: list[DecodingRow], members) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for b in members:
        groups.setdefault(id(rows[b].settings.sampler), []).append(b)
    return list(groups.values())


def verification_draws(rows: list[DecodingRow], logits: torch.Tensor, ar_rows: dict, runs: list[int]) -> Pending:
    """For the lossless rows whose AR choice is their sampler's own: per sampler (`sampler_blocks`), the processed
    argmax, or AR's fresh draw at each of the row's AR positions and each draft's verdict (see `ArPredictions`)."""
    tensors, plans = [], []
    for members, sizes, sampler, scores in sampler_blocks(rows, logits, ar_rows):
        if not sampler.do_sample:
            tensors.append(scores)
            plans.append((members, sizes, None))
            continue
        drafts = [_judged(rows[b], j, runs[b]) for b in members for j in range(len(ar_rows[b]))]
        tensors += [sampler.draw(scores), *draft_verdicts(sampler, scores, drafts)]
        plans.append((members, sizes, drafts))

    def finish(values: list[list[float]]) -> dict:
        predictions = {}
        for members, sizes, drafts in plans:
            if drafts is None:
                chosen = [int(v) for v in values.pop(0)]
                for b, tokens in zip(members, split_sizes(chosen, sizes)):
                    predictions[b] = ArPredictions(rows[b].settings.sampler, tokens)
                continue
            fresh, kept, residual = ([int(v) for v in values.pop(0)] for _ in range(3))
            verdicts = [None if d is None else (d.token, bool(k), r) for d, k, r in zip(drafts, kept, residual)]
            for b, f, v in zip(members, split_sizes(fresh, sizes), split_sizes(verdicts, sizes)):
                predictions[b] = ArPredictions(rows[b].settings.sampler, f, verdicts=v)
        return predictions

    return tensors, finish


def _judged(row: DecodingRow, j: int, run: int):
    """The draft AR position j of the row judges (window slot j + 1 after a final token, j for a joining row), if
    one is judged against a distribution: a sampled fill that is verifiable, or a point-mass draft (copied, forced,
    a guess). None where the position has no draft or the draft is simply replaced by AR's fresh draw."""
    slot = j + (1 if row.prefilled else 0)
    if slot >= run:
        return None
    draft = row.window[slot]
    if row.trusts(draft):  # commits unjudged: no verdict, no draws spent on it
        return None
    if draft.source in ("context", "forced") or draft.guess or (draft.verifiable and draft.q is not None):
        return draft
    return None


def draft_verdicts(sampler, probs: torch.Tensor, drafts: list) -> list[torch.Tensor]:
    """Per position, whether its draft is kept and the residual draw in its place (both 0 where `drafts` has
    None). A draft x drawn from q is kept when u * q(x) < p(x), a point-mass draft (q(x) = 1) when u < p(x); the
    replacement is drawn from max(0, p - q) normalised (p where that vanishes, p == q up to rounding). `sampler`:
    the positions' sampler, or their `SamplerBatch`, whose judged positions' samplers draw for them."""
    count = len(drafts)
    kept = torch.zeros(count, device=probs.device)
    residual = torch.zeros(count, dtype=torch.long, device=probs.device)
    judged = [i for i, d in enumerate(drafts) if d is not None]
    if judged:
        index = device_index(judged, probs)
        tokens = device_index([drafts[i].token for i in judged], probs)
        p = probs[index]
        q = torch.zeros_like(p)
        point = [k for k, i in enumerate(judged) if drafts[i].source in ("context", "forced") or drafts[i].guess]
        drawn = sorted(set(range(len(judged))) - set(point))
        if drawn:
            q[device_index(drawn, p)] = torch.stack([drafts[judged[k]].distribution() for k in drawn]).to(p.dtype)
        if point:
            at = device_index(point, p)
            q[at, tokens[at]] = 1.0
        sampler = sampler.rows(judged)
        uniforms = sampler.uniforms(len(judged), probs.device)
        at = tokens[:, None]
        kept[index] = (uniforms * q.gather(1, at)[:, 0] < p.gather(1, at)[:, 0]).float()
        rest = (p - q).clamp_min(0)
        total = rest.sum(-1, keepdim=True)
        residual[index] = sampler.draw(torch.where(total > 0, rest, p))
    return [kept, residual]


def fill_draws(rows: list[DecodingRow], scores: torch.Tensor, masks: list[list[int]]) -> Pending:
    """For the rows that draw early (`draws_early`): per sampler, a token at every fed mask (row b's masks at logical
    positions `masks[b]`, right-aligned in the `scores` (batch, mask columns, vocab)), and for a sampled verifying row
    (lossless, or default with context drafts) the distribution it came from (a draft's q). A context-reading
    processor sees, at each mask, the committed text and the window's filled slots before it, up to the first mask
    (the leading run)."""
    n_masks = scores.shape[1]
    early = [b for b, row in enumerate(rows) if masks[b] and draws_early(row)]
    tensors, plans = [], []
    groups = [(rows[members[0]].settings.sampler, members) for members in _groups(rows, early)]
    for sampler, members in merged(groups, lambda members: sum([len(masks[b]) for b in members])):
        columns = [(b, c) for b in members for c in range(n_masks - len(masks[b]), n_masks)]
        block = scores[device_index([b for b, _ in columns], scores), device_index([c for _, c in columns], scores)]
        contexts = None
        if sampler.reads_context:
            wanted = []
            for b in members:
                row = rows[b]
                run = row.leading_run()
                wanted.append((row, [min(p - row.committed, run) for p in masks[b]]))
            contexts = row_contexts(wanted, scores.device)
        probs = sampler.probabilities(block, contexts) if sampler.do_sample else None
        tensors.append(sampler.draw(probs) if sampler.do_sample else sampler(block, contexts))
        plans.append((columns, probs))

    def finish(values: list[list[float]]) -> dict:
        drawn = {}
        for columns, probs in plans:
            for i, ((b, c), token) in enumerate(zip(columns, values.pop(0))):
                keep = probs is not None and (rows[b].verifies or rows[b].settings.keep_logits)
                drawn[b, c] = (int(token), (probs, i) if keep else None)
        return drawn

    return tensors, finish


def chosen_distributions(drawn: dict, chosen: list) -> None:
    """Gives the `chosen` fills, drawn early, their q: the rows of their blocks (every fed mask's distribution) that
    they were drawn from, gathered once per block so that a kept draft holds its own distribution, not the block."""
    blocks: dict[int, tuple] = {}
    for key in chosen:
        q = drawn[key][1]
        if q is not None:  # (every fed mask's block, row)
            blocks.setdefault(id(q[0]), (q[0], []))[1].append(key)
    for block, keys in blocks.values():
        kept = block.index_select(0, device_index([drawn[key][1][1] for key in keys], block))
        for j, key in enumerate(keys):
            drawn[key] = (drawn[key][0], (kept, j))
