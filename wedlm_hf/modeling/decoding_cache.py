"""What the decoder asks of its KV cache: the interface `RaggedCache` (dynamic) and `SlotCache` (static) implement.

The decoder never touches K/V itself. Rows are addressed by their place in the decoder's active list; a step feeds
every active row (`forward`), then says how many of each row's fed tokens stay (`keep_leading`); rows join
(`add_rows`, `load_prefixes`) and leave (`select_rows`) between steps. Everything the decoder passes is host data
(lists of ints) or tensors it built, so no method needs to read a tensor back to decide what to do.
"""

from typing import Protocol

import torch


class DecodingCache(Protocol):
    device: torch.device
    max_dead: int  # columns a cache may waste before it compacts (a dynamic cache's holes); the decoder sets it

    def feed_width(self, width: int, prefill: bool) -> int:
        """The width a step feeds, for a widest row of `width` tokens (a static cache buckets it)."""

    def feed_layout(self) -> tuple[int, list[int] | None]:
        """The rows a step's feed has, and the feed row of each active row; None: the active rows in order, no
        others (a static cache feeds its slots, free ones as padding)."""

    def add_rows(self, count: int) -> None:
        """`count` rows join at the end of the active list, with nothing cached."""

    def load_prefixes(self, prefixes: dict[int, list]) -> None:
        """Rows that just joined take cached K/V of their prompt's first tokens: per row, per layer (heads, n, dim)."""

    def forward(self, input_ids, position_ids, new_valid, columns: list[int], prefill: bool, counts: list[int]):
        """Runs the model on the step's feed (laid out as `feed_layout` says, `feed_width` wide) on top of the cache;
        returns the active rows' logits of `columns` (ascending). `new_valid` marks real tokens (not padding),
        `counts` how many each active row has."""

    def keep_leading(self, fed: int, keep: list[int]) -> None:
        """Of the `fed` columns the last forward appended, row b keeps its first keep[b]."""

    def select_rows(self, rows: list[int]) -> None:
        """Only these active rows stay, in this order."""

    def row_kv(self, row: int) -> list:
        """One row's committed K/V, per layer (heads, tokens, dim)."""

    def compact_if_needed(self) -> bool:
        """Squeezes out wasted columns where more than `max_dead` are; returns whether it did."""
