"""One DynamicCache shared by rows that commit different numbers of tokens per step.

A DynamicCache has one length for the whole batch, so rows cannot be cropped one by one. Instead every column
carries a per-row validity bit that becomes the 2D attention mask: a row's rejected window slots (scratch K/V)
are marked invalid rather than removed, and whole columns that no row keeps are cropped. Holes are squeezed out
(`compact_if_needed`) once they exceed a bound, so the cache never holds more than `max_dead` wasted columns per step.
Positions are not stored: RoPE is already applied to the cached keys, so columns can move freely.
"""

import torch
from transformers import DynamicCache

from .batch_invariant import check_model
from .execution_device import execution_device
from .transformers_versions import CACHE_KWARG, forward_arguments


class RaggedCache:
    """A `DecodingCache` on one DynamicCache (see the module docstring)."""

    def __init__(self, model, batch_size: int, max_dead: int, cache: DynamicCache | None = None):
        check_model(model)  # inside `batch_invariant()`, a model it does not cover is refused before any forward
        self.model = model
        self.cache = cache if cache is not None else DynamicCache(config=model.config)
        if self.cache.get_seq_length() != 0:
            raise ValueError(f"The cache (`{CACHE_KWARG}`) must be an empty DynamicCache for strategy='wedlm'.")
        if any(getattr(layer, "is_sliding", False) for layer in self.cache.layers):
            raise ValueError(
                "strategy='wedlm' does not support sliding-window attention layers: load the model with "
                "use_sliding_window=False."
            )
        self.valid = torch.zeros((batch_size, 0), dtype=torch.bool, device=execution_device(model))
        self.counts = [0] * batch_size  # valid columns per row, followed on the host so that no step reads `valid`
        self.max_dead = max_dead
        attention = getattr(model.config, "_attn_implementation", None) or ""
        self._flash = "flash" in attention
        # A 4D mask is used as it is by the models whose masks transformers' mask functions build (its own, and
        # WeDLM's, which are Qwen3's); remote code may build its own from the 2D mask, so it keeps that.
        stock = type(model).__module__.startswith("transformers.models.") or model.config.model_type == "wedlm"
        self._own_mask = attention == "sdpa" and stock
        self._cache_kwarg, self._keeps_logits = forward_arguments(model)

    @property
    def device(self) -> torch.device:
        return self.valid.device

    def feed_width(self, width: int, prefill: bool) -> int:
        """Feeds are exactly as wide as the widest row (the static `SlotCache` buckets them)."""
        return width

    def feed_layout(self) -> tuple[int, None]:
        return len(self.counts), None

    @property
    def length(self) -> int:
        return self.valid.shape[1]

    def dead_columns(self) -> int:
        """Columns beyond what the fullest row needs: holes plus padding that compaction would remove."""
        if self.length == 0:
            return 0
        return self.length - max(self.counts)

    def add_rows(self, count: int) -> None:
        """Appends `count` batch rows with no valid column: rows that join a running batch."""
        self.valid = torch.cat([self.valid, self.valid.new_zeros((count, self.length))])
        self.counts += [0] * count
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False) and layer.keys is not None and layer.keys.dim() == 4:
                layer.keys = torch.cat([layer.keys, layer.keys.new_zeros((count, *layer.keys.shape[1:]))])
                layer.values = torch.cat([layer.values, layer.values.new_zeros((count, *layer.values.shape[1:]))])

    def load_prefixes(self, prefixes: dict[int, list]) -> None:
        """Writes each given row's per-layer (heads, n, head_dim) K/V into its last n columns. The rows have just
        joined, so every column they have is free; columns are appended (invalid for every other row) only where
        a prefix is longer than the cache, so rows that join beside long-running ones do not widen their cache."""
        longest = max(kv[0][0].shape[1] for kv in prefixes.values())
        if longest > self.length:
            extra = longest - self.length
            self.valid = torch.cat([self.valid.new_zeros((self.valid.shape[0], extra)), self.valid], dim=1)
            first = next(iter(prefixes.values()))
            for layer_idx, (keys, values) in enumerate(first):
                shape = (self.valid.shape[0], keys.shape[0], extra, keys.shape[2])
                layer = self.cache.layers[layer_idx] if layer_idx < len(self.cache.layers) else None
                if getattr(layer, "is_initialized", False):
                    layer.keys = torch.cat([layer.keys.new_zeros(shape), layer.keys], dim=2)
                    layer.values = torch.cat([layer.values.new_zeros(shape), layer.values], dim=2)
                else:  # the first columns of this cache: the layer is created by its first update
                    self.cache.update(keys.new_zeros(shape), values.new_zeros(shape), layer_idx)
        for row, kv in prefixes.items():
            n = kv[0][0].shape[1]
            for layer, (keys, values) in zip(self.cache.layers, kv):
                layer.keys[row, :, self.length - n :] = keys
                layer.values[row, :, self.length - n :] = values
            self.valid[row, self.length - n :] = True
            self.counts[row] = n

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        new_valid: torch.Tensor,
        columns: list[int],
        prefill: bool = False,
        counts: list[int] | None = None,
    ) -> torch.Tensor:
        """Runs the model on new rows on top of the cache (their K/V are appended); returns the logits of the given
        columns of the new rows (ascending), computing no others where the model allows. `counts`: each row's real
        (not padding) tokens. A step of one real token a row on a cache without holes takes no mask, as AR's step
        does: sdpa's kernel without one is the faster (on a CPU by about 5% of a small model's forward)."""
        width = input_ids.shape[1]
        # One real token a row on top of columns all valid: AR's own step, which attends to every key.
        dense = width == 1 and counts is not None and min(counts) == 1 and min(self.counts) == self.length
        valid = torch.cat([self.valid, new_valid], dim=1)
        tail = columns == list(range(width - len(columns), width))
        kwargs = {self._cache_kwarg: self.cache}
        if self._flash and input_ids.shape[0] == 1:
            # Without these, flash attention reads batch-1 non-monotonic positions as packed sequences and attends
            # to the wrong keys (docs/algorithm.md section 5): one query sequence over the whole key sequence.
            q_len, k_len = input_ids.shape[1], valid.shape[1]
            kwargs |= {
                "cu_seq_lens_q": torch.tensor([0, q_len], dtype=torch.int32, device=input_ids.device),
                "cu_seq_lens_k": torch.tensor([0, k_len], dtype=torch.int32, device=input_ids.device),
                "max_length_q": q_len,
                "max_length_k": k_len,
            }
        if self._keeps_logits:
            kwargs["logits_to_keep"] = len(columns) if tail else torch.tensor(columns, device=input_ids.device)
        logits = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=None if dense and self._own_mask else self._attention_mask(valid, width),
            use_cache=True,
            **kwargs,
        ).logits
        self.valid = valid
        if self._keeps_logits:
            return logits
        return logits[:, columns]

    def _attention_mask(self, valid: torch.Tensor, width: int) -> torch.Tensor:
        """The 2D validity mask, or under sdpa on top of a cache the 4D boolean mask transformers would build from
        it (a fed token sees the valid columns up to itself): built here in two ops every step, where transformers'
        mask functions take many, and in none where one token is fed (a view of the validity mask: on a CPU that
        step is an AR step's cost, which lossless mode's steps at rest must keep). A forward on an empty cache
        keeps the 2D mask, which lets a padding-free prefill use sdpa's causal kernel."""
        if not self._own_mask or self.length == 0:
            return valid.long()
        if width == 1:  # the fed token is the last column: it sees every valid one
            return valid[:, None, None, :]
        causal = torch.ones((width, valid.shape[1]), dtype=torch.bool, device=valid.device).tril_(self.length)
        return causal & valid[:, None, None, :]

    def keep_leading(self, fed: int, keep: list[int]) -> None:
        """Of the `fed` columns just appended, row b keeps its first keep[b] (real tokens, no padding among them:
        `counts` grows by them); the others become scratch."""
        kept = max(keep)
        if fed > kept:
            self.cache.crop(-(fed - kept))
            self.valid = self.valid[:, : self.length - (fed - kept)]
        if min(keep) < kept:
            held = torch.arange(kept, device=self.device)[None] < torch.tensor(keep, device=self.device)[:, None]
            self.valid[:, self.length - kept :] &= held
        self.counts = [count + n for count, n in zip(self.counts, keep)]

    def select_rows(self, rows: list[int]) -> None:
        self.counts = [self.counts[i] for i in rows]
        if not rows:  # the batch ends: the cache is left empty, as new, its memory freed (no gather of nothing)
            self.valid = self.valid.new_zeros((0, 0))
            for layer in self.cache.layers:
                if getattr(layer, "is_initialized", False) and layer.keys is not None and layer.keys.dim() == 4:
                    layer.keys = layer.keys.new_empty((0, layer.keys.shape[1], 0, layer.keys.shape[3]))
                    layer.values = layer.values.new_empty((0, layer.values.shape[1], 0, layer.values.shape[3]))
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.valid.device)
        self.cache.batch_select_indices(index)
        self.valid = self.valid[index]

    def row_kv(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The valid K/V of one row, per layer, as (heads, tokens, head_dim) tensors. A lone row with every column
        valid gets views (the cache's tensors are replaced, never written in place, once it leaves); other rows get
        copies, so that rows leaving a batch at different steps do not each keep the whole batch's cache alive."""
        if self.valid.shape[0] == 1 and bool(self.valid[row].all()):
            return [(layer.keys[row], layer.values[row]) for layer in self.cache.layers]
        cols = self.valid[row].nonzero().squeeze(1)
        return [(layer.keys[row][:, cols], layer.values[row][:, cols]) for layer in self.cache.layers]

    def compact_if_needed(self) -> bool:
        """Squeezes out invalid columns (rows end up left-padded) once more than `max_dead` are wasted."""
        if self.dead_columns() <= self.max_dead:
            return False
        new_len = max(self.counts)
        # Stable sort puts each row's valid columns last, in order: exactly a left-padded row.
        order = torch.sort(self.valid.to(torch.int8), dim=1, stable=True).indices[:, -new_len:]
        for layer in self.cache.layers:
            layer.keys = _gather_columns(layer.keys, order)
            layer.values = _gather_columns(layer.values, order)
        self.valid = self.valid.gather(1, order)
        return True


def _gather_columns(states: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """states (batch, heads, length, dim) gathered along length with a per-row column order (batch, new_length)."""
    return states.gather(2, order[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[-1]))
