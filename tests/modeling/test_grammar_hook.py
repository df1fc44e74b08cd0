"""The grammar hook (`grammar_hook`) under default mode's guesses: a guess commits only where AR's own restricted
choice agrees, and the walk keeps the draw that takes a failed guess's place."""

import torch
from conftest import EOS_ID

from wedlm_hf.modeling.decoding_state import DecodingRow, DecodingSettings, Fill
from wedlm_hf.modeling.grammar_hook import commit_valid, constrain_window
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

    def forced(self):
        return []

    def allowed(self):
        mask = torch.zeros(VOCAB, dtype=torch.bool)
        mask[list(self.tokens)] = True
        return mask


def row_with(window, ar_choice: int) -> DecodingRow:
    settings = DecodingSettings(max_new_tokens=50, stop_ids=frozenset({EOS_ID}), sampler=FillSampler())
    grammar = AnyOf([10, 11, 12])
    row = DecodingRow(index=0, prompt=[5, 6, 7], settings=settings, window=list(window), prompt_fed=3, grammar=grammar)
    step = torch.zeros(len(window), VOCAB)
    step[0, ar_choice] = 2.0  # the row of slot 0 predicts slot 1
    step[0, 13] = 5.0  # outside the grammar: AR restricted never picks it
    row.next_logits, row.step_logits = torch.zeros(VOCAB), step
    return row


def test_a_guess_commits_where_ar_agrees_and_ends_the_commit_where_it_does_not():
    window = [Fill(10, source="constrained"), Fill(11, source="constrained", guess=True), Fill(12), None]
    row = row_with(window, ar_choice=11)
    assert commit_valid(row, 3) == (3, False)
    assert row.generated == [10, 11, 12]
    row = row_with(window, ar_choice=12)
    assert commit_valid(row, 3) == (1, True)
    assert row.generated == [10] and row.window == [None, None, None]  # AR's own choice fills slot 0 next


def test_a_sampled_guess_leaves_its_slot_distributed_as_ar_samples_it():
    """A sampled row keeps guess g with AR's restricted probability p(g), else draws from p without g, and that draw
    takes the slot: over many tries the slot holds each token with its probability under p. (Drawing afresh from p
    after a failed guess would give g about p(g) * (2 - p(g)) of the time.)"""
    generator = torch.Generator().manual_seed(0)
    logits = torch.full((VOCAB,), -1.0)
    logits[[10, 11, 12]] = torch.tensor([0.5, 0.3, 0.2]).log()
    logits[13] = 9.0  # outside the grammar
    tries, counts, failures = 4000, torch.zeros(VOCAB), 0
    for _ in range(tries):
        row = row_with([Fill(10, source="constrained"), Fill(11, source="constrained", guess=True), Fill(12)], 0)
        row.settings.sampler = FillSampler(do_sample=True, generator=generator)
        row.step_logits[0] = logits
        count, failed = commit_valid(row, 3)
        if failed:
            assert count == 1 and row.window[0].final and row.window[0].token in (10, 12)
            assert row.window[1:] == [None]  # the fill after the guess saw it
            counts[row.window[0].token] += 1
            failures += 1
        else:
            assert count == 3 and row.generated == [10, 11, 12]
            counts[11] += 1
    frequencies = counts / tries
    assert torch.allclose(frequencies[[10, 11, 12]], torch.tensor([0.5, 0.3, 0.2]), atol=0.03)
    assert abs(failures / tries - 0.7) < 0.03


def test_the_draw_in_a_failed_guess_place_is_kept_by_the_next_walk():
    """The walk over the window replaces a slot-0 fill from the masks with AR's own restricted choice, but not AR's
    own draw that took a failed sampled guess's place (a second draw there would favour the guess's rivals twice)."""
    for final, expected in ((True, 11), (False, 10)):
        row = row_with([Fill(11, final=final, source="constrained"), None], ar_choice=10)
        row.next_logits[10] = 3.0  # AR's restricted choice after the committed text
        constrain_window(row, {})
        assert row.window[0].token == expected
