"""Lossless sampling draws from plain AR sampling's distribution: a chi-square test on a tiny vocabulary.

The exact AR distribution of the first three tokens (same temperature / top-k warpers as `generate`) is computed
by enumerating every prefix; 20,000 lossless samples, drawn as one batch, must fit it. The same test rejects the
default (not lossless) WeDLM sampler, whose fills follow the mask predictions instead: the test has the power to
see a wrong acceptance rule.

Where the time goes: all of it is in `generate` on 20,000 rows (the decoder's per-row Python in preparing, stepping
and retiring rows); the exact distribution is one forward over 25 rows. The only saving left to the test is to draw
the same default-mode samples once (`default_counts`).
"""

import itertools

import pytest
import torch
from conftest import chi_square_p_value, count_unfed_ends, peaky, tiny_config
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)

from wedlm_hf import WeDLMForCausalLM
from wedlm_hf.modeling import streaming_decoder

VOCAB, MASK = 5, 4
PROMPT = [0, 1, 2, 3, 0]
SAMPLES = 20_000


@pytest.fixture(scope="module")
def tiny_vocab_model():
    torch.manual_seed(11)
    model = WeDLMForCausalLM(tiny_config(vocab_size=VOCAB, mask_token_id=MASK, pad_token_id=0, eos_token_id=None))
    return peaky(model, scale=6.0).eval()


def exact_ar_joint(model, warpers) -> dict[tuple, float]:
    """P(t1, t2, t3 | prompt) under AR sampling with the warpers: one forward over every two-token prefix."""
    prefixes = list(itertools.product(range(VOCAB), repeat=2))
    ids = torch.tensor([PROMPT + list(p) for p in prefixes])
    with torch.no_grad():
        logits = model(ids).logits[:, -3:].float()
    probs = [torch.softmax(warpers(ids, logits[:, i].clone()), dim=-1) for i in range(3)]
    joint = {}
    for k, (a, b) in enumerate(prefixes):
        for c in range(VOCAB):
            joint[(a, b, c)] = float(probs[0][k, a] * probs[1][k, b] * probs[2][k, c])
    return joint


@pytest.fixture(scope="module")
def default_counts(tiny_vocab_model):
    """The paper's default sampler's counts for a case's settings (`wedlm_context_drafts=False`: its fills follow
    the mask predictions, unchecked), drawn once per settings it reads, so "all-masks" and "model-drafts-only",
    which differ only in `wedlm_context_drafts`, share their default samples (seeded alike: the same counts)."""
    drawn = {}

    def counts(settings: dict, before_read: bool) -> dict:
        key = (before_read, tuple(sorted((k, v) for k, v in settings.items() if k != "wedlm_context_drafts")))
        if key not in drawn:
            drawn[key] = sample_counts(tiny_vocab_model, **{**settings, "wedlm_context_drafts": False})
        return drawn[key]

    return counts


def sample_counts(model, context_judged: list | None = None, **kwargs) -> dict:
    torch.manual_seed(0)
    ids = torch.tensor([PROMPT]).repeat(SAMPLES, 1)
    out = model.generate(
        ids,
        strategy="wedlm",
        max_new_tokens=3,
        do_sample=True,
        eos_token_id=None,
        return_dict_in_generate=True,
        **kwargs,
    )
    counts = {}
    for row in out.sequences[:, len(PROMPT) :].tolist():
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    if context_judged is not None and out.wedlm_stats is not None:
        context_judged.append(sum(s.accepted_context_drafts + s.rejected_context_drafts for s in out.wedlm_stats))
    return counts


@pytest.mark.parametrize(
    "settings",
    [
        dict(wedlm_window_size=3, wedlm_entropy_threshold=1e9, temperature=1.0),  # every mask drafted at once
        dict(wedlm_window_size=3, wedlm_entropy_threshold=None, temperature=0.8, top_k=4),  # one fill a step
        dict(wedlm_window_size=3, wedlm_entropy_threshold=1e9, temperature=1.0, wedlm_context_drafts=False),
        # context drafts (q a point mass) ahead of the model's: the prompt repeats, so 1- and 2-grams match
        dict(wedlm_window_size=3, wedlm_entropy_threshold=None, temperature=1.2, wedlm_context_ngram=2),
    ],
    ids=["all-masks", "one-fill-top-k", "model-drafts-only", "context-drafts"],
)
@pytest.mark.parametrize("before_read", [False, True], ids=["draws-after-read", "draws-before-read"])
def test_lossless_sampling_matches_ar_sampling(tiny_vocab_model, default_counts, settings, before_read, monkeypatch):
    """Both ways of drawing: after the step's read, judged on the host (a CPU's), and before it, judged on the
    device (an accelerator's, `step_draws`)."""
    monkeypatch.setattr(streaming_decoder, "draws_before_read", lambda device: before_read)
    unfed = count_unfed_ends(monkeypatch)
    warpers = LogitsProcessorList([TemperatureLogitsWarper(settings["temperature"])])
    if "top_k" in settings:
        warpers.append(TopKLogitsWarper(settings["top_k"]))
    expected = exact_ar_joint(tiny_vocab_model, warpers)
    judged = []
    lossless = sample_counts(tiny_vocab_model, judged, wedlm_lossless=True, **settings)
    assert chi_square_p_value(lossless, expected, SAMPLES) > 1e-3
    assert sum(unfed) > SAMPLES // 2  # most rows' third token was drafted and checked by the row before it, unfed
    if "wedlm_context_ngram" in settings:  # the case made for them: context drafts were verified, not just proposed
        assert judged[0] > SAMPLES // 10
    if not settings.get("wedlm_context_drafts", True):
        assert judged[0] == 0
    # Power: without verification the fills follow the mask predictions, a different distribution.
    default = default_counts(settings, before_read)
    assert chi_square_p_value(default, expected, SAMPLES) < 1e-6


def exact_ar_joint_in_context(model, processors) -> dict[tuple, float]:
    """As `exact_ar_joint`, for processors that read the context: each position's with the tokens before it."""
    prefixes = list(itertools.product(range(VOCAB), repeat=2))
    ids = torch.tensor([PROMPT + list(p) for p in prefixes])
    with torch.no_grad():
        logits = model(ids).logits[:, -3:].float()
    width = len(PROMPT)
    probs = [
        torch.softmax(
            torch.cat(
                [processors(ids[k : k + 1, : width + i], logits[k : k + 1, i].clone()) for k in range(len(prefixes))]
            ),
            dim=-1,
        )
        for i in range(3)
    ]
    joint = {}
    for k, (a, b) in enumerate(prefixes):
        for c in range(VOCAB):
            joint[(a, b, c)] = float(probs[0][k, a] * probs[1][k, b] * probs[2][k, c])
    return joint


@pytest.mark.parametrize("before_read", [False, True], ids=["draws-after-read", "draws-before-read"])
def test_lossless_sampling_with_a_repetition_penalty_matches_ar_sampling(tiny_vocab_model, before_read, monkeypatch):
    """A processor that reads the context is applied at each verified position with its real prefix: the samples
    fit AR sampling with the same penalty, and not AR sampling without it (the test can tell them apart)."""
    monkeypatch.setattr(streaming_decoder, "draws_before_read", lambda device: before_read)
    settings = dict(wedlm_window_size=3, wedlm_entropy_threshold=1e9, temperature=0.9, repetition_penalty=3.0)
    temperature = LogitsProcessorList([TemperatureLogitsWarper(0.9)])
    expected = exact_ar_joint_in_context(
        tiny_vocab_model, LogitsProcessorList([RepetitionPenaltyLogitsProcessor(3.0), *temperature])
    )
    lossless = sample_counts(tiny_vocab_model, wedlm_lossless=True, **settings)
    assert chi_square_p_value(lossless, expected, SAMPLES) > 1e-3
    assert chi_square_p_value(lossless, exact_ar_joint(tiny_vocab_model, temperature), SAMPLES) < 1e-6
