"""Specs (JSON schemas, regular expressions, Lark/EBNF grammars) compiled with llguidance, and the per-row state the
decoder checks commits against (`wedlm_hf.modeling.grammar_commit` names the methods it needs).

llguidance, over xgrammar and outlines-core: one 3 MB wheel with no dependencies (xgrammar pulls in triton), it
compiles a JSON schema in about a millisecond with no per-vocabulary precomputation, computes a mask in tens of
microseconds on a CPU, covers JSON schemas, regular expressions and context-free grammars (outlines-core: no
grammars), and answers exactly the questions commit-time checking asks: how many of these tokens are valid
(`validate_tokens`), which tokens are forced (`compute_ff_tokens`), and rollback.
"""

import json
import re
import threading
import weakref
from collections import OrderedDict

import torch

KINDS = ("json_schema", "regex", "lark", "ebnf")
# JSON is written as json.dumps writes it: no free whitespace, so forced separators fill without the model and
# every value has one spelling. A schema's "x-guidance" entry overrides these (llguidance's JSON options).
JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHE_SIZE = 256  # compiled grammars kept, by (tokenizer, vocabulary, kind, text); specs refused, by the same key
# Forced tokens consumed by the check a fresh matcher gets at compile time (a JSON value's opening, its first key).
FIRST_ADVANCE = 256
_SHIFTS = torch.arange(32, dtype=torch.int32)
_compiled: OrderedDict = OrderedDict()
_lock = threading.Lock()  # the server compiles in worker threads
_tokenizers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _llguidance():
    try:
        import llguidance
        import llguidance.hf
    except ImportError:
        raise ImportError("Structured output needs llguidance: pip install 'wedlm-hf[grammar]'.") from None
    return llguidance


class GrammarError(ValueError):
    """The grammar failed while decoding: llguidance stopped in an error state (a resource limit, such as a
    recursive schema whose forced text never ends). `reason`: the library's first line."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


def _limits():
    """The library's default resource limits, with errors on one line (no parser-state dump: it would reach logs
    and clients)."""
    return _llguidance().LLParserLimits(verbose_errors=False)


class GrammarState:
    """One row's position in its grammar (the decoder's view of an llguidance matcher). Stop tokens are not its
    business: `allowed()` and `forced()` leave out the tokenizer's end-of-text tokens, and the decoder lets a stop
    token commit only where `accepting()`. llguidance never raises for a grammar's own failure (a resource limit):
    its matcher enters an error state, which every method here turns into a `GrammarError`."""

    def __init__(self, matcher, vocab_size: int, end_tokens: list[int], tokenizer=None):
        self._matcher = matcher
        self.vocab_size = vocab_size
        self._end = end_tokens
        self._tokenizer = tokenizer  # llguidance's, to spell out forced bytes

    def _checked(self, result):
        if self._matcher.is_error():
            reason = _first_line(self._matcher.get_error())
            raise GrammarError(f"The grammar failed while decoding: {reason}", reason)
        return result

    def accepted(self, tokens: list[int]) -> int:
        end = next((i for i, token in enumerate(tokens) if token in self._end), len(tokens))
        return self._checked(self._matcher.validate_tokens(tokens[:end]) if end else 0)

    def advance(self, tokens: list[int]) -> None:
        if tokens and not self._matcher.consume_tokens(tokens):
            self._checked(None)
            raise GrammarError("The grammar refused tokens it had accepted.")

    def rollback(self, count: int) -> None:
        if count and not self._matcher.rollback(count):
            self._checked(None)
            raise GrammarError(f"The grammar could not roll back {count} tokens.")

    def forced(self) -> list[int]:
        """The grammar's forced string as tokens: llguidance's forced tokens (those no continuation can re-split),
        then the rest of the forced bytes as the tokenizer spells them, as far as the grammar accepts them (a
        fixed string is filled whole, though what follows might have merged with its last token)."""
        tokens = self._checked(self._matcher.compute_ff_tokens())
        end = next((i for i, token in enumerate(tokens) if token in self._end), len(tokens))
        tokens = tokens[:end]
        if self._tokenizer is not None:
            forced = self._checked(self._matcher.compute_ff_bytes())
            done = len(self._tokenizer.decode_bytes(tokens))
            if len(forced) > done:
                tokens = tokens + self._tokenizer.tokenize_bytes(forced[done:])
                tokens = tokens[: self._checked(self._matcher.validate_tokens(tokens))]
        return tokens

    def allowed(self) -> torch.Tensor:
        words = torch.frombuffer(bytearray(self._checked(self._matcher.compute_bitmask())), dtype=torch.int32)
        bits = ((words[:, None] >> _SHIFTS) & 1).flatten().bool()
        allowed = torch.zeros(self.vocab_size, dtype=torch.bool)
        allowed[: min(len(bits), self.vocab_size)] = bits[: self.vocab_size]
        allowed[self._end] = False
        return allowed

    def accepting(self) -> bool:
        return self._checked(self._matcher.is_accepting())


class Grammar:
    """A grammar compiled for one tokenizer and vocabulary, what `generate(grammar=...)` and the server decode
    under: `matcher()` gives each row a fresh `GrammarState`. Make one with `compile_grammar` (cached by spec)."""

    def __init__(self, template, vocab_size: int, end_tokens: list[int], kind: str, source: str, tokenizer=None):
        self._template = template
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.end_tokens = end_tokens
        self.kind = kind
        self.source = source

    def matcher(self) -> GrammarState:
        return GrammarState(self._template.deep_copy(), self.vocab_size, self.end_tokens, self._tokenizer)

    def __repr__(self) -> str:
        text = self.source if len(self.source) <= 60 else self.source[:57] + "..."
        return f"Grammar({self.kind}: {text})"


def parse_spec(spec) -> tuple[str, str]:
    """(kind, text) for a grammar spec: a JSON schema (dict, or its JSON text) or a (kind, text) pair."""
    if isinstance(spec, dict):
        return "json_schema", json.dumps(spec)
    if isinstance(spec, str):
        try:
            schema = json.loads(spec)
        except ValueError:
            schema = None
        if isinstance(schema, dict):
            return "json_schema", json.dumps(schema)
        raise ValueError(
            "A string grammar= must be a JSON schema (the JSON text of an object); for a regular expression pass "
            "('regex', pattern), for a grammar ('lark', text) or ('ebnf', text)."
        )
    if isinstance(spec, tuple) and len(spec) == 2 and spec[0] in KINDS:
        kind, text = spec
        if kind == "json_schema":
            return parse_spec(text)
        if not isinstance(text, str) or not text:
            raise ValueError(f"grammar=({kind!r}, ...) takes the {kind} as a non-empty string, got {text!r}.")
        return kind, text
    raise ValueError(
        f"grammar= takes a JSON schema (dict or JSON text), a pair (kind, text) with kind one of {', '.join(KINDS)}, "
        f"a compiled Grammar or an llguidance.LLMatcher; got {spec!r}."
    )


def compile_grammar(spec, tokenizer=None, vocab_size: int | None = None, keep: bool = True) -> Grammar:
    """`spec` compiled for `tokenizer` (a fast Hugging Face tokenizer) and a model vocabulary of `vocab_size` (the
    tokenizer's size by default). Raises ValueError naming what the library cannot compile. Cached by spec;
    `keep=False` compiles past the cache and leaves it as it was (a check that should not displace what others
    use)."""
    if isinstance(spec, Grammar):
        return spec
    llguidance = _llguidance()
    if isinstance(spec, llguidance.LLMatcher):
        return _from_matcher(spec, tokenizer, vocab_size)
    kind, text = parse_spec(spec)
    if tokenizer is None:
        raise ValueError("grammar= needs the tokenizer to compile a schema, regex or grammar: pass tokenizer=...")
    with _lock:
        ll_tokenizer = _ll_tokenizer(tokenizer)
        vocab_size = _vocab_size(ll_tokenizer, vocab_size)
        key = (id(ll_tokenizer), vocab_size, kind, text)
        if keep and key in _compiled:
            _compiled.move_to_end(key)
            found = _compiled[key]
            if isinstance(found, str):  # refused before: the same words, without compiling again
                raise ValueError(found)
            return found
    try:
        grammar = _compile(llguidance, ll_tokenizer, vocab_size, kind, text)
    except ValueError as error:
        grammar = str(error)  # the words only: the exception's traceback would keep its frames alive
    if keep:
        with _lock:
            _compiled[key] = grammar
            if len(_compiled) > CACHE_SIZE:
                _compiled.popitem(last=False)
    if isinstance(grammar, str):
        raise ValueError(grammar)
    return grammar


def _compile(llguidance, ll_tokenizer, vocab_size: int, kind: str, text: str) -> Grammar:
    definition = _definition(llguidance.LLMatcher, kind, text)
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(definition, ll_tokenizer)
    if failed:
        raise ValueError(f"grammar= ({kind}) cannot be compiled: {_one_line(messages[0])}")
    template = llguidance.LLMatcher(ll_tokenizer, definition, log_level=0, limits=_limits())
    if template.is_error():
        raise ValueError(f"grammar= ({kind}) cannot be compiled: {_one_line(template.get_error())}")
    grammar = Grammar(template, vocab_size, list(ll_tokenizer.eos_tokens), kind, text, ll_tokenizer)
    _first_advance(grammar)
    return grammar


def _first_advance(grammar: Grammar) -> None:
    """Refuses a grammar that no text can complete from its start (a schema that is only a `$ref` cycle: it
    compiles, then allows nothing), or whose first forced text already breaks the library's limits (a required
    property that contains its own schema forces `{"a": {"a": ...` without end). What can only fail later, after
    the model's own choices, fails that row while decoding (`GrammarError`)."""
    state = grammar.matcher()
    what = f"grammar= ({grammar.kind})"
    try:
        state.advance(state.forced()[:FIRST_ADVANCE])
    except GrammarError as error:
        raise ValueError(f"{what} cannot be decoded: {error.reason}") from None
    try:
        reason, empty = "", not state.accepting() and not state.allowed().any()
    except GrammarError as error:  # llguidance's words for "no token can extend this"
        reason, empty = f" (llguidance: {error.reason})", True
    if empty:
        raise ValueError(
            f"{what} admits no text{reason}: nothing may come first and the empty text is not complete, as for a "
            "schema that is only a $ref cycle; give a schema that some value matches."
        )


def _definition(matcher_type, kind: str, text: str) -> str:
    try:
        if kind == "json_schema":
            return matcher_type.grammar_from_json_schema(text, defaults=JSON_DEFAULTS)
        if kind == "regex":
            return matcher_type.grammar_from_regex(text)
        if kind == "lark":
            return matcher_type.grammar_from_lark(text)
        from llguidance import grammar_from

        return grammar_from("ebnf", text)
    except ValueError as error:
        raise ValueError(f"grammar= ({kind}) cannot be compiled: {_one_line(str(error))}") from None


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else "unknown error"


def _one_line(message: str) -> str:
    """llguidance's error on one line: without the source line it echoes and the caret under it."""
    lines = (line.strip() for line in message.splitlines())
    return " ".join(line for line in lines if line and not set(line) <= {"^"} and not re.match(r"\d+ \| ", line))


def _from_matcher(matcher, tokenizer, vocab_size: int | None) -> Grammar:
    """An llguidance matcher given as is: its state is copied and rewound for each row."""
    if matcher.is_error():
        raise ValueError(f"grammar=: this llguidance.LLMatcher is in an error state: {matcher.get_error()}")
    if vocab_size is None and tokenizer is None:
        raise ValueError("grammar= with an llguidance.LLMatcher needs the vocabulary size or the tokenizer.")
    template = matcher.deep_copy()
    template.reset()
    end = [tokenizer.eos_token_id] if tokenizer is not None and tokenizer.eos_token_id is not None else []
    return Grammar(template, vocab_size or len(tokenizer), end, "llguidance", "LLMatcher")


def _ll_tokenizer(tokenizer):
    """llguidance's view of a fast Hugging Face tokenizer, made once per tokenizer object."""
    try:
        return _tokenizers[tokenizer]
    except (KeyError, TypeError):
        pass
    llguidance = _llguidance()
    try:
        made = llguidance.hf.from_tokenizer(tokenizer)
    except ValueError:  # a tokenizer llguidance cannot read from its JSON: spelled out token by token
        made = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_SpelledTokenizer(tokenizer)))
    try:
        _tokenizers[tokenizer] = made
    except TypeError:
        pass
    return made


class _SpelledTokenizer:
    """What llguidance's generic tokenizer wrapper reads: each token's bytes (its text decoded alone), the special
    tokens, and encoding."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self.special_token_ids = list(tokenizer.all_special_ids)
        special = set(self.special_token_ids)
        self.tokens = [
            b"\xff" + str(i).encode() if i in special else tokenizer.decode([i]).encode() for i in range(len(tokenizer))
        ]

    def __call__(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False)


def _vocab_size(ll_tokenizer, vocab_size: int | None) -> int:
    if vocab_size is None:
        return ll_tokenizer.vocab_size
    if ll_tokenizer.vocab_size > vocab_size:
        raise ValueError(
            f"The tokenizer has {ll_tokenizer.vocab_size} tokens but the model's vocabulary only {vocab_size}: "
            "pass the model's own tokenizer."
        )
    return vocab_size
