"""Streaming parallel decoding (docs/algorithm.md section 3) for rows that join and leave one shared KV cache.

Each row (`decoding_state.DecodingRow`) keeps a window of uncommitted slots after its committed length P: masks,
or tokens filled but not yet committed. A step runs in phases:

1. admit: rows that joined since the last step take cache rows (and their cached prefixes);
2. refill: each window is topped up with masks, in lossless mode after drafts copied from the context
   (`window_refill`);
3. feed: every row's window reordered, filled slots first, then masks, each at its logical position, with a
   joining row's prompt (chunk) before it (`step_feed`);
4. run: one forward on the cache (`RaggedCache`, or `SlotCache` for static shapes; `decoding_cache` writes down
   what both do);
5. commit: each row's rule, default or lossless, keeps its leading run or what verification accepts
   (`commit_rules`); the cache keeps those K/V and drops the rest;
6. fill: masks filled by the entropy rule, for the whole batch at once (`batch_fill`); a row under a grammar then
   walks its window (`grammar_hook`), and a window that runs to the row's end commits now;
7. retire: finished rows leave the batch.

Rows carry their own settings, advance independently, may join at any step (their prompt is prefilled in that
step's forward, before its window; under a token budget, a long prompt over several steps) and leave as soon as they
finish: `generate_wedlm` runs a fixed batch to the end, a server keeps adding requests. A row's random draws depend
only on its own state, never on what else shares the batch, so a row with its own seeded generator draws the same
tokens alone or batched.
"""

import torch

from .batch_fill import fill_masks
from .commit_rules import commit, commit_ending
from .context_ids import ContextIds
from .decoding_cache import DecodingCache
from .decoding_state import DecodingRow, DecodingSettings, Fill
from .draft_verification import device_index, greedy_predictions, host_predictions
from .grammar_hook import MAX_FORCED, constrain_window, restrict_to_grammar
from .ragged_cache import RaggedCache
from .step_cost import keys_per_row, prompt_cap
from .step_draws import draws_before_read, own_draw
from .step_feed import StepFeed, build_feed, logit_columns, open_masks
from .step_readout import StepReadout, read_step
from .window_refill import refill


class StreamingDecoder:
    """The WeDLM decoding loop: rows that join and leave at any step share one cache, one forward per `step()`.

    It runs under `generate_wedlm` (generate's front: arguments, checks, output) and under `wedlm-hf serve`.

    add(prompt, settings) -> row joins at the next step; step() -> the rows that committed or finished;
    finish(row, keep) ends a row early (a stopping criterion, a cancelled request).

    `cache`: an empty DynamicCache to decode on (one is made when None), a `SlotCache` for static shapes
    (docs/algorithm.md section 3.j), or any other `DecodingCache` (a server's cache mirrored on several ranks).

    `token_budget` bounds the token rows one forward feeds (batch x width, padding included): a joining prompt
    that would widen the forward past it is prefilled in chunks over several steps, its window joining with the
    last chunk. Beside rows that decode, a chunk's attention counts as token rows too (`step_cost`), so a long
    context's chunks are shorter. The budget is soft by at most one window per row: every step feeds every decoding
    row's window.
    """

    def __init__(
        self, model, mask_token_id: int, keep_cache: bool = False, cache=None, token_budget: int | None = None
    ):
        if token_budget is not None and token_budget < 1:
            raise ValueError(f"token_budget must be >= 1 (or None for no bound), got {token_budget}.")
        self.model = model
        self.mask_token_id = mask_token_id
        self.keep_cache = keep_cache
        self.token_budget = token_budget
        self._keys_per_row = keys_per_row(model.config)
        self.kv: DecodingCache = (
            cache if hasattr(cache, "keep_leading") else RaggedCache(model, 0, max_dead=16, cache=cache)
        )
        self.draws_before_read = draws_before_read(self.kv.device)  # sampled rows' draws (`step_draws`)
        self.context_ids = ContextIds()  # what context-reading processors read, every row's in one tensor
        self.active: list[DecodingRow] = []
        self._joining: list[DecodingRow] = []
        self._default_only = self._greedy_only = False  # what holds for every active row (`_note_rows`)
        self._count = 0

    def add(
        self,
        prompt: list[int],
        settings: DecodingSettings,
        prefix: list | None = None,
        grammar=None,
        padding: list[int] | None = None,
    ) -> DecodingRow:
        """A row that joins at the next step. `prefix`: per layer, (heads, n, head_dim) K/V of the prompt's first n
        tokens (n < len(prompt), computed by this model at positions 0..n-1), which the row then does not feed.
        `grammar`: a fresh grammar state (`grammar_commit`) the row's generated text must match. `padding`: the
        left padding before the prompt in a batch, which context-reading logits processors see as AR's do."""
        if not prompt:
            raise ValueError("Every prompt needs at least one token.")
        cached = prefix[0][0].shape[1] if prefix else 0
        if cached >= len(prompt):
            raise ValueError("A cached prefix must leave at least the prompt's last token to feed.")
        row = DecodingRow(
            index=self._count,
            prompt=list(prompt),
            settings=settings,
            prefix=prefix or None,
            grammar=grammar,
            padding=list(padding or []),
            context_ids=self.context_ids,
        )
        row.prompt_fed = cached
        row.free_width = torch.device(self.kv.device).type != "cpu"
        if grammar is not None:  # what the grammar forces first is fed with the prompt and commits with it
            forced = grammar.forced()[: min(settings.max_new_tokens, MAX_FORCED)]
            row.window = [Fill(token, source="forced") for token in forced]
        self._count += 1
        self._joining.append(row)
        return row

    @property
    def busy(self) -> bool:
        return bool(self.active or self._joining)

    def finish(self, row: DecodingRow, keep: int | None = None, reason: str = "stop") -> None:
        """Ends `row` now, keeping its first `keep` committed tokens (all by default)."""
        if keep is not None and keep < len(row.generated):
            row.stats.tokens -= len(row.generated) - keep
            del row.generated[keep:]
            del row.logits[keep:]
        if row in self._joining:
            self._joining.remove(row)
            self.context_ids.release(row)
            row.context_ids = None
        if not row.done:
            row.done, row.finish_reason = True, reason
        if row in self.active:
            self._retire([row])
        elif row.kv is not None:
            row.kv = _truncated(row.kv, row.committed)

    def row_cache(self, row: DecodingRow, length: int) -> list:
        """An active row's committed K/V (per layer, (heads, tokens, head_dim)), its first `length` tokens."""
        return _truncated(self.kv.row_kv(self.active.index(row)), length)

    @torch.no_grad()
    def step(self) -> list[DecodingRow]:
        """One forward for every active row and every row that joined since the last step (never under autograd);
        returns the rows that committed a token or finished."""
        rows = self._admit()
        if not rows:
            return []
        for row in rows:
            refill(row)
        feed = build_feed(rows, self.kv, self.mask_token_id, self._prompt_cap(rows))
        for row, decode, start, count in zip(rows, feed.decodes, feed.starts, feed.counts):
            if decode:  # the window's rows: its filled slots and masks
                row.stats.forwards += 1
                row.stats.rows_fed += count - start
        columns, ar_columns, sparse = logit_columns(rows, feed)
        logits = self.kv.forward(feed.ids, feed.positions, feed.valid, columns, feed.prefill, feed.counts)
        column = {c: j for j, c in enumerate(columns)}
        ar_rows = {b: list(map(column.__getitem__, cs)) for b, cs in ar_columns.items()}
        for b, cs in ar_rows.items():  # only the rows that use them take a view of their logits (an operator each)
            row = rows[b]
            if row.tracks_logits or (row.grammar is not None and row.settings.lossless):
                _follow_ar_logits(row, logits[b], cs, feed.starts[b], feed.runs[b], sparse.get(b))
        _without_the_mask(rows, logits, ar_rows, self.mask_token_id, self._default_only)
        early = (feed.runs, feed.masks) if self.draws_before_read else (None, None)
        premasked = self._default_only and self._greedy_only
        readout = read_step(rows, logits, feed.n_masks, self.mask_token_id, ar_rows, *early, premasked)
        kept, stale = self._commit(rows, feed, logits, ar_rows, readout)
        self._fill(rows, feed, logits[:, len(columns) - feed.n_masks :], readout, stale)
        finished = [row for row in rows if row.done]
        if finished:
            self._retire(finished)
        if self.active:
            self.kv.compact_if_needed()
        return [row for row, n in zip(rows, kept) if n or row.done]

    def _admit(self) -> list[DecodingRow]:
        """Phase 1: rows that joined since the last step take cache rows, their cached prefixes loaded."""
        joining, self._joining = self._joining, []
        if joining:
            self.kv.add_rows(len(joining))
            self.active += joining
            prefixes = {b: row.prefix for b, row in enumerate(self.active) if row.prefix is not None}
            if prefixes:
                self.kv.load_prefixes(prefixes)
                for b in prefixes:
                    self.active[b].prefix = None
        if self.active:
            self.kv.max_dead = max([16] + [row.settings.window_size for row in self.active])
        if joining:
            self._note_rows()
        return self.active

    def _note_rows(self) -> None:
        """What holds for every active row, noted as rows join and leave rather than asked of each row every step:
        whether all draft from the context in the default mode (their AR choices skip the mask token, taken out of
        every logits column at once: `_without_the_mask`) and whether none draws its own fills (the readout then
        reads every column with one max: `read_step`)."""
        rows = self.active
        self._default_only = all([row.verifies and not row.settings.lossless for row in rows])
        self._greedy_only = not any([own_draw(row) for row in rows])

    def _prompt_cap(self, rows: list[DecodingRow]) -> int | None:
        """The prompt tokens a joining row may feed this step under the token budget (None: no budget). Beside
        decoding rows, the step's attention counts too (`step_cost`): a chunk is as long as keeps the step within
        the budget at the context it reaches, so that rows already decoding never wait on a costly step."""
        if self.token_budget is None:
            return None
        decoding = [row for row in rows if row.prefilled]
        joining = [row for row in rows if not row.prefilled]
        width = max((len(row.window) for row in decoding), default=0)
        if not decoding or not joining or self._keys_per_row is None:
            return max(width, self.token_budget // len(rows), 1)
        context = max(row.committed + len(row.window) for row in decoding)
        fed = max(row.prompt_fed for row in joining)
        remaining = max(len(row.prompt) - row.prompt_fed + len(row.window) for row in joining)  # the last chunk
        # feeds the window with it
        return prompt_cap(self.token_budget, len(rows), width, context, fed, remaining, self._keys_per_row)

    def _commit(self, rows, feed: StepFeed, logits, ar_rows: dict, readout: StepReadout):
        """Phase 5: each row's commit rule; the cache keeps a joining row's prompt (the first columns it was fed)
        and every row's committed run. Returns the tokens each row committed and the rows whose mask fills are
        void (a failed guess under a grammar: every mask saw it)."""
        predictions = greedy_predictions(rows, ar_rows, readout.ar_top) | readout.predictions
        if not self.draws_before_read and not self._greedy_only:  # rows with their sampler's own AR choice
            predictions |= host_predictions(rows, logits, ar_rows)
        kept, stale = [], set()
        for b, row in enumerate(rows):
            count, failed = commit(row, feed.runs[b], predictions.get(b)) if feed.decodes[b] else (0, False)
            kept.append(count)
            if failed:
                stale.add(b)
            row.prompt_fed += feed.starts[b]
        # Where every row ends here and no cache is returned, the rows' columns are dropped next, not cropped first.
        if self.keep_cache or not all(row.done for row in rows):
            self.kv.keep_leading(feed.width, [s + min(n, f) for s, n, f in zip(feed.starts, kept, feed.filled)])
        return kept, stale

    def _fill(self, rows, feed: StepFeed, mask_logits: torch.Tensor, readout: StepReadout, stale: set) -> None:
        """Phase 6: the entropy rule's fills for the batch; then each grammar row's walk; then a window that runs to
        the row's end commits."""
        n_masks = feed.n_masks
        masks = [[] if b in stale else m for b, m in enumerate(feed.masks)]
        grammar_rows = [b for b, row in enumerate(rows) if feed.decodes[b] and row.grammar is not None]
        # Lossless mode always drafts a row's leftmost mask: where the grammar rejects that draft, its logits choose
        # among the tokens the grammar allows.
        lossless_masks = {b: open_masks(rows[b], masks[b], n_masks) for b in grammar_rows if rows[b].settings.lossless}
        if n_masks:
            fill_masks(rows, masks, readout)
        for b in grammar_rows:
            row = rows[b]
            if not row.done:
                open_slots = lossless_masks[b] if row.settings.lossless else open_masks(row, masks[b], n_masks)
                constrain_window(row, {slot: mask_logits[b, c] for c, slot in open_slots})
        for row, decode in zip(rows, feed.decodes):
            if decode and not row.done:
                commit_ending(row)

    def _retire(self, finished: list[DecodingRow]) -> None:
        """Finished rows leave the cache (their K/V kept where asked) and drop their context index and ids, which a
        caller holding the row has no use for."""
        leaving = {id(row) for row in finished}
        positions = [i for i, row in enumerate(self.active) if id(row) in leaving]
        if self.keep_cache:
            for i in positions:
                self.active[i].kv = _truncated(self.kv.row_kv(i), self.active[i].committed)
        for row in finished:
            row.context = None
            self.context_ids.release(row)
            row.context_ids = None
        survivors = [i for i, row in enumerate(self.active) if id(row) not in leaving]
        self.active = [self.active[i] for i in survivors]
        self._note_rows()
        self.kv.select_rows(survivors)


def _follow_ar_logits(row: DecodingRow, logits: torch.Tensor, columns: list[int], start: int, run: int, sparse):
    """A row that follows its AR logits (`tracks_logits`) takes this step's (`next_logits` / `step_logits`, which
    its commit reads); a lossless row under a grammar has them restricted in place to what the grammar allows."""
    if row.tracks_logits:
        own = logits[columns]
        if start:  # a joining row's last prompt token predicts slot 0
            row.next_logits, row.step_logits, row._taken = own[0], own[1:], 0
        elif sparse is not None:  # run slot j's row at step_logits[j], None where not computed
            row.step_logits, row._taken = [None] * run, 0
            for j, logits_j in zip(sparse, own):
                row.step_logits[j] = logits_j
        else:
            row.step_logits, row._taken = own, 0
    if row.grammar is not None and row.settings.lossless:
        restrict_to_grammar(row, logits, columns, run, bool(start))


def _without_the_mask(
    rows: list[DecodingRow], logits: torch.Tensor, ar_rows: dict, mask_token_id: int, all_default: bool
) -> None:
    """A verifying default-mode row chooses its AR tokens without the mask token, which the default mode never
    emits (its fills never do); lossless rows keep it, as plain `generate` does. In place, after the rows that
    keep their AR logits took theirs, in one write. Where every row is such a row (`all_default`), the write takes
    every column (their mask columns are read without the mask token too), with no index tensors to build."""
    if all_default:
        logits.select(-1, mask_token_id).fill_(float("-inf"))
        return
    pairs = [(b, c) for b, cs in ar_rows.items() if rows[b].verifies and not rows[b].settings.lossless for c in cs]
    if pairs:
        at = device_index([b for b, _ in pairs], logits), device_index([c for _, c in pairs], logits)
        logits[at[0], at[1], mask_token_id] = float("-inf")


def _truncated(kv: list, length: int) -> list:
    """A row's per-layer (heads, tokens, dim) K/V cut to its first `length` tokens."""
    return [(k[:, :length], v[:, :length]) for k, v in kv]
