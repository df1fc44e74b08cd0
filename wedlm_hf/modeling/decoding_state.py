"""A sequence's decoding state: its settings, committed text, window of slots and statistics.

A row (one sequence) keeps a window of slots after its committed length P: `None` for a mask, or a `Fill`, a token
placed but not yet committed. The step (`streaming_decoder`) feeds the window, a commit rule (`commit_rules`) moves
its leading filled run into the committed text through `DecodingRow.commit`, and the fill (`batch_fill`) and the
refill (`window_refill`) place new tokens and masks. Nothing here reads a tensor.
"""

from dataclasses import asdict, dataclass, field

import torch

from .context_ids import ContextIds, row_contexts
from .decoding_config import WeDLMDecodingConfig
from .draft_windows import ContextWindow, DraftWindow
from .processor_contexts import Contexts
from .window_filling import FillSampler

OWN_SOURCES = ("model", "constrained")  # a Fill's sources that are the model's own drafts (grammar-restricted or not)


@dataclass
class WeDLMStats:
    """Per-row decoding statistics: decoding forwards, committed tokens, window rows fed (prompt rows, prefilled
    in the first forward, are not counted) and drafts accepted or rejected by verification (lossless mode's, and
    the default mode's unsure fills and copies), of which `*_context_drafts` were copied from the context (the rest
    are the model's own fills). Under a grammar,
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
        """Accepted / verified drafts; None when no draft was verified."""
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

    def __post_init__(self):
        self.stop_ids = frozenset(self.stop_ids)  # any iterable of ids; a set is what the step's checks take

    @classmethod
    def of(cls, options: WeDLMDecodingConfig, **row) -> "DecodingSettings":
        """A row's settings from checked options and the row's own fields (`max_new_tokens`, `sampler`, ...)."""
        return cls(**asdict(options), **row)


@dataclass(eq=False, slots=True)
class Fill:
    """A filled window slot. `final`: AR's own token, committed by the next forward without a check (lossless mode's
    final token; under a grammar, the draw that takes a failed sampled guess's place). `q` / `verifiable`: for
    sampled drafts in lossless mode (see `ArPredictions.judge`). `source`: "model" (a fill by the entropy
    rule), "context" (copied from the context; its q is a point mass), "forced" (the row's grammar allows nothing
    else; a point mass too) or "constrained" (chosen among the tokens the grammar allows, from the AR logits of the
    slot after the committed text). `confident`: a model fill whose adjusted entropy passed the threshold (not the
    fill rule's fallback). `guess`: an unconfident choice under a grammar, placed before a fixed string
    (`grammar_hook.worth_a_guess`); it commits only as AR's own choice there would (`commit_valid`)."""

    token: int
    final: bool = False
    q: "torch.Tensor | tuple[torch.Tensor, int] | None" = None
    verifiable: bool = True
    source: str = "model"
    guess: bool = False
    confident: bool = False

    def distribution(self) -> torch.Tensor | None:
        """q as a tensor. A fill drawn with others holds (their block, its row) until q is read: taking the row is an
        operator a fill would otherwise cost whether or not anything reads it, and most are never read (every fill
        a default row trusts)."""
        q = self.q
        if type(q) is tuple:
            q = self.q = q[0][q[1]]
        return q


@dataclass(eq=False)
class DecodingRow:
    """One sequence: its prompt, committed tokens, window (`None` = mask) and settings. Its settings and grammar
    are fixed once it is built: what they make of the row (`verifies`, `tracks_logits`), asked of every row in every
    phase, is worked out then."""

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
    # Lossless mode: the state of its draft sources (`draft_sources`): how many drafts of each to try, adapted to
    # how many get accepted, and the index its context copies look up.
    model_window: DraftWindow = field(default_factory=lambda: DraftWindow(smallest=2, size=2))
    context_window: ContextWindow = field(default_factory=ContextWindow)
    unsure_fill_held: bool | None = None  # the default mode's last unconfident fill AR judged: kept (None: none yet)
    context: object | None = None  # a `ContextIndex` of where each committed token occurs (context drafts)
    # A forward of more rows costs next to nothing more (an accelerator): a default row's masks stay W (3.m).
    free_width: bool = False
    # keep_logits: per generated token, the model's AR logits at its position (given the committed text before it);
    # `next_logits` are those of the slot after the committed text, `step_logits` this step's run rows' (row i:
    # slot i + 1's), of which the commit takes one per token.
    logits: list = field(default_factory=list)
    # keep_logits in default mode: per generated token, the distribution its fill was drawn from at its masked slot
    # (None where it was not drawn: greedy, forced, copied), which `output_scores` gives for that position.
    draws: list = field(default_factory=list)
    next_logits: torch.Tensor | None = None
    step_logits: torch.Tensor | list | None = None
    _taken: int = 0
    prefix: list | None = None  # K/V of the prompt's first tokens from elsewhere (a prefix cache), loaded on joining
    grammar: object | None = None  # the row's grammar state (`grammar_commit`), at the end of its committed text
    padding: list[int] = field(default_factory=list)  # the batch's left padding before the prompt, as AR sees it
    context_ids: ContextIds | None = None  # the batch's ids that context-reading processors read (`context_ids`)
    # verifies: whether the row keeps AR's own token in its first slot and verifies drafts (docs/algorithm.md 3.m
    # and 6): lossless mode, and the default mode that drafts from the context (without a grammar, whose rows keep
    # the paper's rule with the grammar's checks).
    verifies: bool = field(init=False)
    # tracks_logits: whether it follows the AR logits of the slot after its committed text (`next_logits`).
    tracks_logits: bool = field(init=False)

    def __post_init__(self):
        settings = self.settings
        self.verifies = settings.lossless or (settings.context_drafts and self.grammar is None)
        self.tracks_logits = settings.keep_logits or self.grammar is not None

    @property
    def prefilled(self) -> bool:
        return self.prompt_fed == len(self.prompt)

    @property
    def committed(self) -> int:
        """Logical length P: prompt plus committed tokens."""
        return len(self.prompt) + len(self.generated)

    def trusts(self, slot: Fill) -> bool:
        """Whether `slot` commits without a check: a verifying default-mode row's own confident fills, which the
        entropy rule chose under its threshold (the paper's rule); its fallback fill, drafts from elsewhere, and
        every draft in lossless mode, are judged by AR."""
        return not self.settings.lossless and slot.source in OWN_SOURCES and slot.confident

    def judged_own(self, slot: Fill) -> bool:
        """Whether `slot` is one of the model's own drafts that AR judges: every one in lossless mode, a verifying
        default-mode row's unsure fills."""
        return slot.source in OWN_SOURCES and not self.trusts(slot)

    def trusted_slots(self, start: int, end: int) -> list[bool]:
        """For each filled slot start..end-1, whether it commits unchecked (`trusts`): one pass over the run, not
        a call per slot."""
        if self.settings.lossless:
            return [False] * max(0, end - start)
        return [slot.confident and slot.source in OWN_SOURCES for slot in self.window[start:end]]

    def first_untrusted(self, start: int, end: int) -> int:
        """The first of the filled slots start..end-1 that does not commit unchecked (`trusts`), else `end`."""
        trusted = self.trusted_slots(start, end)
        return start + trusted.index(False) if False in trusted else end

    def first_judged_own(self, start: int, end: int) -> int:
        """The first of the filled slots start..end-1 that is one of the model's own drafts AR judges
        (`judged_own`), else `end`."""
        lossless = self.settings.lossless
        judged = [slot.source in OWN_SOURCES and (lossless or not slot.confident) for slot in self.window[start:end]]
        return start + judged.index(True) if True in judged else end

    def leading_run(self) -> int:
        """The filled slots before the window's first mask."""
        window = self.window
        return window.index(None) if None in window else len(window)

    def contexts(self, slots: list[int], device) -> Contexts:
        """For context-reading logits processors: the token ids before each window slot in `slots`, as AR `generate`
        hands them to its processors there (left padding, prompt, committed text, then the window's tokens before the
        slot, all of which must be filled): prefixes of the batch's ids (`context_ids`)."""
        return row_contexts([(self, slots)], device)

    def own_drafts(self) -> int:
        """The model's own drafts (grammar-restricted or not) in the leading run, after the final token."""
        return sum(slot.source in OWN_SOURCES for slot in self.window[1 : self.leading_run()])

    def unfed_end(self) -> int:
        """1 where lossless mode need not feed the window's last slot: the window is one filled run that ends the
        row there (a stop token, or the budget's last token). Its row's logits would predict past the end and its
        K/V would never be read, while the row before it verifies it all the same; else 0."""
        run = len(self.window)
        if run < 2 or None in self.window or not self.verifies or not self.prefilled:  # a mask: not one filled run
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
        end = min(self.leading_run(), self.settings.max_new_tokens - len(self.generated))
        if self.verifies and end:  # a draft commits only where AR agrees
            end = self.first_untrusted(1 if self.window[0].final else 0, end)
        tokens = [slot.token for slot in self.window[:end]]
        stop_ids = self.settings.stop_ids
        if not stop_ids.isdisjoint(tokens):
            del tokens[next(i for i, token in enumerate(tokens) if token in stop_ids) + 1 :]
        return tokens

    def commit(self, count: int) -> int:
        """Moves the first `count` window tokens into the committed text, stopping after a stop token or at the
        budget; returns how many were kept."""
        tokens = [slot.token for slot in self.window[:count]]
        settings = self.settings
        # The first token that ends the row: a stop token, or the one that fills the budget (a stop token first).
        kept = stop = len(tokens)
        if not settings.stop_ids.isdisjoint(tokens):
            stop = next(i for i, token in enumerate(tokens) if token in settings.stop_ids)
        last = settings.max_new_tokens - len(self.generated) - 1  # the index of the budget's last token
        end = stop if stop < last else max(last, 0)
        if end < kept:
            del tokens[end + 1 :]
            self.done, self.finish_reason = True, "stop" if end == stop else "length"
            kept = end + 1
        if settings.keep_logits or self.grammar is not None:  # `tracks_logits`
            for _ in tokens:
                self._take_logits()
        if settings.keep_logits and not settings.lossless:
            self.draws += [slot.distribution() for slot in self.window[:kept]]
        self.generated += tokens
        if self.grammar is not None:
            for slot in self.window[:kept]:
                self.stats.forced_tokens += slot.source == "forced"
                self.stats.constrained_tokens += slot.source == "constrained"
            self.grammar.advance([token for token in tokens if token not in settings.stop_ids])
        del self.window[:kept]
        self.stats.tokens += kept
        return kept

    def _take_logits(self) -> None:
        """The token just committed was predicted by `next_logits`; the next one by its own row's, if computed (a
        grammar row without keep_logits gets only the rows its commit can use: `grammar_hook.logit_slots`)."""
        if self.settings.keep_logits:
            if self.next_logits is None:
                raise RuntimeError("A committed token has no AR logits: this is a bug in wedlm_hf.")
            self.logits.append(self.next_logits)
        rows = self.step_logits
        self.next_logits = rows[self._taken] if rows is not None and self._taken < len(rows) else None
        self._taken += 1
