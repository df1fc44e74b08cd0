"""Lossless decoding: the model's own autoregressive choice decides which drafted tokens commit.

A WeDLM model is causal, so in every forward the row of a committed-order token (the window's leading filled
run is fed first, in logical order) is an ordinary next-token prediction given exactly the tokens before it. Those
rows verify the drafts that follow: greedy keeps a draft only if it is the argmax, sampling keeps it with
probability min(1, p/q) and otherwise draws from the normalised max(0, p - q) (speculative sampling), so the
output is distributed exactly as plain AR decoding with the same logits processors (docs/algorithm.md section 6).
"""

import torch

from .window_filling import FillSampler


class ArPredictions:
    """The model's own AR predictions for consecutive window slots of one row, computed in the step's forward.

    Greedy: `choices[i]`, the argmax. Sampling: `probabilities[i]` after the warpers, with `fresh[i]` (a draw from
    it) and `uniforms[i]` drawn up front for the whole batch at once; each is used at most once.
    """

    def __init__(self, sampler: FillSampler, choices: list[int], probabilities=None, uniforms=None):
        self.sampler = sampler
        self.choices = choices
        self.probabilities = probabilities
        self.uniforms = uniforms

    def own_token(self, i: int) -> int:
        """AR's token at slot i (the argmax, or a draw). The mask token is not suppressed: `generate` does not."""
        return self.choices[i]

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
        p = self.probabilities[i]
        if draft.source in ("context", "forced") or draft.guess:  # q is a point mass: keep with probability p(x)
            if self.uniforms[i] < float(p[draft.token]):
                return None
            residual = p.clone()
            residual[draft.token] = 0
        elif not draft.verifiable or draft.q is None:
            return self.choices[i]
        else:
            q = draft.q
            if self.uniforms[i] * float(q[draft.token]) < float(p[draft.token]):
                return None
            residual = (p - q).clamp_min(0)
        if float(residual.sum()) <= 0:  # p == q up to rounding: rejection had probability ~0; p is then exact
            residual = p
        return int(self.sampler.draw((residual / residual.sum())[None])[0])


def ar_predictions(rows: list, logits: torch.Tensor, ar_rows: dict[int, list[int]], top: list | None) -> dict:
    """`ArPredictions` for every lossless row: greedy rows' from `top` (the step's readout: per row, the argmax of
    every logits column), the others computed in one pass per sampler (the processed argmax, or distributions with
    one fresh draw and one uniform per position, used only where needed). A context-reading processor sees, at each
    position, the committed text and the window's drafts before it: the real prefix AR `generate` would have there,
    so verification stays exact."""
    predictions, groups = {}, {}
    for b in ar_rows:
        groups.setdefault(id(rows[b].settings.sampler), []).append(b)
    for members in groups.values():
        sampler = rows[members[0]].settings.sampler
        if sampler.do_sample or sampler.warpers:
            sizes = [len(ar_rows[b]) for b in members]
            block = logits[[b for b in members for _ in ar_rows[b]], [c for b in members for c in ar_rows[b]]]
            contexts = None
            if sampler.reads_context:  # row j predicts window slot j (a joining row) or j + 1 (one with a final token)
                contexts = []
                for b in members:
                    shift = 1 if rows[b].prefilled else 0
                    contexts += rows[b].contexts([j + shift for j in range(len(ar_rows[b]))], logits.device)
            if not sampler.do_sample:
                chosen = sampler(block, contexts).tolist()
                for b, tokens in zip(members, _split(chosen, sizes)):
                    predictions[b] = ArPredictions(sampler, tokens)
                continue
            probs = sampler.probabilities(block, contexts)
            fresh = sampler.draw(probs).tolist()
            uniforms = torch.rand(len(fresh), generator=sampler.generator, device=probs.device).tolist()
            parts = zip(probs.split(sizes), _split(fresh, sizes), _split(uniforms, sizes))
            for b, (p, f, u) in zip(members, parts):
                predictions[b] = ArPredictions(sampler, f, p, u)
        else:
            for b in members:
                predictions[b] = ArPredictions(sampler, [int(top[b][c]) for c in ar_rows[b]])
    return predictions


def _split(values: list, sizes: list[int]) -> list[list]:
    out, start = [], 0
    for n in sizes:
        out.append(values[start : start + n])
        start += n
    return out
