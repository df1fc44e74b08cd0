"""Structured output: JSON schemas, regular expressions and grammars, compiled with llguidance.

`generate(strategy="wedlm", grammar=..., tokenizer=...)` takes a spec and compiles it here (this package registers
`compile_grammar` with the core; docs/structured-output.md); `GrammarLogitsProcessor` enforces the same grammar in
AR `generate()`.
"""

from .grammars import Grammar, GrammarState, compile_grammar
from .logits_processor import GrammarLogitsProcessor

__all__ = ["Grammar", "GrammarLogitsProcessor", "GrammarState", "compile_grammar"]
