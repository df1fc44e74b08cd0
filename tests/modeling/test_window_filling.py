"""`greedy`, the decoder's argmax: the index `torch.argmax` (AR generate's) gives, ties and -inf included."""

import pytest
import torch

from wedlm_hf.modeling.window_filling import greedy


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
