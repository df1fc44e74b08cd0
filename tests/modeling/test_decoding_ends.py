"""A run that ends the text (a stop token, or the budget) commits in the step that fills it: the forward that would
commit it has nothing else to do, so none is run. Outputs are those of decoding with that forward."""

import pytest
import torch
from conftest import EOS_ID, prompts

from wedlm_hf.modeling import streaming_decoder


def decode(model, ids, mask, **settings):
    out = model.generate(
        ids,
        attention_mask=mask,
        strategy="wedlm",
        pad_token_id=EOS_ID,
        return_dict_in_generate=True,
        **settings,
    )
    return out.sequences, [s.forwards for s in out.wedlm_stats]


def without_ending_commit(monkeypatch):
    monkeypatch.setattr(streaming_decoder, "_commit_ending", lambda row: 0)


@pytest.mark.parametrize(
    "settings",
    [
        dict(wedlm_window_size=6, wedlm_entropy_threshold=0.8, eos_token_id=EOS_ID, max_new_tokens=30),
        dict(wedlm_window_size=16, wedlm_entropy_threshold=1e9, eos_token_id=None, max_new_tokens=24),
        dict(wedlm_window_size=4, eos_token_id=EOS_ID, max_new_tokens=20, do_sample=True, temperature=0.9),
    ],
    ids=["stop-token", "budget", "sampled"],
)
def test_each_row_saves_its_last_forward(model64, monkeypatch, settings):
    ids, mask = prompts(4)
    torch.manual_seed(0)
    sequences, forwards = decode(model64, ids, mask, **settings)
    without_ending_commit(monkeypatch)
    torch.manual_seed(0)
    sequences_then, forwards_then = decode(model64, ids, mask, **settings)
    assert torch.equal(sequences, sequences_then)
    assert forwards == [n - 1 for n in forwards_then]


def test_rows_that_keep_logits_still_run_that_forward(model64, monkeypatch):
    """output_scores needs the AR logits of every token, which come from the forward that feeds the one before."""
    ids, mask = prompts(2)
    settings = dict(wedlm_window_size=6, eos_token_id=EOS_ID, max_new_tokens=16, output_scores=True)
    out = model64.generate(
        ids, attention_mask=mask, strategy="wedlm", pad_token_id=EOS_ID, return_dict_in_generate=True, **settings
    )
    assert len(out.scores) == out.sequences.shape[1] - ids.shape[1]
    forwards = [s.forwards for s in out.wedlm_stats]
    without_ending_commit(monkeypatch)
    assert decode(model64, ids, mask, **settings)[1] == forwards
