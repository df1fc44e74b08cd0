"""Grammar specs the library cannot compile, or that are given wrongly, are refused before decoding, by name."""

import sys

import pytest
from conftest import EOS_ID

from wedlm_hf.structured import Grammar, GrammarError, compile_grammar
from wedlm_hf.structured.grammars import _ll_tokenizer

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def wedlm(model, char_tokenizer, **kwargs):
    inputs = char_tokenizer(["x"], return_tensors="pt")
    return model.generate(**inputs, strategy="wedlm", max_new_tokens=8, eos_token_id=EOS_ID, **kwargs)


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"type": "strin"}, r"\(json_schema\) cannot be compiled: .*strin"),
        ({"type": "string", "format": "zzz"}, r"cannot be compiled: .*format"),
        ("[a-z]+", r"\('regex', pattern\)"),
        (("xml", "<a/>"), "kind one of json_schema, regex, lark, ebnf"),
        (("regex", "(unclosed"), r"\(regex\) cannot be compiled"),
        (("lark", "start: missing_rule"), r"\(lark\) cannot be compiled"),
        (("regex", ""), "non-empty string"),
        (42, "grammar= takes a JSON schema"),
    ],
)
def test_bad_specs_are_refused_by_name(model64, char_tokenizer, spec, message):
    with pytest.raises(ValueError, match=message):
        wedlm(model64, char_tokenizer, grammar=spec, tokenizer=char_tokenizer)


@pytest.mark.parametrize("spec", [("regex", "(["), ("lark", "start: ("), {"type": "string", "pattern": "(["}])
def test_a_compile_error_is_one_line(char_tokenizer, spec):
    """llguidance echoes the source with a caret under it; the error keeps the message, on one line."""
    with pytest.raises(ValueError) as error:
        compile_grammar(spec, char_tokenizer)
    assert "cannot be compiled: " in str(error.value) and "\n" not in str(error.value) and "^" not in str(error.value)


def test_misuse_is_refused(model64, char_tokenizer):
    with pytest.raises(ValueError, match="pass tokenizer="):
        wedlm(model64, char_tokenizer, grammar=SCHEMA)
    with pytest.raises(ValueError, match="one grammar \\(or None\\) per prompt: got 2 for 1"):
        wedlm(model64, char_tokenizer, grammar=[SCHEMA, None], tokenizer=char_tokenizer)
    inputs = char_tokenizer(["x"], return_tensors="pt")
    with pytest.raises(ValueError, match="pass tokenizer="):  # AR decoding takes grammar= too, on the same terms
        model64.generate(**inputs, max_new_tokens=4, grammar=SCHEMA, eos_token_id=EOS_ID)
    with pytest.raises(ValueError, match="needs the stop tokens a complete text ends with: set eos_token_id"):
        model64.generate(**inputs, max_new_tokens=4, grammar=SCHEMA, tokenizer=char_tokenizer, eos_token_id=None)
    with pytest.raises(ValueError, match="vocabulary only 50"):
        compile_grammar(SCHEMA, char_tokenizer, vocab_size=50)


def test_without_llguidance_the_error_names_the_extra(model64, char_tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)
    with pytest.raises(ImportError, match=r"pip install 'wedlm-hf\[grammar\]'"):
        wedlm(model64, char_tokenizer, grammar=SCHEMA, tokenizer=char_tokenizer)


def test_without_a_registered_compiler_the_core_names_the_extra(model64, char_tokenizer, monkeypatch):
    from wedlm_hf.modeling import grammar_commit

    monkeypatch.setattr(grammar_commit, "entry_points", lambda group: [])
    grammar_commit._compilers.cache_clear()
    monkeypatch.setattr(grammar_commit, "_compilers", grammar_commit._compilers.__wrapped__)
    with pytest.raises(ValueError, match=r"pip install 'wedlm-hf\[grammar\]'"):
        wedlm(model64, char_tokenizer, grammar=SCHEMA, tokenizer=char_tokenizer)
    # A compiled grammar needs no compiler.
    compiled = compile_grammar(SCHEMA, char_tokenizer, 96)
    assert wedlm(model64, char_tokenizer, grammar=compiled).shape[1] > 1


def test_compiled_grammars_are_cached_and_an_llguidance_matcher_is_taken_as_is(model64, char_tokenizer):
    import llguidance

    first = compile_grammar(SCHEMA, char_tokenizer, 96)
    assert compile_grammar(dict(SCHEMA), char_tokenizer, 96) is first
    assert isinstance(first, Grammar) and "json_schema" in repr(first)
    ll_tokenizer = _ll_tokenizer(char_tokenizer)  # the one compile_grammar made for this tokenizer
    matcher = llguidance.LLMatcher(ll_tokenizer, llguidance.LLMatcher.grammar_from_regex("(yes|no)"), log_level=0)
    out = wedlm(model64, char_tokenizer, grammar=matcher, tokenizer=char_tokenizer, return_dict_in_generate=True)
    text = char_tokenizer.decode(out.sequences[0, 1:].tolist()).split("<eos>")[0]
    assert text in ("yes", "no")
    assert matcher.compute_ff_tokens() == [] and not matcher.is_accepting()  # the caller's matcher is not moved


def test_a_grammar_that_is_complete_without_a_stop_token_ends_the_row(model64, char_tokenizer):
    inputs = char_tokenizer(["x"], return_tensors="pt")
    for lossless, do_sample in ((False, False), (True, False), (False, True), (True, True)):
        out = model64.generate(
            **inputs,
            do_sample=do_sample,
            strategy="wedlm",
            max_new_tokens=20,
            eos_token_id=None,
            pad_token_id=EOS_ID,
            grammar=("regex", "a[bc]d"),
            tokenizer=char_tokenizer,
            wedlm_lossless=lossless,
        )
        assert char_tokenizer.decode(out[0, 1:].tolist()) in ("abd", "acd")


# A property whose schema contains itself: once reached, the grammar forces `{"a": {"a": ...` without end.
SELF_CONTAINED = {"type": "object", "properties": {"a": {"$ref": "#/$defs/R"}}, "required": ["a"]}
DEFS = {"$defs": {"R": SELF_CONTAINED}}


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"$ref": "#"}, "admits no text"),
        ({"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}, "admits no text"),
        ({**SELF_CONTAINED, **DEFS}, "cannot be decoded: parser error: Too many items"),
    ],
    ids=["ref-to-itself", "ref-cycle", "forced-without-end"],
)
def test_a_schema_no_text_can_complete_is_refused_before_decoding(model64, char_tokenizer, spec, message):
    """They compile; a fresh matcher's first advance shows that nothing can complete them. Before, decoding gave an
    empty text and called it complete. A refusal is one line, and is remembered: a second call says the same."""
    for _ in range(2):
        with pytest.raises(ValueError, match=message) as error:
            wedlm(model64, char_tokenizer, grammar=spec, tokenizer=char_tokenizer)
        assert "\n" not in str(error.value)


def test_a_grammar_that_fails_while_decoding_raises_a_grammar_error(model64, char_tokenizer):
    """Its start passes the first advance (a free choice of 1 or 2); after the choice, the forced text never ends
    and llguidance stops at its item limit: a `GrammarError` (a ValueError) with the library's words, one line."""
    spec = {"type": "object", "properties": {"k": {"enum": [1, 2]}, "a": {"$ref": "#/$defs/R"}}, "required": ["k", "a"]}
    compile_grammar({**spec, **DEFS}, char_tokenizer)  # no refusal up front
    for lossless in (False, True):
        with pytest.raises(GrammarError, match="failed while decoding: parser error: Too many items") as error:
            wedlm(model64, char_tokenizer, grammar={**spec, **DEFS}, tokenizer=char_tokenizer, wedlm_lossless=lossless)
        assert "\n" not in str(error.value)
