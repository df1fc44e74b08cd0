"""The token ids a context-reading logits processor sees at each position of a step: prefixes of a few rows' texts.

AR `generate` hands its processors, at every position, the ids before it. At the masks and drafts of a window those
are the row's committed text followed by the window's tokens before the slot: one tensor per row, and each position
a prefix of it. Slicing a tensor per position costs an operator a position; a processor that ignores padding
(`window_filling.ignores_padding`) takes every position at once as one right-padded block (`padded`). Penalties
batched over rows (`sampler_batch`) read the positions' contexts padded a group of similar lengths at a time (a
repetition penalty: `similar_lengths`) or how often each token occurs in each (OpenAI's penalties: `counts`, each
row's text counted once and each position's few tokens past the row's shortest context added), so that no block
grows with positions times the longest context. Each takes a fixed number of operators, whatever the positions and
rows (`similar_lengths`: a few groups).
"""

import torch


class Contexts:
    """Per position, the prefix of `lengths[n]` ids of row `ids[owners[n]]`: `ids` a list of 1-D tensors, or one
    (rows, length) tensor (a batch's, `context_ids`), whose ids past a position's length are never read. Indexing
    gives a position's context as a tensor, as a list of contexts would (a copy, where the rows are a batch's
    tensor, which later steps write)."""

    def __init__(self, ids: list[torch.Tensor] | torch.Tensor, owners: list[int], lengths: list[int]):
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
            ids += list(part.ids.clone() if isinstance(part.ids, torch.Tensor) else part.ids)  # a tensor's rows
            lengths += part.lengths
        return cls(ids, owners, lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, n: int) -> torch.Tensor:
        context = self.ids[self.owners[n]][: self.lengths[n]]
        return context.clone() if isinstance(self.ids, torch.Tensor) else context

    def __iter__(self):
        return (self[n] for n in range(len(self)))

    def counts(self, vocab: int, dtype: torch.dtype, left_out: list[int] | None = None) -> torch.Tensor:
        """(positions, vocab): how often each token occurs in each position's context, past its first
        `left_out[n]` ids (none where None; a row's positions share it); ids past the vocabulary are not counted."""
        if not self.lengths:
            return torch.zeros((0, vocab), dtype=dtype)
        device, lengths = self._device(), self.lengths
        rows, owners, count = self._rows_read(vocab)
        shortest, skipped = [-1] * count, [0] * count  # per row; -1: no position reads it
        for n, owner in enumerate(owners):
            shortest[owner] = lengths[n] if shortest[owner] < 0 else min(shortest[owner], lengths[n])
            skipped[owner] = 0 if left_out is None else left_out[n]
        extra = max(length - shortest[owner] for owner, length in zip(owners, lengths))
        where = [[shortest[owner], length, skipped[owner], owner] for owner, length in zip(owners, lengths)]
        rows_at, where = torch.tensor([shortest, skipped]), torch.tensor(where).reshape(-1, 4)
        rows_at, where = rows_at.to(device, non_blocking=True), where.to(device, non_blocking=True)
        rows = rows.clamp(max=vocab)
        column = torch.arange(rows.shape[1], device=device)
        counted = (column < rows_at[0][:, None]) & (column >= rows_at[1][:, None])  # each row's text, once
        per_row = torch.zeros(count, vocab + 1, dtype=dtype, device=device)
        per_row.scatter_add_(1, rows.masked_fill(~counted, vocab), torch.ones_like(rows, dtype=dtype))
        out = per_row[where[:, 3]]
        if extra:  # each position's ids past its row's shortest context: the window's tokens before its slot
            index = where[:, :1] + torch.arange(extra, device=device)
            outside = (index >= where[:, 1:2]) | (index < where[:, 2:3])
            ids = rows[where[:, 3:], index.clamp(max=rows.shape[1] - 1)].masked_fill(outside, vocab)
            out.scatter_add_(1, ids, torch.ones_like(ids, dtype=dtype))
        return out[:, :vocab]

    def padded(self, padding: int, positions: list[int] | None = None, left_out: list[int] | None = None):
        """(positions, longest) ids: each position's context, then `padding` (also in place of its first
        `left_out[n]` ids, where given); `positions`: some of them only. The rows' tensors padded once, a row per
        position taken from them, and what lies past each position's length overwritten."""
        positions = range(len(self.lengths)) if positions is None else positions
        if not positions:
            return torch.empty((0, 0), dtype=torch.long)
        device = self._device()
        lengths = [self.lengths[n] for n in positions]
        skipped = [0] * len(positions) if left_out is None else [left_out[n] for n in positions]
        longest = max(lengths)
        rows = self._rows(padding)[:, :longest]
        where = torch.tensor([[self.owners[n] for n in positions], lengths, skipped]).to(device, non_blocking=True)
        column = torch.arange(longest, device=device)
        outside = (column >= where[1][:, None]) | (column < where[2][:, None])
        return rows[where[0]].masked_fill_(outside, padding)

    def _device(self) -> torch.device:
        return self.ids.device if isinstance(self.ids, torch.Tensor) else self.ids[0].device

    def _rows_read(self, padding: int) -> tuple[torch.Tensor, list[int], int]:
        """The rows the positions read as one (rows, length) tensor (`_rows`; of a batch's tensor only the rows read,
        as long as the longest context: not every slot at its longest), each position's row in it, and how many."""
        if not isinstance(self.ids, torch.Tensor):
            return self._rows(padding), self.owners, len(self.ids)
        read = sorted(set(self.owners))
        row_of = {owner: i for i, owner in enumerate(read)}
        at = torch.tensor(read).to(self.ids.device, non_blocking=True)
        return self.ids[at, : max(self.lengths)], [row_of[owner] for owner in self.owners], len(read)

    def _rows(self, padding: int) -> torch.Tensor:
        """The rows as one (rows, length) tensor, right-padded with `padding` where they are a list (a batch's
        tensor holds other ids past its rows' texts: what reads it masks them by the positions' lengths)."""
        if isinstance(self.ids, torch.Tensor):
            return self.ids
        return torch.nn.utils.rnn.pad_sequence(self.ids, batch_first=True, padding_value=padding)

    def similar_lengths(self) -> list[list[int]]:
        """The positions grouped by context length, each group's lengths within a factor of two: padded a group at
        a time, a long context does not make every short one as long."""
        lengths = self.lengths
        if not lengths or max(lengths) < 2 * min(lengths):  # one group (a batch in step: the common case)
            return [list(range(len(lengths)))]
        groups: dict[int, list[int]] = {}
        for n, length in enumerate(lengths):
            groups.setdefault(length.bit_length(), []).append(n)
        return list(groups.values())
