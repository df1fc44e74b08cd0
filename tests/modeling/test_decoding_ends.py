"""A run that ends the text (a stop token, or the budget) commits in the step that fills it: the forward that would
commit it has nothing else to do, so none is run. Outputs are those of decoding with that forward."""

import pytest
import torch
from conftest import EOS_ID, count_unfed_ends, prompts

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
    monkeypatch.setattr(streaming_decoder, "commit_ending", lambda row: 0)


ENDINGS = {
    "stop-token": dict(wedlm_window_size=6, wedlm_entropy_threshold=0.8, eos_token_id=EOS_ID, max_new_tokens=30),
    "budget": dict(wedlm_window_size=16, wedlm_entropy_threshold=1e9, eos_token_id=None, max_new_tokens=24),
    "sampled": dict(wedlm_window_size=4, eos_token_id=EOS_ID, max_new_tokens=20, do_sample=True, temperature=0.9),
}
# With context drafts a forward draws AR's own token at every verified position, so the forward an ending commit
# saves would move a shared generator's later draws: sampled rows are compared on the paper's rule only.
CASES = [(name, context) for name in ENDINGS for context in (False, True) if not (context and name == "sampled")]


@pytest.mark.parametrize("name, context", CASES, ids=[f"{n}-{'context' if c else 'paper'}" for n, c in CASES])
@pytest.mark.parametrize("before_read", [False, True], ids=["draws-after-read", "draws-before-read"])
def test_each_row_saves_its_last_forward(model64, monkeypatch, name, context, before_read):
    """With the draws before the step's read too: a row that ends in a step draws no fills there. With context
    drafts, a row may also end on AR's own last token, which never needs a forward (section 6.b): there the ending
    commit saves nothing, elsewhere one forward."""
    monkeypatch.setattr(streaming_decoder, "draws_before_read", lambda device: before_read)
    settings = ENDINGS[name] | {"wedlm_context_drafts": context}
    ids, mask = prompts(4)
    torch.manual_seed(0)
    sequences, forwards = decode(model64, ids, mask, **settings)
    without_ending_commit(monkeypatch)
    torch.manual_seed(0)
    sequences_then, forwards_then = decode(model64, ids, mask, **settings)
    assert torch.equal(sequences, sequences_then)
    if not context:
        assert forwards == [n - 1 for n in forwards_then]
    else:
        assert all(n - 1 <= f <= n for f, n in zip(forwards, forwards_then))
        if name == "budget":  # every mask filled: the fills reach the budget, and the ending commit saves a forward
            assert forwards != forwards_then


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


@pytest.mark.parametrize("batched", [False, True])
def test_a_lossless_rows_last_draft_is_checked_without_being_fed(shipped_model, monkeypatch, batched):
    """Where a run that commits whole ends the text, its last draft is verified by the row before it and never fed:
    the same tokens in the same forwards, one row fewer for each row that ended so."""
    from wedlm_hf.data import EVAL_TASK_SEED, task_items
    from wedlm_hf.modeling.decoding_state import DecodingRow

    model, tokenizer = shipped_model
    tokenizer.padding_side = "left"
    questions = [q for family in ("arithmetic", "lists") for q, _ in task_items(family, 4, EVAL_TASK_SEED)]
    settings = dict(max_new_tokens=24, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)

    def run():
        outs = []
        for group in [questions] if batched else [[q] for q in questions]:
            batch = tokenizer(group, return_tensors="pt", padding=True)
            out = model.generate(
                **batch, strategy="wedlm", wedlm_lossless=True, return_dict_in_generate=True, **settings
            )
            outs += [(seq.tolist(), s.forwards, s.rows_fed) for seq, s in zip(out.sequences, out.wedlm_stats)]
        return outs

    unfed = count_unfed_ends(monkeypatch)
    now = run()
    monkeypatch.setattr(DecodingRow, "unfed_end", lambda row: 0)
    before = run()
    assert [(seq, forwards) for seq, forwards, _ in now] == [(seq, forwards) for seq, forwards, _ in before]
    saved = [old - new for (_, _, new), (_, _, old) in zip(now, before)]
    assert min(saved) >= 0 and sum(saved) == sum(unfed) > len(questions) // 2
