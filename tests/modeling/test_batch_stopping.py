"""transformers' stopping-criteria contract under strategy="wedlm": the whole batch, one position at a time.

A criterion gets `(batch, prompt + n)` ids for n = 1, 2, ... (finished rows padded with pad_token_id) and returns
one bool per row, or one Python bool for all rows; it may keep per-row state, as lm-eval's does.
"""

import pytest
import torch
from conftest import EOS_ID, prompts
from transformers import StoppingCriteria, StoppingCriteriaList

SETTINGS = dict(strategy="wedlm", max_new_tokens=24, eos_token_id=None, pad_token_id=EOS_ID, wedlm_window_size=6)


def free_runs(model, ids, mask) -> list[list[int]]:
    """Each row decoded with no criterion (rows are independent, so this is what they commit in any batch)."""
    out = model.generate(ids, attention_mask=mask, **SETTINGS)
    return out[:, ids.shape[1] :].tolist()


class TrackingCriterion(StoppingCriteria):
    """Shaped like lm-eval's MultiTokenEOSCriteria: a per-row `done` tracker over each row's recent tail, and one
    Python bool for the whole batch. Also records what it was shown."""

    def __init__(self, token: int, prompt_width: int, batch: int, lookback: int = 3):
        self.token, self.prompt_width, self.lookback = token, prompt_width, lookback
        self.done = [False] * batch
        self.seen = []

    def __call__(self, input_ids, scores, **kwargs) -> bool:
        self.seen.append(input_ids.clone())
        tails = input_ids[:, self.prompt_width :][:, -self.lookback :]
        for i in range(len(self.done)):
            self.done[i] = self.done[i] or self.token in tails[i].tolist()
        return all(self.done)


def test_stateful_batch_criterion_sees_every_position_once_and_stops_the_batch(model64):
    ids, mask = prompts(4)
    free = free_runs(model64, ids, mask)
    token = free[2][7]  # a token every row reaches at a different point (or not before the budget)
    criterion = TrackingCriterion(token, ids.shape[1], batch=4)
    out = model64.generate(ids, attention_mask=mask, stopping_criteria=StoppingCriteriaList([criterion]), **SETTINGS)

    def first_hit(row):  # the first n at which the tracker latches for this row
        return next((n for n in range(1, len(row) + 1) if token in row[:n][-3:]), None)

    hits = [first_hit(row) for row in free]
    end = max(hits) if None not in hits else 24
    assert out.shape[1] == ids.shape[1] + end
    for b in range(4):
        assert out[b, ids.shape[1] :].tolist() == free[b][:end]
    # One call per position, n = 1, 2, ..., each showing every row's first n tokens: AR generate's view.
    assert [s.shape[1] - ids.shape[1] for s in criterion.seen] == list(range(1, end + 1))
    for n, shown in enumerate(criterion.seen, 1):
        for b in range(4):
            assert shown[b, : ids.shape[1]].tolist() == ids[b].tolist()
            assert shown[b, ids.shape[1] :].tolist() == free[b][:n]


class LastTokenIs(StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_per_row_criterion_stops_each_row_and_pads_it(model64):
    ids, mask = prompts(3)
    free = free_runs(model64, ids, mask)
    token = free[0][5]
    out = model64.generate(
        ids, attention_mask=mask, stopping_criteria=StoppingCriteriaList([LastTokenIs(token)]), **SETTINGS
    )
    for b in range(3):
        row = free[b]
        n = row.index(token) + 1 if token in row else len(row)
        assert out[b, ids.shape[1] : ids.shape[1] + n].tolist() == row[:n]
        assert (out[b, ids.shape[1] + n :] == EOS_ID).all()


def test_python_bool_answer_at_batch_size_one(model64):
    ids, _ = prompts(1)
    free = free_runs(model64, ids, torch.ones_like(ids))

    class StopAtFive(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids.shape[1] - ids.shape[1] >= 5  # a Python bool, as lm-eval returns

    out = model64.generate(ids, stopping_criteria=StoppingCriteriaList([StopAtFive()]), **SETTINGS)
    assert out[0, ids.shape[1] :].tolist() == free[0][:5]


def test_a_criterion_answering_the_wrong_shape_is_named(model64):
    ids, mask = prompts(2)

    class Wrong(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.zeros(5, dtype=torch.bool)

    with pytest.raises(ValueError, match="returned 5 values for a batch of 2: return one bool per row"):
        model64.generate(ids, attention_mask=mask, stopping_criteria=StoppingCriteriaList([Wrong()]), **SETTINGS)
