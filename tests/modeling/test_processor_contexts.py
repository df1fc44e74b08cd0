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
