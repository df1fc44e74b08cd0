"""Structured output at commit (docs/algorithm.md section 3.l): a row's grammar checks the text as it commits.

The committed text grows left to right, so a grammar can judge every commit: fills it rejects become masks again,
the first open slot after the committed text is filled from the tokens it allows, and tokens it forces are filled
without the model. The core needs only this of a row's grammar state (`wedlm_hf.structured` implements it with
llguidance; any object with these methods works):

    accepted(tokens) -> int      how many leading tokens it accepts from the current state (never stop tokens)
    advance(tokens)              consumes accepted tokens
    rollback(n)                  un-consumes the last n
    forced() -> list[int]        the tokens of the fixed string it forces next (empty when none is forced)
    allowed() -> BoolTensor      (vocab,) the tokens it allows next, stop tokens excluded
    accepting() -> bool          the text so far is complete: a stop token may follow

Stop tokens are the decoder's business, not the grammar's: one may commit only where the grammar accepts. A grammar
(what `generate(grammar=...)` is given, compiled) is anything with `matcher()`, which returns a fresh state.
"""

from functools import lru_cache
from importlib.metadata import entry_points

import torch
from transformers import LogitsProcessor, LogitsProcessorList

# A package that compiles grammar specs (JSON schemas, regular expressions, grammars) registers a function here:
# compile(spec, tokenizer, vocab_size) -> grammar. wedlm-hf's own `structured` wing does, with llguidance.
COMPILER_GROUP = "wedlm_hf.grammar_compilers"


def compile_grammar(spec, tokenizer, vocab_size: int):
    """A compiled grammar for `spec`: itself when it is one already, else the registered compiler's result."""
    if hasattr(spec, "matcher"):
        return spec
    compilers = _compilers()
    if not compilers:
        raise ValueError(
            "grammar= takes a JSON schema, regular expression or grammar only where wedlm-hf is installed with "
            "its grammar extra: pip install 'wedlm-hf[grammar]' (or pass a compiled grammar object)."
        )
    return compilers[0](spec, tokenizer, vocab_size)


@lru_cache(maxsize=1)
def _compilers() -> list:
    """The registered compilers, loaded once (reading the installed packages' metadata takes milliseconds)."""
    return [ep.load() for ep in sorted(entry_points(group=COMPILER_GROUP), key=lambda ep: ep.name)]


def valid_prefix(grammar, tokens: list[int], stop_ids: frozenset[int]) -> int:
    """How many leading `tokens` may commit: those the grammar accepts, and a stop token only where it accepts."""
    stop = next((i for i, token in enumerate(tokens) if token in stop_ids), len(tokens))
    valid = grammar.accepted(tokens[:stop]) if stop else 0
    if valid < stop or stop == len(tokens):
        return valid
    grammar.advance(tokens[:stop])
    complete = grammar.accepting()
    grammar.rollback(stop)
    return stop + 1 if complete else stop


def allowed_tokens(grammar, stop_ids: frozenset[int]) -> torch.Tensor:
    """(vocab,) bool: what may follow the grammar's current state, stop tokens included where it accepts."""
    allowed = grammar.allowed().clone()
    if stop_ids and grammar.accepting():
        allowed[list(stop_ids)] = True
    return allowed


def allowed_along(grammar, tokens: list[int], stop_ids: frozenset[int]) -> list[torch.Tensor]:
    """`allowed_tokens` after each of `tokens` (all valid), consumed one by one, then rolled back."""
    out = []
    for token in tokens:
        grammar.advance([token])
        out.append(allowed_tokens(grammar, stop_ids))
    if tokens:
        grammar.rollback(len(tokens))
    return out


def restrict(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """`logits` (..., vocab) with every token outside `allowed` at -inf (a new tensor)."""
    return logits.masked_fill(~allowed.to(logits.device), float("-inf"))


class GrammarLogitsProcessor(LogitsProcessor):
    """Restricts each row's next token to what its grammar allows (stop tokens only where it is complete): the
    grammar for AR `generate()`, which lossless WeDLM decoding under the same grammar equals.

    `grammar`: one spec or compiled grammar for every row, or a list with one per row (None: free text), as
    `generate(grammar=...)` takes them; `tokenizer` compiles specs. `eos_token_id`: the stop tokens (the
    tokenizer's by default). A processor holds its rows' states: make one per `generate` call.
    """

    def __init__(self, grammar, tokenizer=None, eos_token_id: int | list[int] | None = None, vocab_size=None):
        specs = grammar if isinstance(grammar, list) else [grammar]
        if vocab_size is None and tokenizer is not None:
            vocab_size = len(tokenizer)
        self._grammars = [None if s is None else compile_grammar(s, tokenizer, vocab_size) for s in specs]
        self._per_row = isinstance(grammar, list)
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = tokenizer.eos_token_id
        if eos_token_id is None:
            raise ValueError("GrammarLogitsProcessor needs the stop tokens: pass eos_token_id= or tokenizer=.")
        self.stop_ids = frozenset([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id)
        self._states = None
        self._ended: list[bool] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._states is None:
            grammars = self._grammars if self._per_row else self._grammars * len(input_ids)
            if len(grammars) != len(input_ids):
                raise ValueError(f"GrammarLogitsProcessor has {len(grammars)} grammars for {len(input_ids)} rows.")
            self._states = [None if g is None else g.matcher() for g in grammars]
            self._ended = [False] * len(input_ids)
        else:
            for b, state in enumerate(self._states):
                token = int(input_ids[b, -1])
                if state is None or self._ended[b]:
                    continue
                if token in self.stop_ids:
                    self._ended[b] = True
                else:
                    state.advance([token])
        allowed = torch.ones(scores.shape, dtype=torch.bool)
        for b, state in enumerate(self._states):
            if state is not None and not self._ended[b]:
                own = allowed_tokens(state, self.stop_ids)[: scores.shape[-1]]
                allowed[b] = False
                allowed[b, : len(own)] = own
        return scores.masked_fill(~allowed.to(scores.device), float("-inf"))  # a new tensor, as processors return


def with_grammar(model, grammar, kwargs: dict) -> dict:
    """AR `generate()`'s kwargs with `grammar` added as a `GrammarLogitsProcessor` (stop tokens: the call's
    `eos_token_id`, else the generation config's; a per-row list repeated for `num_return_sequences`)."""
    config = kwargs.get("generation_config") or model.generation_config
    eos = kwargs.get("eos_token_id", getattr(config, "eos_token_id", None))
    if eos is None:
        raise ValueError("grammar= in AR decoding needs the stop tokens a complete text ends with: set eos_token_id.")
    copies = kwargs.get("num_return_sequences", getattr(config, "num_return_sequences", None)) or 1
    if isinstance(grammar, list):
        grammar = [g for g in grammar for _ in range(copies)]
    vocab = model.config.get_text_config().vocab_size
    processor = GrammarLogitsProcessor(grammar, kwargs.get("tokenizer"), eos, vocab)
    return {**kwargs, "logits_processor": LogitsProcessorList([*(kwargs.get("logits_processor") or []), processor])}
