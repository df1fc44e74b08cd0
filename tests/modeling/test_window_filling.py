"""`greedy`, the decoder's argmax: the index `torch.argmax` (AR generate's) gives, ties and -inf included; `entropy`,
what the fill rule reads."""

import math

import pytest
import torch

from wedlm_hf.modeling.window_filling import entropy, greedy


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
