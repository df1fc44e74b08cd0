"""Default mode's guesses under a grammar: one commits only where AR's own restricted choice agrees."""

import torch
from conftest import EOS_ID

from wedlm_hf.modeling.streaming_decoder import DecodingRow, DecodingSettings, Fill, _commit_valid
from wedlm_hf.modeling.window_filling import FillSampler

VOCAB = 16


class AnyOf:
    """A grammar state stand-in that accepts any sequence of `tokens` (never complete)."""

    def __init__(self, tokens):
        self.tokens = set(tokens)
        self.at = 0

    def accepted(self, tokens):
        return next((i for i, t in enumerate(tokens) if t not in self.tokens), len(tokens))

    def advance(self, tokens):
        self.at += len(tokens)

    def rollback(self, count):
        self.at -= count

    def accepting(self):
        return False

    def allowed(self):
        mask = torch.zeros(VOCAB, dtype=torch.bool)
        mask[list(self.tokens)] = True
        return mask


def row_with(window, ar_choice: int) -> DecodingRow:
    settings = DecodingSettings(max_new_tokens=50, stop_ids=frozenset({EOS_ID}), sampler=FillSampler())
    row = DecodingRow(index=0, prompt=[5, 6, 7], settings=settings, window=list(window), prompt_fed=3)
    row.grammar = AnyOf([10, 11, 12])
    step = torch.zeros(len(window), VOCAB)
    step[0, ar_choice] = 2.0  # the row of slot 0 predicts slot 1
    step[0, 13] = 5.0  # outside the grammar: AR restricted never picks it
    row.next_logits, row.step_logits = torch.zeros(VOCAB), step
    return row


def test_a_guess_commits_where_ar_agrees_and_ends_the_commit_where_it_does_not():
    window = [Fill(10, source="constrained"), Fill(11, source="constrained", guess=True), Fill(12), None]
    row = row_with(window, ar_choice=11)
    assert _commit_valid(row, 3) == (3, False)
    assert row.generated == [10, 11, 12]
    row = row_with(window, ar_choice=12)
    assert _commit_valid(row, 3) == (1, True)
    assert row.generated == [10] and row.window == [None, None, None]  # AR's own choice fills slot 0 next
