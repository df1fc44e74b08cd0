"""Logits processors that read the context (penalties, minimum lengths, bans, custom processors) under WeDLM decoding.

Lossless mode applies them at every verified position with its real prefix, so its output is AR `generate`'s with
the same arguments; default mode applies them to each filled mask with the committed text as the context
(docs/usage.md). Sampling in distribution: `test_lossless_sampling.py`.
"""

import pytest
import torch
from conftest import EOS_ID, build_model, prompts
from transformers import LogitsProcessor, LogitsProcessorList


class NoImmediateRepeat(LogitsProcessor):
    """A custom processor that reads the context: the last token may not come again at once."""

    def __call__(self, input_ids, scores):
        return scores.scatter(1, input_ids[:, -1:], float("-inf"))


class Recording(LogitsProcessor):
    """Records every context it is shown, changing nothing."""

    def __init__(self):
        self.seen = []

    def __call__(self, input_ids, scores):
        self.seen += input_ids.tolist()
        return scores


PROCESSORS = {
    "repetition_penalty": dict(repetition_penalty=1.6),
    "no_repeat_ngram_size": dict(no_repeat_ngram_size=2),
    "min_new_tokens": dict(min_new_tokens=20),
    "bad_words_ids": dict(bad_words_ids=[[53, 45], [80]]),
    "sequence_bias": dict(sequence_bias={(80,): -5.0, (53, 45): -9.0}),
    "custom": dict(logits_processor=LogitsProcessorList([NoImmediateRepeat()])),
}


@pytest.fixture(scope="module")
def model():
    return build_model(seed=3)


@pytest.fixture(scope="module")
def eos_model():
    """A model whose greedy text ends early: its stop token is one it predicts often."""
    model = build_model(seed=3)
    ids, mask = prompts(3, lengths=(7, 11, 5))
    out = model.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=None)
    model.generation_config.eos_token_id = int(out[:, ids.shape[1] :].flatten().mode().values)
    return model


@pytest.mark.parametrize("name", list(PROCESSORS))
def test_lossless_greedy_equals_ar_with_the_same_processors(eos_model, name):
    kwargs = dict(max_new_tokens=24, pad_token_id=EOS_ID, do_sample=False, **PROCESSORS[name])
    changed = False
    for batch in (1, 3):
        ids, mask = prompts(batch, lengths=(7, 11, 5))
        ar = eos_model.generate(ids, attention_mask=mask, **kwargs)
        plain = eos_model.generate(ids, attention_mask=mask, **{**kwargs, **dict.fromkeys(PROCESSORS[name])})
        changed |= ar.shape != plain.shape or not torch.equal(ar, plain)
        for window in (4, 16):
            out = eos_model.generate(
                ids, attention_mask=mask, strategy="wedlm", wedlm_lossless=True, wedlm_window_size=window, **kwargs
            )
            assert torch.equal(out, ar), (batch, window)
    assert changed  # the processor changes AR's text here, so equality is not for free


def test_lossless_with_processors_on_the_shipped_model(shipped_model):
    model, tokenizer = shipped_model
    ids = tokenizer(["def fibonacci(n):\n    "], return_tensors="pt").input_ids
    kwargs = dict(max_new_tokens=40, do_sample=False, repetition_penalty=1.3, no_repeat_ngram_size=3)
    ar = model.generate(ids, **kwargs)
    assert not torch.equal(ar, model.generate(ids, max_new_tokens=40, do_sample=False))
    out = model.generate(ids, strategy="wedlm", wedlm_lossless=True, return_dict_in_generate=True, **kwargs)
    assert torch.equal(out.sequences, ar)
    assert out.wedlm_stats[0].accepted_drafts > 0  # still several tokens per forward


@pytest.mark.parametrize("context_drafts", [False, True], ids=["paper-rule", "default"])
def test_default_mode_shows_each_fill_the_committed_text(model, context_drafts):
    """A banned token never appears and a minimum length holds. Under the paper's rule (every fill commits) every
    context a processor sees is the row's padded prompt and a prefix of its committed text; by default it may also
    hold the window's drafts that AR then rejects (copies, the fallback fill), as in lossless mode."""
    ids, mask = prompts(3, lengths=(7, 11, 5))
    rule = dict(strategy="wedlm", wedlm_context_drafts=context_drafts)
    free = model.generate(ids, attention_mask=mask, max_new_tokens=24, eos_token_id=None, **rule)
    banned = int(free[:, ids.shape[1] :].flatten().mode().values)
    recording = Recording()
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=24,
        eos_token_id=None,
        bad_words_ids=[[banned]],
        logits_processor=LogitsProcessorList([recording]),
        **rule,
    )
    assert banned not in out[:, ids.shape[1] :].tolist()
    rows = out.tolist()
    assert recording.seen and all(any(row[: ids.shape[1]] == c[: ids.shape[1]] for row in rows) for c in recording.seen)
    if not context_drafts:
        assert all(any(row[: len(c)] == c for row in rows) for c in recording.seen)
    assert all(len(c) >= ids.shape[1] for c in recording.seen)  # never shorter than the padded prompt

    stop = banned  # a token the model emits often: min_new_tokens holds it back
    out = model.generate(
        ids,
        attention_mask=mask,
        strategy="wedlm",
        max_new_tokens=24,
        eos_token_id=stop,
        min_new_tokens=12,
        pad_token_id=EOS_ID,
    )
    assert all(stop not in row[ids.shape[1] : ids.shape[1] + 11] for row in out.tolist())
    early = model.generate(
        ids, attention_mask=mask, strategy="wedlm", max_new_tokens=24, eos_token_id=stop, pad_token_id=EOS_ID
    )
    assert any(stop in row[ids.shape[1] : ids.shape[1] + 11] for row in early.tolist())


def test_output_scores_hold_the_processed_logits(model):
    """`output_scores` are what AR's processors make of each position's logits, so transition scores agree."""
    ids, mask = prompts(2, lengths=(7, 11))
    kwargs = dict(max_new_tokens=12, eos_token_id=None, do_sample=False, repetition_penalty=1.6)
    ar = model.generate(ids, attention_mask=mask, return_dict_in_generate=True, output_scores=True, **kwargs)
    out = model.generate(
        ids,
        attention_mask=mask,
        strategy="wedlm",
        wedlm_lossless=True,
        return_dict_in_generate=True,
        output_scores=True,
        **kwargs,
    )
    assert torch.equal(out.sequences, ar.sequences)
    for mine, theirs in zip(out.scores, ar.scores):
        torch.testing.assert_close(mine, theirs.float())
