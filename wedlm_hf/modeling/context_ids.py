"""The token ids that context-reading logits processors read, for every row of a batch in one tensor.

AR `generate` hands a processor (a repetition penalty) the ids before each position; at a window slot those are the
row's left padding, prompt and committed text, then the window's tokens before the slot (`processor_contexts`).
Kept as a tensor per row, they cost operators a row every step: the tokens just committed joined to the row's
tensor, the window's tokens joined after them. Here the batch keeps them as one (slots, length) tensor on the device,
a row a slot, as vLLM's persistent input batch keeps its token ids: each read writes, for every row it reads, the
tokens committed since that row's last read and its window's tokens after them, all with one operator, whatever the
number of rows. Past a row's committed text the tensor is scratch, written again at each read. A row takes a slot at
its first read and gives it back when it leaves the decoder (`release`). The tensor is at most twice as large as the
rows reading at once and their longest context ask, in each dimension, and goes when the last of them leaves.
"""

from array import array

import torch

from .processor_contexts import Contexts


class ContextIds:
    """The (slots, length) ids of the rows that read their contexts, a row a slot (see the module docstring)."""

    def __init__(self):
        self.ids: torch.Tensor | None = None
        self.slots: dict = {}  # row -> its slot
        self.written: list[int] = []  # per slot: the leading ids in the tensor that are its row's committed text
        self.base: list[int] = []  # per slot: its row's padding and prompt, the ids before its generated text
        self.free: list[int] = []

    def release(self, row) -> None:
        """`row` left the batch: its slot is free for the next row that reads; with no row left, the tensor goes."""
        slot = self.slots.pop(row, None)
        if slot is not None:
            self.written[slot] = 0
            self.free.append(slot)
        if not self.slots:
            self.ids, self.written, self.base, self.free = None, [], [], []

    def contexts(self, wanted: list[tuple], device) -> Contexts:
        """Per (row, window slots) in `wanted`, each slot's context (row order, then slot order): the prefixes of
        this tensor's rows, brought up to date first. Every window slot before a row's last must be filled. A few
        calls a row: every step of a batch under a repetition penalty reads with it."""
        if self.ids is not None and not _on(self.ids, device):  # moved: written anew
            self.ids, self.written = None, [0] * len(self.written)
        slots, columns, values, owners, lengths = [], [], [], [], []  # the writes; then each position's prefix
        widest = 0
        for row, wanted_slots in wanted:
            slot = self.slots.get(row)
            if slot is None:
                slot = self._slot(row)
            base, generated = self.base[slot], row.generated
            committed, written, last = base + len(generated), self.written[slot], max(wanted_slots, default=0)
            if written > committed:  # its text was cut short since (a decoder's rows leave then: a row of its own)
                written = committed
            new = generated[written - base :] if written >= base else (row.padding + row.prompt)[written:] + generated
            if last:
                new += [fill.token for fill in row.window[:last]]
            count = len(new)
            slots += [slot] * count
            columns += range(written, written + count)
            values += new
            self.written[slot] = committed
            if committed + last > widest:
                widest = committed + last
            owners += [slot] * len(wanted_slots)
            lengths += [committed + k for k in wanted_slots]
        self._fit(len(self.written), widest, device)
        if values:
            # `frombuffer` keeps the array alive as long as the tensor; on a CPU, `to` is the tensor itself
            where = torch.frombuffer(array("q", slots + columns + values), dtype=torch.int64).view(3, -1).to(device)
            self.ids[where[0], where[1]] = where[2]
        return Contexts(self.ids, owners, lengths)

    def _slot(self, row) -> int:
        """A free slot for `row`, which reads for the first time."""
        slot = self.free.pop() if self.free else len(self.written)
        if slot == len(self.written):
            self.written.append(0)
            self.base.append(0)
        self.slots[row] = slot
        self.written[slot], self.base[slot] = 0, len(row.padding) + len(row.prompt)
        return slot

    def _fit(self, rows: int, columns: int, device) -> None:
        """Grows the tensor to hold `rows` x `columns` ids on `device`, keeping what it holds: a dimension that is
        short to twice its size (or what is asked, if more), so that growing is rare; the other as it is."""
        ids = self.ids
        if ids is not None and ids.shape[0] >= rows and ids.shape[1] >= columns:
            return
        height, width = (rows, max(columns, 1)) if ids is None else ids.shape
        if height < rows:
            height = max(rows, 2 * height)
        if width < columns:
            width = max(columns, 2 * width)
        grown = torch.zeros((height, width), dtype=torch.long, device=device)
        if ids is not None:
            grown[: ids.shape[0], : ids.shape[1]] = ids
        self.ids = grown


def _on(tensor: torch.Tensor, device) -> bool:
    """Whether `tensor` is on `device` ("cuda" is any CUDA device's, "cuda:1" only the second's)."""
    device = torch.device(device)
    return tensor.device.type == device.type and device.index in (None, tensor.device.index)


def row_contexts(wanted: list[tuple], device) -> Contexts:
    """The contexts of (row, window slots) pairs (`ContextIds.contexts`), from their batch's tensor: a row of a
    decoder reads from the decoder's, a row of its own from one it makes at its first read."""
    for row, _ in wanted:
        if row.context_ids is None:
            row.context_ids = ContextIds()
    shared = wanted[0][0].context_ids if wanted else ContextIds()
    if all(row.context_ids is shared for row, _ in wanted):
        return shared.contexts(wanted, device)
    return Contexts.joined([row.context_ids.contexts([(row, slots)], device) for row, slots in wanted])
