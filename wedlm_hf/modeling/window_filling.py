"""Which masks of the window get filled in a step, and with which tokens.

WEDLM.md section 3.d: entropy of the raw logits (mask token suppressed), plus a distance penalty from the leftmost
remaining mask; every mask under the threshold is filled, or else the single lowest one (ties: leftmost). The
tokens come from the sampler, which applies the sampling warpers to the same suppressed logits.
"""

import torch
from transformers import LogitsProcessorList


def suppress_token(logits: torch.Tensor, token_id: int) -> torch.Tensor:
    """Float logits (at least float32) with `token_id` at -inf, so the mask token is never predicted."""
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits.clone()
    logits[..., token_id] = float("-inf")
    return logits


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats of softmax(logits) over the last dimension; -inf logits contribute 0."""
    log_probs = torch.log_softmax(logits, dim=-1)
    return -(log_probs.exp() * log_probs.clamp_min(torch.finfo(log_probs.dtype).min)).sum(-1)


def choose_fills(entropies: list[float], offsets: list[int], threshold: float | None, pos_penalty: float) -> list[int]:
    """Indices (into the ascending list of remaining masks) to fill this step.

    adjusted = entropy + pos_penalty * (offset - leftmost offset); all with adjusted < threshold, else the argmin.
    `threshold=None` fills exactly one mask per step.
    """
    leftmost = offsets[0]
    adjusted = [h + pos_penalty * (o - leftmost) for h, o in zip(entropies, offsets)]
    if threshold is not None:
        confident = [i for i, a in enumerate(adjusted) if a < threshold]
        if confident:
            return confident
    return [min(range(len(adjusted)), key=adjusted.__getitem__)]


class FillSampler:
    """Greedy argmax, or sampling through score-only warpers (temperature, top-k, top-p, ...) built by `generate`."""

    def __init__(self, do_sample: bool, warpers: LogitsProcessorList | None = None):
        self.do_sample = do_sample
        self.warpers = warpers or LogitsProcessorList()

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """Token ids (N,) for logits (N, vocab) whose mask token is already suppressed."""
        if not self.do_sample:
            return logits.argmax(dim=-1)
        no_context = torch.empty((logits.shape[0], 0), dtype=torch.long, device=logits.device)
        scores = self.warpers(no_context, logits)
        return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
