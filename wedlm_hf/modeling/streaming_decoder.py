"""Streaming parallel decoding (WEDLM.md section 3) for a batch of left-padded prompts on one reused KV cache.

Each row keeps a window of uncommitted slots after its committed length P: masks, or tokens sampled but not yet
committed. A step feeds every row's window reordered (filled slots first, then masks, each at its logical
position), commits the leading run of filled slots (their K/V, computed against the clean prefix only, stay in
the cache), drops the K/V of every other window row, and fills masks by entropy. Rows advance independently;
finished rows leave the batch.
"""

from dataclasses import dataclass, field

import torch

from .ragged_cache import RaggedCache
from .window_filling import FillSampler, choose_fills, entropy, suppress_token


@dataclass
class WeDLMStats:
    """Per-row decoding statistics: decoding forwards, committed tokens, and window rows fed (prompt rows, prefilled
    in the first forward, are not counted)."""

    forwards: int = 0
    tokens: int = 0
    rows_fed: int = 0

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / self.forwards if self.forwards else 0.0

    @property
    def p_cache(self) -> float:
        """Committed tokens / token rows fed in decoding forwards (1.0 = every computed row was kept)."""
        return self.tokens / self.rows_fed if self.rows_fed else 0.0

    def to_dict(self) -> dict:
        return {
            "forwards": self.forwards,
            "tokens": self.tokens,
            "rows_fed": self.rows_fed,
            "tokens_per_forward": self.tokens_per_forward,
            "p_cache": self.p_cache,
        }


@dataclass
class _Row:
    """One sequence: its prompt, committed tokens and window (`None` = mask)."""

    index: int
    prompt: list[int]
    budget: int
    generated: list[int] = field(default_factory=list)
    window: list[int | None] = field(default_factory=list)
    stats: WeDLMStats = field(default_factory=WeDLMStats)
    done: bool = False
    kv: list | None = None  # the finished row's cache, kept only when the caller wants it back

    @property
    def committed(self) -> int:
        """Logical length P: prompt plus committed tokens."""
        return len(self.prompt) + len(self.generated)

    def leading_run(self) -> int:
        run = 0
        while run < len(self.window) and self.window[run] is not None:
            run += 1
        return run

    def refill(self, window_size: int, stop_ids: set[int]) -> None:
        """Appends masks so `window_size` slots remain after this step's commit, within the token budget and
        never after a filled stop token."""
        if any(token in stop_ids for token in self.window if token is not None):
            return
        room = self.budget - len(self.generated) - len(self.window)
        wanted = window_size + self.leading_run() - len(self.window)
        self.window.extend([None] * max(0, min(wanted, room)))


class StreamingDecoder:
    """Runs WeDLM decoding to the end for every row; see `generate_wedlm` for the user-facing entry point."""

    def __init__(
        self,
        model,
        mask_token_id: int,
        window_size: int,
        entropy_threshold: float | None,
        pos_penalty_factor: float,
        sampler: FillSampler,
        max_new_tokens: int,
        stop_ids: set[int],
        stopping_criteria=None,
        streamer=None,
        keep_cache: bool = False,
    ):
        self.model = model
        self.mask_token_id = mask_token_id
        self.window_size = window_size
        self.threshold = entropy_threshold
        self.penalty = pos_penalty_factor
        self.sampler = sampler
        self.max_new_tokens = max_new_tokens
        self.stop_ids = stop_ids
        self.criteria = stopping_criteria or []
        self.streamer = streamer
        self.keep_cache = keep_cache

    def decode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache=None) -> list[_Row]:
        """input_ids / attention_mask: left-padded (batch, T). Returns the rows in input order."""
        rows = [
            _Row(index=b, prompt=input_ids[b][attention_mask[b].bool()].tolist(), budget=self.max_new_tokens)
            for b in range(input_ids.shape[0])
        ]
        kv = RaggedCache(self.model, len(rows), max_dead=max(16, self.window_size), cache=cache)
        positions = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
        # The prompt is prefilled in the same forward as the first window (all masks, placed after it): under the
        # causal mask its rows see only the prompt, so its K/V are those of a separate prefill, one forward sooner.
        prefill = (input_ids, positions, attention_mask.bool())

        active = list(rows)
        while active:
            self._step(active, kv, prefill)
            prefill = None
            finished = [i for i, row in enumerate(active) if row.done]
            if finished:
                if self.keep_cache:
                    for i in finished:
                        active[i].kv = kv.row_kv(i)
                survivors = [i for i, row in enumerate(active) if not row.done]
                active = [active[i] for i in survivors]
                if active:
                    kv.select_rows(survivors)
            if active:
                kv.compact_if_needed()
        return rows

    def _step(self, active: list[_Row], kv: RaggedCache, prefill: tuple | None = None) -> None:
        """One decoding forward for every active row; `prefill` (ids, positions, valid) is fed before the window."""
        device = kv.valid.device
        for row in active:
            row.refill(self.window_size, self.stop_ids)

        # Reordered feed per row: [filled slots][padding][masks]; masks last so `logits_to_keep` covers them all.
        feeds = []
        for row in active:
            base = row.committed
            filled = [(tok, base + i) for i, tok in enumerate(row.window) if tok is not None]
            masks = [base + i for i, tok in enumerate(row.window) if tok is None]
            feeds.append((filled, masks))
        width = max(len(f) + len(m) for f, m in feeds)
        n_masks = max(len(m) for _, m in feeds)
        ids = torch.full((len(active), width), self.mask_token_id, dtype=torch.long)
        pos = torch.zeros((len(active), width), dtype=torch.long)
        valid = torch.zeros((len(active), width), dtype=torch.bool)
        for b, (filled, masks) in enumerate(feeds):
            if filled:
                ids[b, : len(filled)] = torch.tensor([t for t, _ in filled])
                pos[b, : len(filled)] = torch.tensor([p for _, p in filled])
                valid[b, : len(filled)] = True
            if masks:
                pos[b, width - len(masks) :] = torch.tensor(masks)
                valid[b, width - len(masks) :] = True
            active[b].stats.forwards += 1
            active[b].stats.rows_fed += len(filled) + len(masks)

        ids, pos, valid = ids.to(device), pos.to(device), valid.to(device)
        if prefill is not None:
            ids, pos, valid = (torch.cat([before, after], dim=1) for before, after in zip(prefill, (ids, pos, valid)))
        logits = kv.forward(ids, pos, valid, logits_to_keep=max(n_masks, 1))

        # Commit each row's leading filled run: its K/V are exactly AR prefill K/V; everything else is scratch.
        runs = [row.leading_run() for row in active]
        kv.keep_leading(width, runs)
        kept = [self._commit(row, run) for row, run in zip(active, runs)]
        if kept != runs:
            kv.keep_leading(max(runs), kept)

        if n_masks == 0:
            return
        scores = suppress_token(logits[:, logits.shape[1] - n_masks :], self.mask_token_id)
        entropies = entropy(scores).tolist()
        tokens = self.sampler(scores.flatten(0, 1)).view(len(active), n_masks).tolist()
        for b, row in enumerate(active):
            n_row = len(feeds[b][1])
            if row.done or n_row == 0:
                continue
            slots = [i for i, tok in enumerate(row.window) if tok is None]
            picks = choose_fills(entropies[b][n_masks - n_row :], slots, self.threshold, self.penalty)
            for i in picks:
                row.window[slots[i]] = tokens[b][n_masks - n_row + i]

    def _commit(self, row: _Row, run: int) -> int:
        """Moves the leading run into the committed text, stopping at a stop; returns how many were kept."""
        kept = 0
        for token in row.window[:run]:
            row.generated.append(token)
            kept += 1
            if token in self.stop_ids or len(row.generated) >= row.budget or self._criteria_stop(row):
                row.done = True
                break
        row.window = row.window[run:]
        row.stats.tokens += kept
        if self.streamer is not None and kept:
            self.streamer.put(torch.tensor(row.generated[-kept:]))
        return kept

    def _criteria_stop(self, row: _Row) -> bool:
        if not self.criteria:
            return False
        ids = torch.tensor([row.prompt + row.generated], device=self.model.device)
        return any(bool(criterion(ids, None).any()) for criterion in self.criteria)
