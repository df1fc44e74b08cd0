"""A preallocated KV cache with fixed batch slots and a write position per row: WeDLM on a static cache.

Every slot holds its row's committed K/V in columns 0..length-1, in logical order. A step writes the i-th real
token of a row's feed (padding skipped) at column length + i, so the leading run a row commits is already in place:
its length advances by what it committed and the next step overwrites the rest. Padding is written to the slot's
last column, a sink no query sees, so a row never needs room for more than its own tokens: `max_length` tokens of
prompt plus generated text, however wide a step's feed. Nothing is dropped, moved or compacted, and a step's
tensors have shapes that depend only on buckets, never on how many tokens a row committed:

- slots: the fed batch is the first `bucket(highest occupied slot + 1)` slots (a power of two, at most `slots`);
  a free or finished slot is fed padding (written to its sink);
- width: a decoding step feeds `bucket(widest row)` tokens per row (a power of two; on a CPU also 12, 24, 48, ...:
  `fine_widths`); a step that prefills a prompt feeds a decoding step's width up to PREFILL_STEP (a short prompt
  with its window costs no more rows than that), else its width rounded up to a multiple of PREFILL_STEP, and
  runs uncompiled, as transformers' prefill does;
- logits: the columns asked for, padded to a power of two by repeating the last one;
- keys: a step attends over the first columns that hold every fed row's tokens, rounded up to a multiple of
  KEYS_STEP, under a 4D additive mask: the row's committed prefix, plus its real fed tokens up to itself.

Under `torch.compile` (the `compiled` call, or a compiled `model.forward`), a generation therefore sees a handful
of shapes; positions, write positions and the mask are tensors, so no Python branches on tensor values.
"""

import torch
from transformers import Cache

from .batch_invariant import check_model
from .transformers_versions import forward_arguments

PREFILL_STEP = 32  # prefill widths are rounded up to a multiple of this
LENGTH_STEP = 256  # and cache lengths to a multiple of this, so that generations of similar sizes share shapes
KEYS_STEP = 128  # a step attends over a multiple of this many columns


def bucket(n: int, cap: int | None = None, fine: bool = False) -> int:
    """The smallest power of two >= n, at least 2 (torch.compile specialises sizes 0 and 1), at most `cap`. With
    `fine`, three quarters of a power of two also count from 12 on (12, 24, 48, ...): padding then adds at most
    half a feed's rows from 9 on, not as many again, for one more shape per doubling."""
    size = max(2, 1 << max(0, n - 1).bit_length())
    if fine and size >= 16 and n <= size * 3 // 4:
        size = size * 3 // 4
    return size if cap is None else min(size, cap)


def round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def static_decoding_refusal(model) -> str | None:
    """Why `model` cannot decode on fixed slots, with the fix; None where it can. `generate` and `wedlm-hf serve
    --compile` both ask, each adding its own way out."""
    if "flash" in (getattr(model.config, "_attn_implementation", None) or ""):
        return (
            "the static step attends under a 4D mask that flash attention cannot take: load the model with "
            "attn_implementation='sdpa' (the default)"
        )
    if any(kind != "full_attention" for kind in getattr(model.config.get_text_config(), "layer_types", None) or ()):
        return (
            "the static step attends over whole slots, which sliding-window layers cannot: load the model with "
            "use_sliding_window=False"
        )
    return None


class SlotLayer:
    """One layer's preallocated keys and values, (slots, kv heads, columns, head dim)."""

    is_compileable = True
    is_sliding = False
    is_initialized = True

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys, self.values = keys, values
        torch._dynamo.mark_static_address(self.keys)  # in place across steps, so CUDA graphs may replay it
        torch._dynamo.mark_static_address(self.values)


class SlotCache(Cache):
    """The KV cache of `StreamingDecoder` on fixed slots, a `DecodingCache`; `forward` runs one step (see the
    module docstring).

    `compiled`: the call used for decoding steps (e.g. `model.get_compiled_call(compile_config)`); prefill steps,
    and every step when it is None, call the model as it is.
    """

    def __init__(self, model, slots: int, max_length: int, compiled=None):
        """`max_length`: the tokens (prompt plus generated) a row may hold; the slot gets a sink column more."""
        check_model(model)  # inside `batch_invariant()`, a model it does not cover is refused before any forward
        columns = round_up(max_length + 1, LENGTH_STEP)
        text = model.config.get_text_config()
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        shape = (slots, heads, columns, head_dim)
        layers = [
            SlotLayer(
                torch.zeros(shape, dtype=model.dtype, device=model.device),
                torch.zeros(shape, dtype=model.dtype, device=model.device),
            )
            for _ in range(text.num_hidden_layers)
        ]
        super().__init__(layers=layers)
        self.model = model
        self.slots = slots
        self.max_length = columns - 1  # the last column is the sink
        self.compiled = compiled
        self.device = model.device
        self.lengths = [0] * slots  # committed columns per slot
        self.slot_of: list[int] = []  # the slot of each active row, in the decoder's row order
        self._slots: torch.Tensor | None = None  # `slot_of` on the device, where it is not 0, 1, 2, ... (`_placed`)
        self.write_index: torch.Tensor | None = None  # (fed slots, width): where this step's tokens go
        self.keys_length = columns  # the columns this step attends over
        self._cache_kwarg, self._keeps_logits = forward_arguments(model)
        self._arange = torch.arange(columns, device=model.device)
        # The mask's two values, made once: `model.dtype` walks the parameters, a cost per step on a large model.
        self._seen = torch.zeros((), dtype=model.dtype, device=model.device)
        self._blocked = torch.tensor(torch.finfo(model.dtype).min, dtype=model.dtype, device=model.device)
        # On a CPU every row fed costs its share of the matrix products, so widths take finer buckets; on a GPU a
        # few rows more cost next to nothing, and each shape more is a graph to compile and capture.
        self.fine_widths = self.device.type == "cpu"

    # ---- what the model calls --------------------------------------------------------------------------------

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        layer = self.layers[layer_idx]
        fed, heads, width, dim = key_states.shape
        index = self.write_index[:, None, :, None].expand(fed, heads, width, dim)
        layer.keys[:fed].scatter_(2, index, key_states)
        layer.values[:fed].scatter_(2, index, value_states)
        return layer.keys[:fed, :, : self.keys_length], layer.values[:fed, :, : self.keys_length]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """0: rows have lengths of their own (`lengths`), and the model is always given positions explicitly."""
        return 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.max_length

    # ---- what the decoder calls (`decoding_cache.DecodingCache`) ------------------------------------------------

    def feed_width(self, width: int, prefill: bool) -> int:
        if prefill and width > PREFILL_STEP:
            return round_up(width, PREFILL_STEP)
        return bucket(width, fine=self.fine_widths)

    def feed_layout(self) -> tuple[int, list[int]]:
        """A step feeds the first bucket(highest occupied slot + 1) slots, each active row in its own."""
        return bucket(max(self.slot_of) + 1, self.slots), self.slot_of

    def add_rows(self, count: int) -> None:
        free = sorted(set(range(self.slots)) - set(self.slot_of))
        if count > len(free):
            raise RuntimeError(
                f"The static cache has {self.slots} slots and {len(self.slot_of)} are taken: {count} more rows cannot "
                "join. Decode fewer rows at once or make the cache with more slots."
            )
        for slot in free[:count]:
            self.lengths[slot] = 0
            self.slot_of.append(slot)
        self._placed()

    def load_prefixes(self, prefixes: dict[int, list]) -> None:
        """Writes each given row's per-layer (heads, n, head_dim) K/V as its first n committed columns."""
        for row, kv in prefixes.items():
            slot, n = self.slot_of[row], kv[0][0].shape[1]
            for layer, (keys, values) in zip(self.layers, kv):
                layer.keys[slot, :, :n] = keys
                layer.values[slot, :, :n] = values
            self.lengths[slot] = n

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        new_valid: torch.Tensor,
        columns: list[int],
        prefill: bool = False,
        counts: list[int] | None = None,
    ) -> torch.Tensor:
        """Runs a step's feed, one row per slot of the first `feed_layout()[0]` (free ones padding), all
        `feed_width` wide; returns the active rows' logits (in decoder order) of the given columns (ascending),
        computing no others where the model allows. A step that prefills a prompt runs the model uncompiled.
        `counts`: each active row's real tokens (read from `new_valid` when not given)."""
        rows, width = input_ids.shape
        counts = new_valid[self.slot_of].sum(1).tolist() if counts is None else counts
        extent = max(self.lengths[slot] + n for slot, n in zip(self.slot_of, counts))
        if extent > self.max_length:
            raise RuntimeError(
                f"The static cache holds {self.max_length} tokens per row, and this step would take a row to "
                f"{extent}: make the cache longer (max_cache_len) or generate fewer tokens."
            )
        fed, _ = self.feed_layout()
        if rows != fed:
            raise ValueError(f"A step on this cache feeds its first {fed} slots (`feed_layout`), not {rows} rows.")
        start = torch.tensor(self.lengths[:fed], device=self.device)
        rank = new_valid.long().cumsum(1) - 1  # a real token's place among the row's real tokens
        self.write_index = torch.where(new_valid, start[:, None] + rank, self.max_length)
        self.keys_length = min(round_up(extent, KEYS_STEP), self.max_length + 1)
        mask = self._attention_mask(start, rank)

        kwargs = {self._cache_kwarg: self}
        if self._keeps_logits:
            keep = bucket(len(columns), width)
            kwargs["logits_to_keep"] = torch.tensor(columns + [columns[-1]] * (keep - len(columns)), device=self.device)
        call = self.model if self.compiled is None or prefill else self.compiled
        logits = call(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=mask,  # 4D: used as it is
            use_cache=True,
            **kwargs,
        ).logits
        if self._slots is not None:  # the active rows' slots, where they are not the first ones in order
            logits = logits.index_select(0, self._slots)
        elif fed > len(self.slot_of):
            logits = logits[: len(self.slot_of)]
        return logits[:, : len(columns)] if self._keeps_logits else logits[:, columns]

    def keep_leading(self, fed: int, keep: list[int]) -> None:
        """Row b keeps the first keep[b] tokens it was just fed: they are already where they belong."""
        for slot, n in zip(self.slot_of, keep):
            self.lengths[slot] += n

    def select_rows(self, rows: list[int]) -> None:
        """Keeps the given active rows; the others' slots become free (fed padding until a row takes them)."""
        kept = [self.slot_of[i] for i in rows]
        for slot in set(self.slot_of) - set(kept):
            self.lengths[slot] = 0
        self.slot_of = kept
        self._placed()

    def _placed(self) -> None:
        """After rows join or leave: the index that picks the active rows' logits out of a step's slots, None where
        they are the first slots in order (a slice)."""
        ordered = self.slot_of == list(range(len(self.slot_of)))
        self._slots = None if ordered else torch.tensor(self.slot_of, device=self.device)

    def row_kv(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The committed K/V of one row, per layer, as (heads, tokens, head_dim) tensors."""
        slot, length = self.slot_of[row], self.lengths[self.slot_of[row]]
        return [(layer.keys[slot, :, :length].clone(), layer.values[slot, :, :length].clone()) for layer in self.layers]

    def compact_if_needed(self) -> bool:
        return False

    def _attention_mask(self, start: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
        """(fed slots, 1, width, keys_length) additive mask: a real token of rank r sees the slot's committed
        columns and the r + 1 real tokens written from `start` on (itself included). Padding queries, whose output
        is unused, see something or nothing; a free slot's see nothing. No query sees the sink: a row's tokens end
        before it."""
        offset = self._arange[None, : self.keys_length] - start[:, None]  # column - length: the rank it holds
        # A committed column (offset < 0) is seen by every query, as rank >= -1; a written one up to the query's.
        seen = offset[:, None, :] <= rank[:, :, None]
        return torch.where(seen, self._seen, self._blocked)[:, None]
