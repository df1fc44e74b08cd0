"""Lossless decoding: the model's own autoregressive choice decides which drafted tokens commit.

A WeDLM model is causal, so in every forward the row of a committed-order token (the window's leading filled
run is fed first, in logical order) is an ordinary next-token prediction given exactly the tokens before it. Those
rows verify the drafts that follow: greedy keeps a draft only if it is the argmax, sampling keeps it with
probability min(1, p/q) and otherwise draws from the normalised max(0, p - q) (speculative sampling), so the
output is distributed exactly as plain AR decoding with the same logits processors (docs/algorithm.md section 6).
"""

import torch

from .context_ids import row_contexts
from .sampler_batch import merged
from .window_filling import FillSampler


class ArPredictions:
    """The model's own AR predictions for consecutive window slots of one row, computed in the step's forward.

    Greedy: `choices[i]`, the argmax. Sampling: `choices[i]`, a fresh draw from AR's distribution after the
    warpers, and each draft's verdict judged on the device for the whole batch at once (`verdicts[i]`: the draft's
    token, whether it is kept, the residual draw in its place; `step_draws`), or, judged here on the host (a
    grammar's guess), `probabilities[i]` and `uniforms[i]`. Each is used at most once.
    """

    def __init__(self, sampler: FillSampler, choices: list[int], probabilities=None, uniforms=None, verdicts=None):
        self.sampler = sampler
        self.choices = choices
        self.probabilities = probabilities
        self.uniforms = uniforms
        self.verdicts = verdicts

    def own_token(self, i: int) -> int:
        """AR's token at slot i (the argmax, or a draw). The mask token is not suppressed: `generate` does not."""
        return self.choices[i]

    def held(self, i: int, tokens: list[int]) -> int:
        """Greedy: how many of the drafts `tokens`, at slots i, i + 1, ..., AR's argmax keeps (`judge` on each in
        turn, up to the first it rejects, in one pass)."""
        agree = [choice == token for choice, token in zip(self.choices[i : i + len(tokens)], tokens)]
        return agree.index(False) if False in agree else len(agree)

    def judge(self, i: int, draft) -> int | None:
        """None when `draft` (a window `Fill`) commits at slot i; otherwise the token AR decoding puts there.

        Sampling keeps a draft with probability min(1, p/q) and otherwise draws from normalised max(0, p - q), q
        being the distribution the draft was drawn from. A sampled draft is `verifiable` only if every slot before
        it was already filled when it was drawn: one drawn earlier than a draft before it may have steered that
        one, and conditioning on the earlier slot's acceptance would bias it. It is replaced by a fresh draw from
        p, which is always exact. A context or forced draft, or a grammar row's guess, is chosen without a draw of
        its own, so its q is a point mass: it is kept with probability p(x).
        """
        if not self.sampler.do_sample:
            return None if self.choices[i] == draft.token else self.choices[i]
        if self.verdicts is not None:  # judged on the device (`step_draws`): (draft token, kept, replacement)
            if self.verdicts[i] is None:
                return self.choices[i]
            token, kept, replacement = self.verdicts[i]
            if token != draft.token:
                raise RuntimeError("A draft changed between its verdict and its check: this is a bug in wedlm_hf.")
            return None if kept else replacement
        p = self.probabilities[i]
        if draft.source in ("context", "forced") or draft.guess:  # q is a point mass: keep with probability p(x)
            if self.uniforms[i] < float(p[draft.token]):
                return None
            residual = p.clone()
            residual[draft.token] = 0
        elif not draft.verifiable or draft.q is None:
            return self.choices[i]
        else:
            q = draft.distribution()
            if self.uniforms[i] * float(q[draft.token]) < float(p[draft.token]):
                return None
            residual = (p - q).clamp_min(0)
        if float(residual.sum()) <= 0:  # p == q up to rounding: rejection had probability ~0; p is then exact
            residual = p
        return int(self.sampler.draw((residual / residual.sum())[None])[0])


def greedy_predictions(rows: list, ar_rows: dict[int, list[int]], top: list | None) -> dict:
    """`ArPredictions` for the lossless rows whose AR choice is the plain argmax, from `top` (the step's readout:
    per row, the argmax of every logits column)."""
    argmax = [b for b in ar_rows if rows[b].verifies and not rows[b].settings.sampler.own_choice]
    return {b: ArPredictions(rows[b].settings.sampler, [int(top[b][c]) for c in ar_rows[b]]) for b in argmax}


def sampler_blocks(rows: list, logits: torch.Tensor, ar_rows: dict[int, list[int]]):
    """For the lossless rows whose AR choice is their sampler's own (a draw, or processors): per sampler, its rows,
    their AR position counts, and their AR logits processed as one block (samplers that process as one, one block
    for them all: `sampler_batch`). A context-reading processor sees, at each position, the committed text and the
    window's drafts before it: the real prefix AR `generate` would have there, so verification stays exact."""
    groups: dict[int, list[int]] = {}
    for b in ar_rows:
        if rows[b].verifies and rows[b].settings.sampler.own_choice:
            groups.setdefault(id(rows[b].settings.sampler), []).append(b)
    blocks = [(rows[members[0]].settings.sampler, members) for members in groups.values()]
    for sampler, members in merged(blocks, lambda members: sum([len(ar_rows[b]) for b in members])):
        index = [(b, c) for b in members for c in ar_rows[b]]
        block = logits[device_index([b for b, _ in index], logits), device_index([c for _, c in index], logits)]
        contexts = None
        if sampler.reads_context:  # row j predicts window slot j (a joining row) or j + 1 (one with a final token)
            wanted = []
            for b in members:
                shift = 1 if rows[b].prefilled else 0
                wanted.append((rows[b], [j + shift for j in range(len(ar_rows[b]))]))
            contexts = row_contexts(wanted, logits.device)
        scores = sampler.probabilities(block, contexts) if sampler.do_sample else sampler(block, contexts)
        yield members, [len(ar_rows[b]) for b in members], sampler, scores


def host_predictions(rows: list, logits: torch.Tensor, ar_rows: dict[int, list[int]]) -> dict:
    """`ArPredictions` of the lossless rows with their sampler's own choice, judged on the host after the step's
    read (a CPU, where reads cost no synchronisation): the processed argmax, or the distributions with one fresh
    draw and one uniform per position, read here; a residual is drawn only where a draft is rejected."""
    predictions = {}
    for members, sizes, sampler, scores in sampler_blocks(rows, logits, ar_rows):
        if not sampler.do_sample:
            for b, tokens in zip(members, split_sizes(scores.tolist(), sizes)):
                predictions[b] = ArPredictions(rows[b].settings.sampler, tokens)
            continue
        fresh = sampler.draw(scores).tolist()
        uniforms = sampler.uniforms(len(fresh), scores.device).tolist()
        parts = zip(scores.split(sizes), split_sizes(fresh, sizes), split_sizes(uniforms, sizes))
        for b, (p, f, u) in zip(members, parts):
            predictions[b] = ArPredictions(rows[b].settings.sampler, f, p, u)
    return predictions


def device_index(values: list[int], like: torch.Tensor) -> torch.Tensor:
    """Indices as a tensor on `like`'s device, copied without waiting for the work queued there (indexing by a
    list would: its copy synchronises)."""
    return torch.tensor(values, dtype=torch.long).to(like.device, non_blocking=True)


def split_sizes(values: list, sizes: list[int]) -> list[list]:
    """`values` cut into consecutive pieces of `sizes`."""
    out, start = [], 0
    for n in sizes:
        out.append(values[start : start + n])
        start += n
    return out
