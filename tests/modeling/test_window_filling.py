"""`greedy`, the decoder's argmax: the index `torch.argmax` (AR generate's) gives, ties and -inf included; `entropy`,
what the fill rule reads."""

import inspect
import math

import pytest
import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from wedlm_hf.modeling.window_filling import FillSampler, entropy, greedy


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_greedy_is_argmax_with_ties_and_suppressed_tokens(dtype):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 4, (3, 17, 4096), generator=generator).to(dtype)  # many equal maxima per row
    logits[0, :, 5] = float("-inf")
    logits[1, 3] = 0.0  # a row of ties: the first index
    logits[2, 4, 2000:] = float("-inf")
    assert torch.equal(greedy(logits), logits.argmax(dim=-1))
    assert greedy(logits)[1, 3] == 0
    vectors = torch.randn(40, 4096, generator=generator).to(dtype)
    assert torch.equal(greedy(vectors), vectors.argmax(dim=-1))


def test_entropy_is_shannons_with_suppressed_tokens_contributing_nothing():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 40, generator=g, dtype=torch.float64) * 3
    logits[..., 7] = float("-inf")  # a suppressed token (the mask's)
    p = torch.softmax(logits, dim=-1)
    want = -(p * torch.where(p > 0, p.log(), 0)).sum(-1)
    assert torch.allclose(entropy(logits), want, atol=1e-12)
    assert torch.allclose(entropy(logits, logits.max(dim=-1).values), want, atol=1e-12)
    assert torch.allclose(entropy(torch.zeros(2, 16)), torch.full((2,), math.log(16)))
    sure = torch.full((1, 8), float("-inf"))
    sure[0, 3] = 5.0
    assert entropy(sure).item() == 0.0


def test_a_sampler_applies_its_processors_as_the_list_does_checking_them_once(monkeypatch):
    """The processors run in turn, as `LogitsProcessorList.__call__` runs them, but their signatures are checked
    when the sampler is made, not at every call (the list inspects every processor at every call: per row, several
    times a step, for a server whose requests each have their own sampler)."""
    warpers = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(5), TopPLogitsWarper(0.9)])
    sampler = FillSampler(True, warpers)
    logits = torch.randn((4, 32), generator=torch.Generator().manual_seed(0))
    want = warpers(torch.empty((4, 0), dtype=torch.long), logits.clone())

    def no_inspection(*args, **kwargs):
        raise AssertionError("a processor's signature was inspected at a call")

    monkeypatch.setattr(inspect, "signature", no_inspection)
    assert torch.equal(sampler.scores(logits), want)


def test_a_processor_that_takes_more_than_ids_and_scores_is_refused_when_the_sampler_is_made():
    class NeedsLength(LogitsProcessor):
        def __call__(self, input_ids, scores, cur_len):
            return scores

    with pytest.raises(
        ValueError, match=r"NeedsLength takes more than \(input_ids, scores\) \(input_ids, scores, cur_len\)"
    ):
        FillSampler(True, LogitsProcessorList([NeedsLength()]))
