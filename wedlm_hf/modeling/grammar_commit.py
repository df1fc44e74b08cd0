"""Structured output at commit (docs/algorithm.md section 3.l): a row's grammar checks the text as it commits.

The committed text grows left to right, so a grammar can judge every commit: fills it rejects become masks again,
the first open slot after the committed text is filled from the tokens it allows, and tokens it forces are filled
without the model. The core needs only this of a row's grammar state (`wedlm_hf.structured` implements it with
llguidance; any object with these methods works):

    accepted(tokens) -> int      how many leading tokens it accepts from the current state (never stop tokens)
    advance(tokens)              consumes accepted tokens
    rollback(n)                  un-consumes the last n
    forced() -> list[int]        the tokens it forces next (empty when more than one continuation is allowed)
    allowed() -> BoolTensor      (vocab,) the tokens it allows next, stop tokens excluded
    accepting() -> bool          the text so far is complete: a stop token may follow

Stop tokens are the decoder's business, not the grammar's: one may commit only where the grammar accepts. A grammar
(what `generate(grammar=...)` is given, compiled) is anything with `matcher()`, which returns a fresh state.
"""

from functools import lru_cache
from importlib.metadata import entry_points

import torch

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
