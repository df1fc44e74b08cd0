"""`context_ids.ContextIds`: the batch's ids that context-reading processors read, a row a slot of one tensor."""

import random

from wedlm_hf.evaluation.step_calls import TorchOps
from wedlm_hf.modeling.context_ids import ContextIds, row_contexts
from wedlm_hf.modeling.decoding_state import DecodingRow, DecodingSettings, Fill


def _row(index: int, rng: random.Random, block: ContextIds | None) -> DecodingRow:
    prompt = [rng.randrange(1, 50) for _ in range(rng.randrange(1, 9))]
    padding = [0] * rng.randrange(0, 3)
    settings = DecodingSettings(max_new_tokens=1000)
    return DecodingRow(index=index, prompt=prompt, settings=settings, padding=padding, context_ids=block)


def _expected(row: DecodingRow, slots: list[int]) -> list[list[int]]:
    text = row.padding + row.prompt + row.generated
    return [text + [fill.token for fill in row.window[:k]] for k in slots]


def test_contexts_follow_commits_windows_cuts_and_rows_that_come_and_go():
    """Rows of one batch join, commit, change their windows, are cut short (`finish(keep=...)`, after which their
    text grows no more) and leave, their slots taken again: at every read each position's context is the row's text
    and its window before the slot, and the tensor is at most twice as large as the rows and contexts ask in each
    dimension; once the last row leaves, it goes."""
    rng = random.Random(0)
    block = ContextIds()
    rows, cut = [_row(i, rng, block) for i in range(3)], set()  # a cut row has ended: its text grows no more
    most, longest = len(rows), 0
    for step in range(200):
        if rng.random() < 0.1 and rows:  # a row leaves, another joins
            block.release(rows.pop(rng.randrange(len(rows))))
        if rng.random() < 0.15:
            rows.append(_row(100 + step, rng, block))
            most = max(most, len(rows))
        for row in rows:
            if row.index not in cut:
                row.generated += [rng.randrange(1, 50) for _ in range(rng.choice([0, 1, 1, 3, 17]))]
            if rng.random() < 0.05:
                del row.generated[rng.randrange(len(row.generated) + 1) :]
                cut.add(row.index)
            row.window = [Fill(rng.randrange(1, 50)) for _ in range(rng.randrange(0, 6))]
        reading = rng.sample(rows, rng.randrange(len(rows) + 1))
        wanted = [(row, sorted(rng.sample(range(len(row.window) + 1), min(2, len(row.window) + 1)))) for row in reading]
        contexts = row_contexts(wanted, "cpu")
        expected = [ids for row, slots in wanted for ids in _expected(row, slots)]
        assert [c.tolist() for c in contexts] == expected
        longest = max([longest] + [len(ids) for ids in expected])
        if block.ids is not None:
            assert block.ids.shape[0] <= 2 * most and block.ids.shape[1] <= 2 * longest
    assert len(block.written) <= most  # slots are taken again
    for row in rows:
        block.release(row)
    assert block.ids is None and block.written == []


def test_a_position_s_context_stays_what_it_was_when_later_reads_write_the_tensor():
    """A processor that keeps the ids it was handed sees them unchanged by the next step's writes."""
    rng = random.Random(3)
    row = _row(0, rng, ContextIds())
    row.window = [Fill(7), Fill(8)]
    kept = row.contexts([2], "cpu")[0]
    before = kept.tolist()
    row.window = [Fill(9), Fill(10)]
    row.contexts([2], "cpu")
    assert kept.tolist() == before and before[-2:] == [7, 8]


def test_rows_of_different_batches_read_in_order():
    rng = random.Random(1)
    first, second = _row(0, rng, None), _row(1, rng, ContextIds())
    first.window, second.window = [Fill(7)], [Fill(8), Fill(9)]
    contexts = row_contexts([(first, [1]), (second, [0, 2]), (first, [0])], "cpu")
    assert [c.tolist() for c in contexts] == _expected(first, [1]) + _expected(second, [0, 2]) + _expected(first, [0])
    assert first.context_ids is not None and first.context_ids is not second.context_ids


def test_a_read_costs_the_same_operators_for_one_row_as_for_sixteen():
    """The writes of every row read are one operator: what a read costs does not grow with the rows."""
    rng = random.Random(2)
    costs = []
    for batch in (1, 16):
        block = ContextIds()
        rows = [_row(i, rng, block) for i in range(batch)]
        wanted = [(row, [0]) for row in rows]
        row_contexts(wanted, "cpu")  # the first read takes the slots and sizes the tensor
        for row in rows:
            row.generated.append(5)
            row.window = [Fill(6), Fill(7)]
        ops = TorchOps()
        with ops:
            contexts = row_contexts([(row, [2]) for row in rows], "cpu")
        assert [c.tolist() for c in contexts] == [_expected(row, [2])[0] for row in rows]
        costs.append(ops.count)
    assert costs[0] == costs[1]
