"""Which masks of the window get filled in a step, and with which tokens.

docs/algorithm.md section 3.d: entropy of the raw logits (mask token suppressed), plus a distance penalty from the
leftmost remaining mask; every mask under the threshold is filled, or else the single lowest one (ties: leftmost). The
tokens come from the sampler, which applies the sampling warpers to the same suppressed logits.
"""

import torch
from transformers import LogitsProcessorList


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The index of the largest value over the last dimension: `argmax`'s (the first of equal maxima, as documented
    for both), taken through `max`, which a CPU computes in a third of argmax's time over a vocabulary."""
    return logits.max(dim=-1).indices


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
    """Greedy argmax, or sampling through score-only warpers (temperature, top-k, top-p, ...) built by `generate`.

    The same sampler draws the fills of masked slots and, in lossless decoding, the model's own AR tokens; the
    optional `generator` makes one row's draws independent of the others' (a server's per-request `seed`).
    """

    def __init__(self, do_sample: bool = False, warpers: LogitsProcessorList | None = None, generator=None):
        self.do_sample = do_sample
        self.warpers = warpers or LogitsProcessorList()
        self.generator = generator

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution (N, vocab) a sample is drawn from: softmax of the warped float logits."""
        logits = logits.float()
        no_context = torch.empty((logits.shape[0], 0), dtype=torch.long, device=logits.device)
        return torch.softmax(self.warpers(no_context, logits), dim=-1)

    def draw(self, probabilities: torch.Tensor) -> torch.Tensor:
        """One token id per row of a (N, vocab) distribution."""
        return torch.multinomial(probabilities, num_samples=1, generator=self.generator).squeeze(1)

    def uniform(self, device) -> float:
        """A U(0, 1) draw from the same stream, for accepting or rejecting a draft."""
        return float(torch.rand((), generator=self.generator, device=device))

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """Token ids (N,) for logits (N, vocab) (for fills, the mask token is already suppressed)."""
        if not self.do_sample:
            return greedy(logits)
        return self.draw(self.probabilities(logits))
