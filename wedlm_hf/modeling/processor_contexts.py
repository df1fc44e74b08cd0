"""The token ids a context-reading logits processor sees at each position of a step: prefixes of a few rows' texts.

AR `generate` hands its processors, at every position, the ids before it. At the masks and drafts of a window those
are the row's committed text followed by the window's tokens before the slot: one tensor per row, and each position
a prefix of it. Slicing a tensor per position costs an operator a position; a processor that ignores padding (a
repetition penalty, `window_filling.ignores_padding`) takes every position at once as one right-padded block, built
here from the rows' tensors in a fixed number of operators, whatever the positions and rows.
"""

import torch


class Contexts:
    """Per position, the prefix of `lengths[n]` ids of row tensor `ids[owners[n]]`. Indexing gives a position's
    context as a tensor, as a list of contexts would."""

    def __init__(self, ids: list[torch.Tensor], owners: list[int], lengths: list[int]):
        self.ids, self.owners, self.lengths = ids, owners, lengths

    @classmethod
    def of(cls, contexts) -> "Contexts":
        """`contexts` as `Contexts`: itself, or one tensor per position (each its own row)."""
        if isinstance(contexts, Contexts):
            return contexts
        return cls(list(contexts), list(range(len(contexts))), [len(c) for c in contexts])

    @classmethod
    def joined(cls, parts: list["Contexts"]) -> "Contexts":
        """The positions of `parts`, one after the other."""
        ids, owners, lengths = [], [], []
        for part in parts:
            owners += [len(ids) + owner for owner in part.owners]
            ids += part.ids
            lengths += part.lengths
        return cls(ids, owners, lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, n: int) -> torch.Tensor:
        return self.ids[self.owners[n]][: self.lengths[n]]

    def __iter__(self):
        return (self[n] for n in range(len(self)))

    def padded(self, padding: int) -> torch.Tensor:
        """(positions, longest) ids: each position's context, then `padding`. The rows' tensors padded once, a row
        per position taken from them, and what lies past each position's length overwritten."""
        device = self.ids[0].device
        longest = max(self.lengths)
        rows = torch.nn.utils.rnn.pad_sequence(self.ids, batch_first=True, padding_value=padding)[:, :longest]
        owners, lengths = torch.tensor([self.owners, self.lengths]).to(device, non_blocking=True)
        past = torch.arange(longest, device=device) >= lengths[:, None]
        return rows[owners].masked_fill_(past, padding)
