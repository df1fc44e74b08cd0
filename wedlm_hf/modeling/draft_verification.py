"""Lossless decoding: the model's own autoregressive choice decides which drafted tokens commit.

A WeDLM model is causal, so in every forward the row of a committed-order token (the window's leading filled
run is fed first, in logical order) is an ordinary next-token prediction given exactly the tokens before it. Those
rows verify the drafts that follow: greedy keeps a draft only if it is the argmax, sampling keeps it with
probability min(1, p/q) and otherwise draws from the normalised max(0, p - q) (speculative sampling), so the
output is distributed exactly as plain AR decoding with the same warpers (docs/algorithm.md, "Lossless decoding").
"""

import torch

from .window_filling import FillSampler


def ar_choice(ar_logits: torch.Tensor, sampler: FillSampler) -> int:
    """The model's own token at a position, from the AR logits (vocab,) of the token before it: the argmax, or a
    draw from the warped distribution. The mask token is not suppressed: plain `generate` does not either."""
    if not sampler.do_sample:
        return int(ar_logits.argmax())
    return int(sampler.draw(sampler.probabilities(ar_logits[None]))[0])


def judge_draft(
    token: int, q: torch.Tensor | None, verifiable: bool, ar_logits: torch.Tensor, sampler: FillSampler
) -> int | None:
    """None when the draft `token` commits; otherwise the token AR decoding puts there instead.

    q is the distribution the draft was drawn from (sampling only). A sampled draft is `verifiable` only if every
    slot before it was already filled when it was drawn: a draft drawn earlier than a draft before it may have
    steered that one, and conditioning on the earlier slot's acceptance would then bias it. Such a draft is
    replaced by a fresh draw from p, which is always exact.
    """
    if not sampler.do_sample:
        choice = int(ar_logits.argmax())
        return None if choice == token else choice
    p = sampler.probabilities(ar_logits[None])[0]
    if not verifiable or q is None:
        return int(sampler.draw(p[None])[0])
    q = q.to(p.device)
    if sampler.uniform(p.device) * float(q[token]) < float(p[token]):
        return None
    residual = (p - q).clamp_min(0)
    if float(residual.sum()) <= 0:  # p == q up to rounding: rejection had probability ~0; p is then exact
        residual = p
    return int(sampler.draw((residual / residual.sum())[None])[0])
