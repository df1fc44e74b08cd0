"""`greedy`, the decoder's argmax: the index `torch.argmax` (AR generate's) gives, ties and -inf included; `entropy`,
what the fill rule reads."""

import inspect
import math

import pytest
import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from wedlm_hf.modeling.processor_contexts import Contexts
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


class CountsSeen(LogitsProcessor):
    """Lowers each token by how often it occurs in the context; ids past the vocabulary are not counted."""

    ignores_ids_past_vocabulary = True

    def __init__(self):
        self.calls = 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        counts = scores.new_zeros(scores.shape[0], scores.shape[1] + 1)
        counts.scatter_add_(1, input_ids.clamp(max=scores.shape[1]), torch.ones_like(input_ids, dtype=scores.dtype))
        return scores - counts[:, :-1]


@pytest.mark.parametrize("readers", ["padding-safe", "with-ngram"])
def test_a_window_of_contexts_is_processed_as_one_block_where_the_processors_ignore_padding(readers):
    """Each position is processed with its own context as AR would: where every processor that reads it ignores
    ids past the vocabulary, the window's positions, each a context one token longer, take one call on a padded
    block; beside one that does not (a no-repeat n-gram ban), a call per context length."""
    counting = CountsSeen()
    processors = [counting, TemperatureLogitsWarper(0.6)]
    if readers == "with-ngram":
        processors.insert(1, NoRepeatNGramLogitsProcessor(2))
    sampler = FillSampler(False, LogitsProcessorList(processors))
    assert sampler.batch_form is None and sampler.padded_contexts == (readers == "padding-safe")
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 20, (9,), generator=g)
    contexts = Contexts([ids], [0] * 5, [3, 4, 5, 7, 9])
    logits = torch.randn((5, 20), generator=g)
    want = []
    for n in range(5):
        row = logits[n : n + 1]
        for processor in processors:
            row = processor(contexts[n][None], row)
        want.append(row)
    counting.calls = 0
    assert torch.equal(sampler.scores(logits, contexts), torch.cat(want))
    assert counting.calls == (1 if readers == "padding-safe" else 5)
    assert torch.equal(sampler.scores(logits, list(contexts)), torch.cat(want))  # a list of tensors alike
