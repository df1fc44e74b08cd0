"""Streaming parallel decoding (docs/algorithm.md section 3) for rows that join and leave one shared KV cache.

Each row keeps a window of uncommitted slots after its committed length P: masks, or tokens filled but not yet
committed. A step feeds every row's window reordered (filled slots first, then masks, each at its logical
position), commits the leading run of filled slots (their K/V, computed against the clean prefix only, stay in
the cache), drops the K/V of every other window row, and fills masks by entropy. In lossless mode the run's own
rows verify it first (`draft_verification`). Rows carry their own settings, advance independently, may join at
any step (their prompt is prefilled in that step's forward, before its window; under a token budget, a long prompt
over several steps) and leave as soon as they finish: `generate_wedlm` runs a fixed batch to the end, a server keeps
adding requests. A row's random draws depend only on its own state, never on what else shares the batch, so a row
with its own seeded generator draws the same tokens alone or batched. A row may carry a grammar, checked as its
text commits (`grammar_commit`).
"""

from dataclasses import asdict, dataclass, field

import torch

from .context_drafts import LONG_MATCH, ContextIndex
from .decoding_config import WeDLMDecodingConfig
from .draft_verification import ArPredictions
from .draft_windows import COPY_TOKENS, GROWTH, JOIN_MASKS, ContextWindow, DraftWindow
from .grammar_commit import allowed_along, allowed_tokens, restrict, valid_prefix
from .ragged_cache import RaggedCache
from .slot_cache import SlotCache
from .window_filling import FillSampler, choose_fills, entropy, greedy, suppress_token

OWN_SOURCES = ("model", "constrained")  # a Fill's sources that are the model's own drafts (grammar-restricted or not)


@dataclass
class WeDLMStats:
    """Per-row decoding statistics: decoding forwards, committed tokens, window rows fed (prompt rows, prefilled
    in the first forward, are not counted) and, in lossless mode, drafts accepted or rejected by verification, of
    which `*_context_drafts` were copied from the context (the rest are the model's own fills). Under a grammar,
    `forced_tokens` of the committed tokens were forced by it and `constrained_tokens` chosen among the tokens it
    allowed at the slot after the committed text (default mode; in lossless mode every AR token is)."""

    forwards: int = 0
    tokens: int = 0
    rows_fed: int = 0
    accepted_drafts: int = 0
    rejected_drafts: int = 0
    accepted_context_drafts: int = 0
    rejected_context_drafts: int = 0
    forced_tokens: int = 0
    constrained_tokens: int = 0

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / self.forwards if self.forwards else 0.0

    @property
    def p_cache(self) -> float:
        """Committed tokens / token rows fed in decoding forwards (1.0 = every computed row was kept)."""
        return self.tokens / self.rows_fed if self.rows_fed else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / verified drafts in lossless mode; None when no draft was verified."""
        checked = self.accepted_drafts + self.rejected_drafts
        return self.accepted_drafts / checked if checked else None

    def to_dict(self) -> dict:
        return {
            "forwards": self.forwards,
            "tokens": self.tokens,
            "rows_fed": self.rows_fed,
            "tokens_per_forward": self.tokens_per_forward,
            "p_cache": self.p_cache,
            "accepted_drafts": self.accepted_drafts,
            "rejected_drafts": self.rejected_drafts,
            "accepted_context_drafts": self.accepted_context_drafts,
            "rejected_context_drafts": self.rejected_context_drafts,
            "forced_tokens": self.forced_tokens,
            "constrained_tokens": self.constrained_tokens,
            "acceptance_rate": self.acceptance_rate,
        }


@dataclass
class DecodingSettings:
    """How one row decodes: its `WeDLMDecodingConfig` options (defaults there) and its own budget, sampler and
    stops. Rows with different settings share a batch."""

    max_new_tokens: int
    window_size: int = WeDLMDecodingConfig.window_size
    entropy_threshold: float | None = WeDLMDecodingConfig.entropy_threshold
    pos_penalty_factor: float = WeDLMDecodingConfig.pos_penalty_factor
    lossless: bool = WeDLMDecodingConfig.lossless
    sampler: FillSampler = field(default_factory=FillSampler)
    stop_ids: frozenset[int] = frozenset()
    context_drafts: bool = WeDLMDecodingConfig.context_drafts
    context_ngram: int = WeDLMDecodingConfig.context_ngram
    keep_logits: bool = False  # record, for each committed token, the AR logits of its position (`row.logits`)

    @classmethod
    def of(cls, options: WeDLMDecodingConfig, **row) -> "DecodingSettings":
        """A row's settings from checked options and the row's own fields (`max_new_tokens`, `sampler`, ...)."""
        return cls(**asdict(options), **row)


@dataclass(eq=False)
class Fill:
    """A filled window slot. `final`: AR's own token, committed by the next forward without a check (lossless mode's
    final token; under a grammar, the draw that takes a failed sampled guess's place). `q` / `verifiable`: for
    sampled drafts in lossless mode (see `draft_verification.judge_draft`). `source`: "model" (a fill by the entropy
    rule), "context" (copied from the context; its q is a point mass), "forced" (the row's grammar allows nothing
    else; a point mass too) or "constrained" (chosen among the tokens the grammar allows, from the AR logits of the
    slot after the committed text). `guess`: an unconfident choice under a grammar, placed before a fixed string
    (`_worth_a_guess`); it commits only as AR's own choice there would (`_commit_valid`)."""

    token: int
    final: bool = False
    q: torch.Tensor | None = None
    verifiable: bool = True
    source: str = "model"
    guess: bool = False


@dataclass(eq=False)
class DecodingRow:
    """One sequence: its prompt, committed tokens, window (`None` = mask) and settings."""

    index: int
    prompt: list[int]
    settings: DecodingSettings
    generated: list[int] = field(default_factory=list)
    window: list[Fill | None] = field(default_factory=list)
    stats: WeDLMStats = field(default_factory=WeDLMStats)
    done: bool = False
    finish_reason: str | None = None  # "stop" (a stop token), "length", or what the caller passed to `finish`
    kv: list | None = None  # the finished row's cache, kept only when the decoder was asked to
    prompt_fed: int = 0  # prompt tokens already in the cache (a long prompt may be prefilled over several steps)
    # Lossless mode: how many drafts of each source to try, adapted to how many get accepted.
    model_window: DraftWindow = field(default_factory=lambda: DraftWindow(smallest=2, size=2))
    context_window: ContextWindow = field(default_factory=ContextWindow)
    context: ContextIndex | None = None  # lossless mode: where each committed token occurs
    # keep_logits: per generated token, the model's AR logits at its position (given the committed text before it);
    # `next_logits` are those of the slot after the committed text, `step_logits` this step's run rows' (row i:
    # slot i + 1's), of which the commit takes one per token.
    logits: list = field(default_factory=list)
    next_logits: torch.Tensor | None = None
    step_logits: torch.Tensor | list | None = None
    _taken: int = 0
    prefix: list | None = None  # K/V of the prompt's first tokens from elsewhere (a prefix cache), loaded on joining
    grammar: object | None = None  # the row's grammar state (`grammar_commit`), at the end of its committed text

    @property
    def prefilled(self) -> bool:
        return self.prompt_fed == len(self.prompt)

    @property
    def committed(self) -> int:
        """Logical length P: prompt plus committed tokens."""
        return len(self.prompt) + len(self.generated)

    @property
    def tracks_logits(self) -> bool:
        """Whether the row follows the AR logits of the slot after its committed text (`next_logits`)."""
        return self.settings.keep_logits or self.grammar is not None

    def leading_run(self) -> int:
        run = 0
        while run < len(self.window) and self.window[run] is not None:
            run += 1
        return run

    def own_drafts(self) -> int:
        """The model's own drafts (grammar-restricted or not) in the leading run, after the final token."""
        return sum(slot.source in OWN_SOURCES for slot in self.window[1 : self.leading_run()])

    def unfed_end(self) -> int:
        """1 where lossless mode need not feed the window's last slot: the window is one filled run that ends the
        row there (a stop token, or the budget's last token). Its row's logits would predict past the end and its
        K/V would never be read, while the row before it verifies it all the same; else 0."""
        run = len(self.window)
        if not self.settings.lossless or not self.prefilled or run < 2 or self.leading_run() != run:
            return 0
        room = self.settings.max_new_tokens - len(self.generated)
        return int(self.window[-1].token in self.settings.stop_ids or run == room)

    def settled(self) -> list[int]:
        """The window's tokens after the committed text that no later step changes: the next forward commits them
        (it only writes their K/V). They are the default mode's leading run of fills (up to a stop token and the
        budget) and lossless mode's final token; none under a grammar, whose check comes at the commit. A server
        can stream them one step early, as an AR server streams a token before its K/V exist."""
        if self.done or self.grammar is not None or not self.prefilled:
            return []
        room = self.settings.max_new_tokens - len(self.generated)
        tokens = []
        for slot in self.window[: min(self.leading_run(), room)]:
            if self.settings.lossless and not slot.final:
                break
            tokens.append(slot.token)
            if slot.token in self.settings.stop_ids:
                break
        return tokens

    def refill(self) -> None:
        """Appends masks so W slots remain after this step's commit, within the token budget and never after a
        filled stop token."""
        stop_ids = self.settings.stop_ids
        size = self.settings.window_size
        if self.settings.lossless:  # drafts past the adapted window are dropped: the output does not depend on them
            stop = next((i for i, slot in enumerate(self.window) if slot is not None and slot.token in stop_ids), None)
            if stop is not None:  # a draft past a stop token could only commit if the text went on after it
                del self.window[stop + 1 :]
            size = min(size, self.model_window.size if self.prefilled else JOIN_MASKS)
            run = self.leading_run()
            if self.prefilled and self.model_window.held is None and size:
                # Before the first check, the fills of the joining row's masks say how easy the text is (each
                # passed the entropy rule): the window (unless it rests) is what their holding would make it, so
                # easy text does not spend a forward growing it.
                size = min(self.settings.window_size, max(size, GROWTH * self.own_drafts()))
            if self.grammar is not None and self.prefilled and run > 1 and self.window[run - 1].source == "forced":
                # After a grammar's fixed string the next token is AR's own; the mask after it drafts the token
                # after that (e.g. the separator after a one-token value), and the grammar's next fixed string
                # then follows it without a forward of its own.
                size = max(size, 2)
            if size < 2 and self.prefilled:  # the slot after the final token is always taken by the next one
                size = 0
            del self.window[size + self.leading_run() :]
        if any(slot is not None and slot.token in stop_ids for slot in self.window):
            return
        if self.settings.lossless and self.settings.context_drafts and self.prefilled:
            # While the model's own last drafts all held (counting, copying), only a long match is copied: a wrong
            # context draft would displace good model drafts. After a joining row's unchecked drafts, only a match
            # through all of them and the final token (or a long one): the drafts are then a copy of the context
            # themselves, and the copy goes on with it; where only their tail matches (the digits of a number),
            # they have already left the text it would copy. Once they failed (code), a copy continues the final
            # token in place of their unverified drafts, which would stand before it and could take it down with
            # them. A step that drafts from the context adds no masks after its drafts: their rows would cost as
            # much as the drafts, for guesses drawn with unverified drafts in view.
            held = self.model_window.held
            shortest = LONG_MATCH if held else 1
            if held is None and self.own_drafts():
                shortest = min(self.leading_run(), LONG_MATCH)
            if self.draft_from_context(shortest, replace_model_drafts=held is False):
                size = 0
        room = self.settings.max_new_tokens - len(self.generated) - len(self.window)
        wanted = size + self.leading_run() - len(self.window)
        self.window.extend([None] * max(0, min(wanted, room)))

    def draft_from_context(self, shortest: int = 1, replace_model_drafts: bool = False) -> bool:
        """Fills the masks right after the leading run with the tokens that followed the latest earlier occurrence
        of the text's suffix (at most COPY_TOKENS and W of them, within the token budget, up to a stop token, and
        under a grammar up to the first token it rejects); they are verified with the run in the next forward;
        nothing while the context source rests, nor for a match shorter than `shortest` tokens (LONG_MATCH: long).
        A continuation that contradicts one of the model's own fills on its way is dropped whole: the model is
        confident there, and a rejected context draft would discard its fills. With `replace_model_drafts` the copy
        continues the run before the model's first draft (the final token, and tokens a grammar forces) and, if
        there is one, takes the place of everything after it. Returns whether a copy was placed."""
        run = self.leading_run()
        if replace_model_drafts:  # the run up to the model's first draft (a grammar's forced tokens stay)
            run = next((i for i in range(1, run) if self.window[i].source in OWN_SOURCES), run)
        pending = [slot.token for slot in self.window[:run]]
        stop_ids = self.settings.stop_ids
        if not run or any(token in stop_ids for token in pending):
            return False
        committed = self.prompt + self.generated
        if self.context is None:
            self.context = ContextIndex()
        self.context.extend(committed[self.context.length :])
        room = self.settings.max_new_tokens - len(self.generated) - run
        limit = min(self.settings.window_size, COPY_TOKENS, room)
        drafts, length = self.context.lookup(committed + pending, self.settings.context_ngram, limit)
        if length < shortest:
            return False
        del drafts[self.context_window.size :]  # nothing while the source rests
        for i, token in enumerate(drafts):
            if token in stop_ids:
                del drafts[i + 1 :]
                break
        if self.grammar is not None:  # a draft the grammar rejects is one AR under it never chooses
            del drafts[max(0, valid_prefix(self.grammar, pending + drafts, stop_ids) - run) :]
        if not drafts:
            return False
        window = self.window
        if replace_model_drafts:
            del window[run:]
        model_fills = [(window[run + i], token) for i, token in enumerate(drafts) if run + i < len(window)]
        if any(fill is not None and fill.token != token for fill, token in model_fills):
            return False
        for i, token in enumerate(drafts):
            slot = run + i
            if slot == len(window):
                window.append(Fill(token, source="context"))
            elif window[slot] is None:
                window[slot] = Fill(token, source="context")
        return True

    def commit(self, count: int) -> int:
        """Moves the first `count` window tokens into the committed text, stopping at a stop token or the budget;
        returns how many were kept."""
        kept = 0
        for slot in self.window[:count]:
            self.generated.append(slot.token)
            if self.tracks_logits:
                self._take_logits()
            self.stats.forced_tokens += slot.source == "forced"
            self.stats.constrained_tokens += slot.source == "constrained"
            kept += 1
            if slot.token in self.settings.stop_ids:
                self.done, self.finish_reason = True, "stop"
            elif len(self.generated) >= self.settings.max_new_tokens:
                self.done, self.finish_reason = True, "length"
            if self.done:
                break
        if self.grammar is not None:
            new = self.generated[len(self.generated) - kept :]
            self.grammar.advance([token for token in new if token not in self.settings.stop_ids])
        self.window = self.window[kept:]
        self.stats.tokens += kept
        return kept

    def _take_logits(self) -> None:
        """The token just committed was predicted by `next_logits`; the next one by its own row's, if computed (a
        grammar row without keep_logits gets only the rows its commit can use: `_logit_slots`)."""
        if self.settings.keep_logits:
            if self.next_logits is None:
                raise RuntimeError("A committed token has no AR logits: this is a bug in wedlm_hf.")
            self.logits.append(self.next_logits)
        rows = self.step_logits
        self.next_logits = rows[self._taken] if rows is not None and self._taken < len(rows) else None
        self._taken += 1


class StreamingDecoder:
    """The WeDLM decoding loop: rows that join and leave at any step share one cache, one forward per `step()`.

    It runs under `generate_wedlm` (generate's front: arguments, checks, output) and under `wedlm-hf serve`.

    add(prompt, settings) -> row joins at the next step; step() -> the rows that committed or finished;
    finish(row, keep) ends a row early (a stopping criterion, a cancelled request).

    `cache`: an empty DynamicCache to decode on (one is made when None), or a `SlotCache` for static shapes
    (docs/algorithm.md section 3.j).

    `token_budget` bounds the token rows one forward feeds (batch x width, padding included): a joining prompt
    that would widen the forward past it is prefilled in chunks over several steps, its window joining with the
    last chunk. The budget is soft by at most one window per row: every step feeds every decoding row's window.
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
        self.kv = cache if isinstance(cache, SlotCache) else RaggedCache(model, 0, max_dead=16, cache=cache)
        self.active: list[DecodingRow] = []
        self._joining: list[DecodingRow] = []
        self._count = 0

    def add(
        self, prompt: list[int], settings: DecodingSettings, prefix: list | None = None, grammar=None
    ) -> DecodingRow:
        """A row that joins at the next step. `prefix`: per layer, (heads, n, head_dim) K/V of the prompt's first n
        tokens (n < len(prompt), computed by this model at positions 0..n-1), which the row then does not feed.
        `grammar`: a fresh grammar state (`grammar_commit`) the row's generated text must match."""
        if not prompt:
            raise ValueError("Every prompt needs at least one token.")
        cached = prefix[0][0].shape[1] if prefix else 0
        if cached >= len(prompt):
            raise ValueError("A cached prefix must leave at least the prompt's last token to feed.")
        row = DecodingRow(
            index=self._count, prompt=list(prompt), settings=settings, prefix=prefix or None, grammar=grammar
        )
        row.prompt_fed = cached
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
        if not row.done:
            row.done, row.finish_reason = True, reason
        if row in self.active:
            self._retire([row])
        elif row.kv is not None:
            row.kv = _truncated(row.kv, row.committed)

    def row_cache(self, row: DecodingRow, length: int) -> list:
        """An active row's committed K/V (per layer, (heads, tokens, head_dim)), its first `length` tokens."""
        return _truncated(self.kv.row_kv(self.active.index(row)), length)

    def _prompt_chunk(self, row: DecodingRow, cap: int | None) -> tuple[int, bool]:
        """How many prompt tokens `row` feeds this step, and whether its window joins them (the last chunk). The
        last chunk always holds the prompt's last token: its row predicts the first slot (lossless mode)."""
        remaining = len(row.prompt) - row.prompt_fed
        if remaining == 0:
            return 0, True
        if cap is None or remaining + len(row.window) <= cap or remaining == 1:
            return remaining, True
        return min(remaining - 1, cap), False

    @torch.no_grad()
    def step(self) -> list[DecodingRow]:
        """One forward for every active row and every row that joined since the last step (never under autograd)."""
        joining, self._joining = self._joining, []
        if joining:
            self.kv.add_rows(len(joining))
            self.active += joining
            prefixes = {b: row.prefix for b, row in enumerate(self.active) if row.prefix is not None}
            if prefixes:
                self.kv.load_prefixes(prefixes)
                for b in prefixes:
                    self.active[b].prefix = None
        rows = self.active
        if not rows:
            return []
        self.kv.max_dead = max(16, max(row.settings.window_size for row in rows))
        for row in rows:
            row.refill()
        cap = None
        if self.token_budget is not None:
            decoding = max((len(row.window) for row in rows if row.prefilled), default=0)
            cap = max(decoding, self.token_budget // len(rows), 1)

        # Per row: [its prompt (chunk), if it joins now][filled slots][padding][masks]. Masks last, so that the kept
        # logits are the tail; filled slots right after what the row has in the cache, so that the leading run is
        # fed in logical order. A joining row's prompt takes the columns other rows use for their windows: the feed
        # is as wide as the widest row, not prompt plus window. A prompt chunk that is not the last feeds no window.
        feeds, starts, decodes = [], [], []
        for row in rows:
            start, decode = self._prompt_chunk(row, cap)
            base = row.committed
            window = row.window[: len(row.window) - row.unfed_end()] if decode else []
            filled = [(slot.token, base + i) for i, slot in enumerate(window) if slot is not None]
            masks = [base + i for i, slot in enumerate(window) if slot is None]
            feeds.append((filled, masks))
            starts.append(start)  # where the row's filled slots begin
            decodes.append(decode)
        prefill = any(starts)
        width = self.kv.feed_width(max(start + len(f) + len(m) for start, (f, m) in zip(starts, feeds)), prefill)
        ids, pos, valid, runs = [], [], [], []
        for row, start, decode, (filled, masks) in zip(rows, starts, decodes, feeds):
            prompt = row.prompt[row.prompt_fed : row.prompt_fed + start]
            gap = width - start - len(filled) - len(masks)
            ids.append(prompt + [t for t, _ in filled] + [self.mask_token_id] * (gap + len(masks)))
            pos.append(list(range(row.prompt_fed, row.prompt_fed + start)) + [p for _, p in filled] + [0] * gap + masks)
            valid.append([True] * (start + len(filled)) + [False] * gap + [True] * len(masks))
            if decode:
                row.stats.forwards += 1
                row.stats.rows_fed += len(filled) + len(masks)
            runs.append(row.leading_run() if decode else 0)

        # Logits for the masks, and in lossless mode for the run (it verifies itself) or, for a joining row, for its
        # last prompt token (its AR prediction is the first slot's token).
        n_masks = max(len(m) for _, m in feeds)
        ar_columns, sparse = {}, {}
        for b, (row, run, start, decode) in enumerate(zip(rows, runs, starts, decodes)):
            if (row.settings.lossless or row.tracks_logits) and decode:
                # A joining row's last prompt token predicts slot 0; each fed run row the slot after it.
                slots = range(min(run, len(feeds[b][0])))
                if row.grammar is not None and not (row.settings.lossless or row.settings.keep_logits or start):
                    slots = sparse[b] = _logit_slots(row, run)
                ar_columns[b] = ([start - 1] if start else []) + [start + j for j in slots]
        wanted = set(range(width - n_masks, width)).union(*ar_columns.values())
        columns = sorted(wanted) or [width - 1]
        device = self.kv.device
        logits = self.kv.forward(
            torch.tensor(ids, device=device),
            torch.tensor(pos, device=device),
            torch.tensor(valid, device=device),
            columns,
            prefill,
        )
        column = {c: j for j, c in enumerate(columns)}

        ar_rows = {b: [column[c] for c in cs] for b, cs in ar_columns.items()}
        for b, cs in ar_rows.items():
            row = rows[b]
            if row.tracks_logits:
                own = logits[b, cs]
                if starts[b]:  # a joining row's last prompt token predicts slot 0
                    row.next_logits, row.step_logits, row._taken = own[0], own[1:], 0
                elif b in sparse:  # run slot j's row at step_logits[j], None where not computed
                    row.step_logits, row._taken = [None] * runs[b], 0
                    for j, logits_j in zip(sparse[b], own):
                        row.step_logits[j] = logits_j
                else:
                    row.step_logits, row._taken = own, 0
            if row.grammar is not None and row.settings.lossless:
                _restrict_to_grammar(row, logits[b], cs, runs[b], bool(starts[b]))
        predictions = _ar_predictions(rows, logits, {b: cs for b, cs in ar_rows.items() if rows[b].settings.lossless})
        kept, stale = [], {}  # stale: rows whose masks all saw a guess that failed
        for b, (row, run, start, decode) in enumerate(zip(rows, runs, starts, decodes)):
            if not decode:
                kept.append(0)
            elif row.settings.lossless:
                kept.append(self._verify_and_commit(row, run, predictions[b]))
            elif row.grammar is not None:
                count, stale[b] = _commit_valid(row, run)
                kept.append(count)
            else:
                kept.append(row.commit(run))
            row.prompt_fed += start
        # A joining row keeps its prompt (the first columns it was fed); every row keeps its committed run. Where
        # every row ends here and no cache is returned, the rows' columns are dropped next, not cropped first.
        if self.keep_cache or not all(row.done for row in rows):
            self.kv.keep_leading(width, [start + min(n, len(f)) for start, n, (f, _) in zip(starts, kept, feeds)])

        mask_logits = logits[:, len(columns) - n_masks :]  # the mask columns are the widest n_masks, all of them kept
        feeds = [(filled, [] if stale.get(b) else masks) for b, (filled, masks) in enumerate(feeds)]
        grammar_rows = [b for b, (row, d) in enumerate(zip(rows, decodes)) if d and row.grammar is not None]
        # Lossless mode always drafts a row's leftmost mask: where the grammar rejects that draft, its logits choose
        # among the tokens the grammar allows.
        lossless_masks = {
            b: _open_masks(rows[b], feeds[b][1], n_masks) for b in grammar_rows if rows[b].settings.lossless
        }
        if n_masks:
            self._fill(rows, feeds, mask_logits)
        for b in grammar_rows:
            row = rows[b]
            if not row.done:
                masks = lossless_masks[b] if row.settings.lossless else _open_masks(row, feeds[b][1], n_masks)
                _constrain_window(row, {slot: mask_logits[b, c] for c, slot in masks})
        for b, decode in enumerate(decodes):
            if decode and not rows[b].done:
                _commit_ending(rows[b])
        finished = [row for row in rows if row.done]
        if finished:
            self._retire(finished)
        if self.active:
            self.kv.compact_if_needed()
        return [row for row, n in zip(rows, kept) if n or row.done]

    def _verify_and_commit(self, row: DecodingRow, run: int, ar: ArPredictions) -> int:
        """Lossless commit. `ar` holds the AR predictions for window slots 1..run (for a new row: 0..run). Slot 0
        is the final token placed last step; each later draft commits only if AR agrees, and the AR token after the
        last accepted one becomes the next final token (at a rejection, in the draft's place, with every later fill
        discarded)."""
        settings = row.settings
        first = 0 if not row.prefilled else 1
        if row.prefilled and (run == 0 or not row.window[0].final):
            raise RuntimeError("Lossless decoding lost its final token: this is a bug in wedlm_hf.")
        accepted, replacement, room = first, None, settings.max_new_tokens - len(row.generated)
        ends = any(slot.token in settings.stop_ids for slot in row.window[:first]) or first >= room
        rejected = False
        checked = {"model": 0, "context": 0, "forced": 0, "constrained": 0}
        rejected_by = None
        if not ends:
            for i in range(first, run):
                slot = row.window[i]
                replacement = ar.judge(i - first, slot)
                context = slot.source == "context"
                checked[slot.source] += 1
                if replacement is not None:
                    row.stats.rejected_drafts += 1
                    row.stats.rejected_context_drafts += context
                    rejected, rejected_by = True, slot.source
                    break
                row.stats.accepted_drafts += 1
                row.stats.accepted_context_drafts += context
                accepted += 1
                if slot.token in settings.stop_ids or accepted >= room:
                    ends = True
                    break
            else:
                replacement = ar.own_token(run - first)
        own = sum(checked[source] for source in OWN_SOURCES)
        row.context_window.update(settings.window_size, checked["context"], rejected_by == "context")
        copying = settings.context_drafts and row.context_window.trying  # a resting model source waits meanwhile
        row.model_window.update(settings.window_size, own, rejected_by in OWN_SOURCES, paused=copying)
        kept = row.commit(accepted)
        if row.done or ends or replacement is None:
            return kept
        if replacement in settings.stop_ids or len(row.generated) + 1 >= settings.max_new_tokens:
            # The row's last token: AR's own choice needs no confirming forward, and like plain `generate` the
            # cache never holds the last token's K/V.
            row.window = [Fill(replacement, final=True)]
            row.commit(1)
            return kept
        if row.window:
            row.window[0] = Fill(replacement, final=True)
            if rejected:  # every later fill was drawn with the rejected draft in view
                row.window[1:] = [None] * (len(row.window) - 1)
        else:
            row.window.append(Fill(replacement, final=True))
        return kept

    def _fill(self, rows: list[DecodingRow], feeds: list, mask_logits: torch.Tensor) -> None:
        """Fills masks by the entropy rule from this forward's mask logits (rows' masks are right-aligned). Only
        the chosen slots are sampled, each row's in slot order: what a row draws never depends on other rows."""
        n_masks = mask_logits.shape[1]
        scores = suppress_token(mask_logits, self.mask_token_id)
        entropies = entropy(scores).tolist()
        chosen = []  # (batch row, mask column, window slot)
        for b, row in enumerate(rows):
            masks = feeds[b][1]
            if row.done or not masks:
                continue
            open_slots = _open_masks(row, masks, n_masks)
            if not open_slots:
                continue
            picks = choose_fills(
                [entropies[b][c] for c, _ in open_slots],
                [slot for _, slot in open_slots],
                row.settings.entropy_threshold,
                row.settings.pos_penalty_factor,
            )
            if row.settings.lossless and 0 not in picks:  # the leftmost mask is the next draft a verification reaches
                picks = [0, *picks]
            chosen += [(b, *open_slots[i]) for i in picks]
        tokens, probabilities = _sample(rows, scores, chosen)
        for (b, _, slot), token, q in zip(chosen, tokens, probabilities):
            rows[b].window[slot] = Fill(token, q=q)
        for b, _, slot in chosen:
            row = rows[b]
            if row.settings.lossless and row.settings.sampler.do_sample:
                row.window[slot].verifiable = all(s is not None for s in row.window[:slot])

    def _retire(self, finished: list[DecodingRow]) -> None:
        leaving = {id(row) for row in finished}
        positions = [i for i, row in enumerate(self.active) if id(row) in leaving]
        if self.keep_cache:
            for i in positions:
                self.active[i].kv = _truncated(self.kv.row_kv(i), self.active[i].committed)
        survivors = [i for i, row in enumerate(self.active) if id(row) not in leaving]
        self.active = [self.active[i] for i in survivors]
        self.kv.select_rows(survivors)


MAX_FORCED = 64  # forced tokens placed per step and row, beyond the window (a grammar's fixed string)
GUESS_PROBABILITY = 0.3  # a guess's least probability under its mask (restricted); at 0 failed guesses cost more


def _restrict_to_grammar(row: DecodingRow, logits: torch.Tensor, columns: list[int], run: int, joining: bool) -> None:
    """Lossless mode: the row's AR rows (`columns` of its (columns, vocab) `logits`) restricted in place to what its
    grammar allows after the window slots before each, so AR's own choices are AR + grammar's. Only rows after
    valid slots are used: a slot the grammar rejects is one AR (restricted) never chooses, so verification rejects
    it there."""
    grammar, stop_ids = row.grammar, row.settings.stop_ids
    tokens = [slot.token for slot in row.window[:run]]
    tokens = tokens[: valid_prefix(grammar, tokens, stop_ids)]
    tokens = tokens[: next((i for i, t in enumerate(tokens) if t in stop_ids), len(tokens))]
    allowed = allowed_along(grammar, tokens, stop_ids)
    if joining:  # its first AR row, the prompt's last token, predicts slot 0
        allowed = [allowed_tokens(grammar, stop_ids), *allowed]
    for column, mask in zip(columns, allowed):
        if mask.any():  # where nothing is allowed (complete, no stop token) the row ends before this choice counts
            logits[column] = restrict(logits[column], mask)


def _commit_valid(row: DecodingRow, run: int) -> tuple[int, bool]:
    """Default mode: commits the run's leading tokens that the grammar accepts, up to a guess that AR's restricted
    choice there (from the row before it, fed this step) does not confirm; the first fill it rejects and every fill
    after it become masks again. Returns how many committed, and whether a guess failed (every mask of the step saw
    it, so none of their fills is kept).

    A guess stands where default mode would put AR's restricted choice one forward later: greedy, the argmax; in a
    sampled row, a draw from the warped restricted distribution p. A sampled row keeps the guess g with probability
    p(g) and otherwise draws from p without g, and that draw takes the guess's slot for the next forward (`final`,
    kept by `_constrain_window`): the slot's token is then distributed as p, as if no guess had been made."""
    tokens = [slot.token for slot in row.window[:run]]
    stop_ids, sampler = row.settings.stop_ids, row.settings.sampler
    valid = valid_prefix(row.grammar, tokens, stop_ids)
    failed, carried = False, None
    for i in [i for i in range(1, valid) if row.window[i].guess]:
        row.grammar.advance(tokens[:i])  # only the guess's own slot needs the grammar's allowed tokens
        allowed = allowed_tokens(row.grammar, stop_ids)
        row.grammar.rollback(i)
        scores = restrict(row.step_logits[i - 1].float(), allowed)[None]
        if sampler.do_sample:  # a guess is a point-mass draft: kept with probability p(g), else p without g
            p = sampler.probabilities(scores)
            ar = ArPredictions(sampler, [], p, [sampler.uniform(p.device)])
        else:
            ar = ArPredictions(sampler, greedy(scores).tolist())
        replacement = ar.judge(0, row.window[i])
        if replacement is None:
            continue
        valid, failed = i, True
        carried = replacement if sampler.do_sample else None
        break
    if valid < run:
        row.window[valid:] = [None] * (len(row.window) - valid)
    count = row.commit(valid)
    if carried is not None and count == valid and not row.done:
        row.window[0] = Fill(carried, final=True, source="constrained")
    return count, failed


def _commit_ending(row: DecodingRow) -> int:
    """Commits the window through the row's end now, where the next forward would commit just those tokens and
    need nothing after them: the run reaches a stop token or the budget, and no forward can change a token of it.
    In default mode that is any run without a guess (under a grammar, every token of it valid); in lossless mode,
    the final token and tokens a grammar forces after it (AR under the grammar has no other choice there). That
    forward would only write K/V nobody reads, so these tokens have none in the cache, as a lossless row's last
    token has none. Not with keep_logits, whose logits come from that forward. Returns how many committed."""
    settings = row.settings
    if settings.keep_logits or not row.prefilled:
        return 0
    run = row.leading_run()
    if settings.lossless:  # the final token, then what the grammar forces
        if not run or not row.window[0].final:
            return 0
        run = next((i for i in range(1, run) if row.window[i].source != "forced"), run)
    tokens = [slot.token for slot in row.window[:run]]
    stop = next((i + 1 for i, token in enumerate(tokens) if token in settings.stop_ids), None)
    room = settings.max_new_tokens - len(row.generated)
    end = stop if stop is not None else room if run >= room else 0
    if not end or any(slot.guess for slot in row.window[:end]):
        return 0
    if row.grammar is not None and valid_prefix(row.grammar, tokens[:end], settings.stop_ids) < end:
        return 0
    return row.commit(end)


def _logit_slots(row: DecodingRow, run: int) -> list[int]:
    """Default mode under a grammar: the run slots whose rows' AR logits the commit can use (row j predicts slot
    j + 1). Those before each guess, which check it, and that of the last token the grammar accepts, which
    predicts the slot after the commit. A commit ends at a failed guess or there (`_commit_valid`), so no other row
    is read; with a vocabulary of 10^5 tokens, each skipped row is a sizeable product saved."""
    tokens = [slot.token for slot in row.window[:run]]
    valid = valid_prefix(row.grammar, tokens, row.settings.stop_ids)
    slots = {i - 1 for i in range(1, valid) if row.window[i].guess}
    return sorted(slots | ({valid - 1} if valid else set()))


def _open_masks(row: DecodingRow, masks: list[int], n_masks: int) -> list[tuple[int, int]]:
    """(mask column, window slot) of the masks fed this step that are still masks (lossless mode may have placed
    its final token on one; a commit moves the slots). Masks are right-aligned in the step's mask columns."""
    first = n_masks - len(masks)
    return [
        (first + j, p - row.committed)
        for j, p in enumerate(masks)
        if 0 <= p - row.committed < len(row.window) and row.window[p - row.committed] is None
    ]


def _constrain_window(row: DecodingRow, mask_logits: dict[int, torch.Tensor]) -> None:
    """After a step's commit and fills, walks the window from the committed text on while the grammar's state is
    known: tokens it forces are filled without the model (a whole fixed string when it allows only one); a fill it
    rejects is replaced; an open slot is filled with the model's choice among the tokens it allows, where that
    choice is confident (restricted entropy under the threshold) and always at the slot right after the committed
    text (default mode: its AR logits), so the next forward commits at least one token. One unconfident choice a
    step may stand as a guess (`_worth_a_guess`), which commits only as AR's own choice there would
    (`_commit_valid`). Lossless mode starts after slot 0, AR's own token (chosen restricted already); there every
    fill is a draft the next forward verifies, and a sampled row's open slots are left to the model (their drafts
    need the distribution they were drawn from)."""
    settings, grammar, window, stop_ids = row.settings, row.grammar, row.window, row.settings.stop_ids
    slot = consumed = 0
    if settings.lossless:
        if not window or not window[0].final or window[0].token in stop_ids:
            return
        if not allowed_tokens(grammar, stop_ids).any():  # complete, no stop token: AR's token there is no choice
            row.window.clear()
            row.done, row.finish_reason = True, "stop"
            return
        grammar.advance([window[0].token])
        if not allowed_tokens(grammar, stop_ids).any():  # AR's token completes it and no stop token is set
            grammar.rollback(1)
            row.commit(1)
            row.done, row.finish_reason = True, row.finish_reason or "stop"
            return
        slot = consumed = 1
    elif window and window[0] is not None and not window[0].final:  # a fill from this step's masks: AR's
        window[0] = None  # restricted choice is better (a `final` one is AR's, drawn where a sampled guess failed)
    room = settings.max_new_tokens - len(row.generated)
    limit = min(room, settings.window_size + slot)  # fills beyond W are never made; forced tokens cost no guess
    guessed = False
    while slot < limit:
        forced = grammar.forced()[: min(room, slot + MAX_FORCED) - slot]
        limit = min(room, max(limit, slot + len(forced)))
        for token in forced:
            if slot == len(window):
                window.append(None)
            if window[slot] is None or window[slot].token != token:
                window[slot] = Fill(token, source="forced")
            grammar.advance([token])
            slot, consumed = slot + 1, consumed + 1
        if forced:
            continue
        fill = window[slot] if slot < len(window) else None
        if fill is not None:
            if fill.token in stop_ids:
                if grammar.accepting():
                    break
            elif grammar.accepted([fill.token]) == 1:
                grammar.advance([fill.token])
                slot, consumed = slot + 1, consumed + 1
                continue
            window[slot] = None
        first = slot == 0
        allowed = allowed_tokens(grammar, stop_ids)
        if not allowed.any():  # complete, and no stop token is set: the text ends here (a fill before it commits)
            if first:
                row.done, row.finish_reason = True, "stop"
            break
        only = allowed.nonzero()[:2, 0].tolist()
        if len(only) == 1:  # one token allowed (a stop where the text is complete): no guess needed
            if slot == len(window):
                window.append(None)
            window[slot] = Fill(only[0], source="forced")
            if only[0] in stop_ids:
                break
            grammar.advance(only)
            slot, consumed = slot + 1, consumed + 1
            continue
        scores = row.next_logits if first else mask_logits.get(slot)
        if first and scores is None and not settings.lossless:
            raise RuntimeError("The slot after the committed text has no AR logits: this is a bug in wedlm_hf.")
        if scores is None or (settings.lossless and settings.sampler.do_sample):
            break
        restricted = restrict(scores.float()[None], allowed)
        threshold = settings.entropy_threshold
        guess = not first and (threshold is None or float(entropy(restricted)[0]) >= threshold)
        if guess:
            probabilities = torch.softmax(restricted[0], dim=-1)
            token = int(probabilities.argmax())
            if guessed or not _worth_a_guess(row, grammar, token, float(probabilities[token])):
                break
            guessed = True
        else:
            token = int(settings.sampler(restricted)[0])
        if slot == len(window):
            window.append(None)
        window[slot] = Fill(token, source="constrained", guess=guess)
        if token in stop_ids:
            break
        grammar.advance([token])
        slot, consumed = slot + 1, consumed + 1
    grammar.rollback(consumed)


def _worth_a_guess(row: DecodingRow, grammar, token: int, probability: float) -> bool:
    """Whether an unconfident choice (`token`, the restricted argmax of its mask, with that `probability`) is placed
    as a guess. Only where the grammar forces a fixed string after it (a separator and the next key, or a closing
    brace): the forward that checks the guess against AR's own choice then also feeds
    that string and the masks after it, which reach the next value. A guess that fails costs its rows and that
    step's mask fills, so a long shot (under GUESS_PROBABILITY) is not placed. (In lossless mode a guess is a
    draft like any other; default mode checks guesses in `_commit_valid`.)"""
    if token in row.settings.stop_ids or probability < GUESS_PROBABILITY:
        return False
    grammar.advance([token])
    forces = bool(grammar.forced())
    grammar.rollback(1)
    return forces


def _ar_predictions(rows: list[DecodingRow], logits: torch.Tensor, ar_rows: dict[int, list[int]]) -> dict:
    """`ArPredictions` for every lossless row, computed in one pass per sampler (argmax, or the warped
    distributions with one fresh draw and one uniform per position, used only where needed)."""
    predictions, groups, top = {}, {}, None
    for b in ar_rows:
        groups.setdefault(id(rows[b].settings.sampler), []).append(b)
    for members in groups.values():
        sampler = rows[members[0]].settings.sampler
        if sampler.do_sample:
            sizes = [len(ar_rows[b]) for b in members]
            block = logits[[b for b in members for _ in ar_rows[b]], [c for b in members for c in ar_rows[b]]]
            probs = sampler.probabilities(block)
            fresh = sampler.draw(probs).tolist()
            uniforms = torch.rand(len(fresh), generator=sampler.generator, device=probs.device).tolist()
            parts = zip(probs.split(sizes), _split(fresh, sizes), _split(uniforms, sizes))
            for b, (p, f, u) in zip(members, parts):
                predictions[b] = ArPredictions(sampler, f, p, u)
        else:  # the argmax of every column at once costs less than gathering the rows first
            top = greedy(logits).tolist() if top is None else top
            for b in members:
                predictions[b] = ArPredictions(sampler, [top[b][c] for c in ar_rows[b]])
    return predictions


def _split(values: list, sizes: list[int]) -> list[list]:
    out, start = [], 0
    for n in sizes:
        out.append(values[start : start + n])
        start += n
    return out


def _sample(rows: list[DecodingRow], scores: torch.Tensor, chosen: list[tuple[int, int, int]]) -> tuple[list, list]:
    """Tokens for the chosen (row, column, slot) masks, drawn by each row's sampler (rows sharing one sampler draw
    together, in `chosen`'s order), and the distribution each was drawn from where lossless sampling needs it."""
    tokens: list = [None] * len(chosen)
    probabilities: list = [None] * len(chosen)
    groups: dict[int, list[int]] = {}
    top = None
    for k, (b, _, _) in enumerate(chosen):
        groups.setdefault(id(rows[b].settings.sampler), []).append(k)
    for members in groups.values():
        sampler = rows[chosen[members[0]][0]].settings.sampler
        if sampler.do_sample:
            probs = sampler.probabilities(scores[[chosen[k][0] for k in members], [chosen[k][1] for k in members]])
            drawn = sampler.draw(probs).tolist()
            for i, k in enumerate(members):
                if rows[chosen[k][0]].settings.lossless:
                    probabilities[k] = probs[i]
        else:  # as in `_ar_predictions`: every column's argmax, then the chosen ones
            top = greedy(scores).tolist() if top is None else top
            drawn = [top[chosen[k][0]][chosen[k][1]] for k in members]
        for i, k in enumerate(members):
            tokens[k] = drawn[i]
    return tokens, probabilities


def _truncated(kv: list, length: int) -> list:
    """A row's per-layer (heads, tokens, dim) K/V cut to its first `length` tokens."""
    return [(k[:, :length], v[:, :length]) for k, v in kv]
