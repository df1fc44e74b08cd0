"""Structured output: JSON schemas, regular expressions and grammars, compiled with llguidance.

`generate(strategy="wedlm", grammar=..., tokenizer=...)` takes a spec and compiles it here (this package registers
`compile_grammar` with the core; docs/structured-output.md); `GrammarLogitsProcessor` (the core's) enforces the same
grammar in AR `generate()`, which also takes `grammar=` itself.
"""

from ..modeling.grammar_commit import GrammarLogitsProcessor
from .grammars import Grammar, GrammarError, GrammarState, compile_grammar

__all__ = ["Grammar", "GrammarError", "GrammarLogitsProcessor", "GrammarState", "compile_grammar"]
