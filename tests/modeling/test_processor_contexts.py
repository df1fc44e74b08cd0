"""`processor_contexts.Contexts`: each position's context as a tensor, and every position as one padded block."""

import torch

from wedlm_hf.modeling.processor_contexts import Contexts


def test_positions_are_prefixes_of_their_rows_and_pad_as_one_block():
    first, second = torch.tensor([4, 5, 6, 7]), torch.tensor([9, 8])
    contexts = Contexts.joined([Contexts([first], [0, 0], [2, 4]), Contexts([second], [0], [1])])
    assert len(contexts) == 3 and contexts.owners == [0, 0, 1]
    assert [c.tolist() for c in contexts] == [[4, 5], [4, 5, 6, 7], [9]]
    assert contexts[2].tolist() == [9]
    assert contexts.padded(99).tolist() == [[4, 5, 99, 99], [4, 5, 6, 7], [9, 99, 99, 99]]


def test_a_list_of_tensors_is_one_row_each():
    tensors = [torch.tensor([1, 2, 3]), torch.tensor([5])]
    contexts = Contexts.of(tensors)
    assert Contexts.of(contexts) is contexts
    assert contexts.padded(0).tolist() == [[1, 2, 3], [5, 0, 0]]
    assert [c.tolist() for c in contexts] == [[1, 2, 3], [5]]


def test_the_block_is_as_long_as_the_longest_position_not_the_longest_row():
    contexts = Contexts([torch.arange(10)], [0, 0], [3, 5])
    assert contexts.padded(-1).tolist() == [[0, 1, 2, -1, -1], [0, 1, 2, 3, 4]]


def test_counts_hold_each_positions_tokens_past_those_left_out():
    """Each row's text counted once and each position's tokens past its row's shortest context added: what
    counting each position's own context gives, ids past the vocabulary and the first `left_out` ids not counted.
    The rows as one (rows, length) tensor, other ids past their texts, count and pad as the list of them does."""
    g = torch.Generator().manual_seed(4)
    for trial in range(40):
        vocab = int(torch.randint(3, 12, (), generator=g))
        rows = [torch.randint(0, vocab + 2, (int(torch.randint(1, 9, (), generator=g)),), generator=g) for _ in "abc"]
        parts = []
        for ids in rows:
            lengths = sorted(torch.randint(1, len(ids) + 1, (int(torch.randint(0, 4, (), generator=g)),), generator=g))
            parts.append(Contexts([ids], [0] * len(lengths), [int(n) for n in lengths]))
        contexts = Contexts.joined(parts)
        skip = [int(k) for k in torch.randint(0, 4, (3,), generator=g)]
        left_out = [skip[owner] for owner in contexts.owners] if trial % 2 else None
        counted = contexts.counts(vocab, torch.float32, left_out)
        assert counted.shape == (len(contexts), vocab)
        for n, context in enumerate(contexts):
            ids = context[left_out[n] if left_out else 0 :]
            assert counted[n].tolist() == torch.bincount(ids[ids < vocab], minlength=vocab).float().tolist()
        block = torch.randint(0, vocab + 2, (3, 12), generator=g)
        for r, ids in enumerate(rows):
            block[r, : len(ids)] = ids
        as_block = Contexts(block, contexts.owners, contexts.lengths)
        assert torch.equal(as_block.counts(vocab, torch.float32, left_out), counted)
        assert torch.equal(as_block.padded(vocab, left_out=left_out), contexts.padded(vocab, left_out=left_out))
        assert [c.tolist() for c in as_block] == [c.tolist() for c in contexts]
        if len(as_block):
            assert [c.tolist() for c in Contexts.joined([as_block, contexts])] == [c.tolist() for c in contexts] * 2


def test_no_positions_give_empty_blocks():
    contexts = Contexts.joined([])
    assert contexts.counts(5, torch.float32).shape == (0, 5) and contexts.padded(5).shape == (0, 0)


def test_positions_pad_a_group_of_similar_lengths_at_a_time():
    """A long context pads only the positions of about its length: groups within a factor of two; a group's block
    holds its positions alone, with the ids each leaves out padded too."""
    long, short = torch.arange(100), torch.tensor([7, 8, 9])
    contexts = Contexts.joined([Contexts([long], [0, 0], [90, 100]), Contexts([short], [0, 0], [2, 3])])
    groups = contexts.similar_lengths()
    assert sorted(groups) == [[0, 1], [2, 3]]
    assert contexts.padded(-1, [2, 3]).tolist() == [[7, 8, -1], [7, 8, 9]]
    assert contexts.padded(-1, [3], left_out=[0, 0, 0, 2]).tolist() == [[-1, -1, 9]]
    assert contexts.padded(-1, [0, 1]).shape == (2, 100)
