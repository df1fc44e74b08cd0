"""Structured output under WeDLM decoding (docs/structured-output.md), on tiny random models with a character
tokenizer: every output matches its grammar, in every mode; lossless + grammar is AR + the grammar's processor."""

import json
import random
import re

import jsonschema
import pytest
import torch
from conftest import EOS_ID, build_model, chi_square_p_value
from transformers import LogitsProcessorList, TemperatureLogitsWarper

from wedlm_hf.structured import GrammarLogitsProcessor, compile_grammar

NAMES = ["id", "name", "tags", "count", "ok", "kind", "value", "items", "score", "note"]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A bounded JSON schema (every value it admits is finite and short), so that every row can complete."""
    kinds = ["object", "array", "enum", "integer", "number", "string", "boolean"] if depth < 2 else ["enum", "string"]
    kind = "object" if depth == 0 else rng.choice(kinds)
    if kind == "object":
        names = rng.sample(NAMES, rng.randint(1, 3 if depth else 4))
        required = [n for n in names if rng.random() < 0.7] or names[:1]
        properties = {n: random_schema(rng, depth + 1) for n in names}
        return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1), "maxItems": rng.randint(1, 3)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 7, 42, True, None, "x y"], rng.randint(1, 4))}
    if kind == "integer":
        low = rng.randint(-5, 10)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 300)}
    if kind == "number":
        return {"type": "number", "minimum": 0, "maximum": 10}
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 6)}
    return {"type": "boolean"}


SCHEMAS = [random_schema(random.Random(seed)) for seed in range(56)]
REGEXES = [r"[a-z]{2,5}@[a-z]{2,4}\.(com|org)", r"(yes|no)", r"\d{3}-\d{4}", r"[A-Z][a-z]{0,6}( [A-Z][a-z]{0,6})?"]
MODES = {
    "default": {},
    "lossless": {"wedlm_lossless": True},
    "sampling": {"do_sample": True, "temperature": 1.3},
    "lossless-sampling": {"wedlm_lossless": True, "do_sample": True, "temperature": 1.3},
}


@pytest.fixture(scope="module")
def model():
    return build_model(seed=3)


PROMPTS = ["data: ", "json=", "A", "record"]


def generate(model, tokenizer, grammar, batch: int, max_new_tokens=240, prompts=None, **kwargs) -> list[list[int]]:
    prompts = prompts or (PROMPTS * batch)[:batch]
    inputs = tokenizer(prompts, return_tensors="pt", padding=True)
    out = model.generate(
        **inputs,
        strategy="wedlm",
        grammar=grammar,
        tokenizer=tokenizer,
        max_new_tokens=max_new_tokens,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
        **kwargs,
    )
    return [row.tolist() for row in out[:, inputs.input_ids.shape[1] :]]


def until_stop(tokens: list[int]) -> list[int]:
    return tokens[: tokens.index(EOS_ID) + 1] if EOS_ID in tokens else tokens


def completed_text(tokenizer, tokens: list[int]) -> str:
    assert EOS_ID in tokens, f"the row did not complete: {tokenizer.decode(tokens)!r}"
    return tokenizer.decode(tokens[: tokens.index(EOS_ID)])


@pytest.mark.parametrize("mode", MODES)
def test_every_output_validates_against_its_schema(model, char_tokenizer, mode):
    """56 generated schemas (nested objects, arrays, enums, integers, numbers, required keys), batches of eight
    rows that each carry their own schema, beside a row of free text."""
    torch.manual_seed(0)
    for start in range(0, len(SCHEMAS), 7):
        schemas = SCHEMAS[start : start + 7]
        rows = generate(model, char_tokenizer, [*schemas, None], batch=8, **MODES[mode])
        for schema, tokens in zip(schemas, rows):
            jsonschema.validate(json.loads(completed_text(char_tokenizer, tokens)), schema)


@pytest.mark.parametrize("mode", MODES)
def test_every_output_matches_its_regex(model, char_tokenizer, mode):
    torch.manual_seed(1)
    rows = generate(model, char_tokenizer, [("regex", r) for r in REGEXES], batch=4, **MODES[mode])
    for pattern, tokens in zip(REGEXES, rows):
        assert re.fullmatch(pattern, completed_text(char_tokenizer, tokens)), pattern


def test_a_lark_grammar(model, char_tokenizer):
    grammar = ("lark", 'start: item | item "," item | item "," item "," item\nitem: /[0-9]{1,2}/ | "none"')
    for mode in ("default", "lossless"):
        for tokens in generate(model, char_tokenizer, grammar, batch=4, **MODES[mode]):
            text = completed_text(char_tokenizer, tokens)
            assert re.fullmatch(r"([0-9]{1,2}|none)(,([0-9]{1,2}|none)){0,2}", text)


@pytest.mark.parametrize("window", [4, 16])
def test_lossless_grammar_equals_ar_with_the_processor(model, char_tokenizer, window):
    grammars = [SCHEMAS[0], ("regex", REGEXES[0]), None, SCHEMAS[5], ("lark", 'start: "[" /[a-z]+/ "]"')]
    prompts = ["data: ", "mail ", "free", "json=", "list "]
    inputs = char_tokenizer(prompts, return_tensors="pt", padding=True)
    common = dict(max_new_tokens=120, eos_token_id=EOS_ID, pad_token_id=EOS_ID)
    processor = GrammarLogitsProcessor(grammars, char_tokenizer, eos_token_id=EOS_ID)
    ar = model.generate(**inputs, do_sample=False, logits_processor=LogitsProcessorList([processor]), **common)
    wedlm = model.generate(
        **inputs,
        strategy="wedlm",
        wedlm_lossless=True,
        wedlm_window_size=window,
        grammar=grammars,
        tokenizer=char_tokenizer,
        return_dict_in_generate=True,
        **common,
    )
    assert torch.equal(wedlm.sequences, ar)
    assert sum(s.forced_tokens for s in wedlm.wedlm_stats) > 0  # the grammar's fixed strings filled as drafts
    # AR generate takes grammar= itself: the same processor.
    assert torch.equal(model.generate(**inputs, grammar=grammars, tokenizer=char_tokenizer, **common), ar)
    assert sum(s.tokens for s in wedlm.wedlm_stats) > sum(s.forwards for s in wedlm.wedlm_stats)


def test_scores_are_ar_with_the_processor_scores(model, char_tokenizer):
    inputs = char_tokenizer(["data: "], return_tensors="pt")
    common = dict(max_new_tokens=40, eos_token_id=EOS_ID, pad_token_id=EOS_ID, return_dict_in_generate=True)
    common |= dict(output_scores=True, output_logits=True)
    processor = GrammarLogitsProcessor(SCHEMAS[2], char_tokenizer, eos_token_id=EOS_ID)
    ar = model.generate(**inputs, do_sample=False, logits_processor=[processor], **common)
    wedlm = model.generate(
        **inputs, strategy="wedlm", wedlm_lossless=True, grammar=SCHEMAS[2], tokenizer=char_tokenizer, **common
    )
    assert torch.equal(wedlm.sequences, ar.sequences)
    for ours, theirs in zip(wedlm.scores, ar.scores):
        assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
        torch.testing.assert_close(ours[~torch.isinf(ours)], theirs[~torch.isinf(theirs)])
    for ours, theirs in zip(wedlm.logits, ar.logits):  # raw logits: the grammar restricts choices, not them
        torch.testing.assert_close(ours, theirs)


def test_the_budget_ends_a_row_inside_its_grammar(model, char_tokenizer):
    """At max_new_tokens the text is cut, never wrong: what committed is a prefix the grammar accepts."""
    for mode in ("default", "lossless"):
        for tokens in generate(model, char_tokenizer, SCHEMAS[9], batch=4, max_new_tokens=7, **MODES[mode]):
            assert EOS_ID not in tokens and len(tokens) == 7
            state = compile_grammar(SCHEMAS[9], char_tokenizer, 96).matcher()
            assert state.accepted(tokens) == len(tokens)


def test_every_forward_commits_at_least_one_token(model, char_tokenizer):
    inputs = char_tokenizer(["json="], return_tensors="pt")
    out = model.generate(
        **inputs,
        strategy="wedlm",
        grammar=SCHEMAS[11],
        tokenizer=char_tokenizer,
        max_new_tokens=200,
        eos_token_id=EOS_ID,
        wedlm_entropy_threshold=None,
        return_dict_in_generate=True,
    )
    stats = out.wedlm_stats[0]
    assert stats.tokens >= stats.forwards - 1  # the first forward prefills the prompt and fills the window
    assert stats.forced_tokens > 0 and stats.constrained_tokens > 0


REGEX_LOSSLESS = r"(ab|c)[de]"


def test_lossless_sampling_under_a_grammar_is_ar_sampling_under_it(model, char_tokenizer):
    """The exact AR + grammar distribution of the four strings `(ab|c)[de]` admits, against 3,000 lossless samples:
    forced drafts ('b' after 'a') are verified as point masses, the rest drawn from restricted distributions."""
    warpers = LogitsProcessorList([TemperatureLogitsWarper(1.5)])
    prompt = char_tokenizer("go:").input_ids
    grammar = compile_grammar(("regex", REGEX_LOSSLESS), char_tokenizer, 96)
    expected = {}
    for text in ("abd", "abe", "cd", "ce"):
        tokens, p, state = char_tokenizer(text).input_ids + [EOS_ID], 1.0, grammar.matcher()
        for i, token in enumerate(tokens):
            with torch.no_grad():
                logits = model(torch.tensor([prompt + tokens[:i]])).logits[0, -1].float()
            allowed = state.allowed()
            if state.accepting():
                allowed[EOS_ID] = True
            scores = warpers(None, logits.masked_fill(~allowed, float("-inf"))[None])
            p *= float(torch.softmax(scores, -1)[0, token])
            if token != EOS_ID:
                state.advance([token])
        expected[text] = p
    assert abs(sum(expected.values()) - 1) < 1e-6
    torch.manual_seed(0)
    samples = 3000
    out = model.generate(
        torch.tensor([prompt] * samples),
        strategy="wedlm",
        wedlm_lossless=True,
        grammar=grammar,
        do_sample=True,
        temperature=1.5,
        max_new_tokens=4,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
    )
    counts = {}
    for row in out[:, len(prompt) :].tolist():
        text = completed_text(char_tokenizer, row)
        counts[text] = counts.get(text, 0) + 1
    assert set(counts) <= set(expected)
    assert chi_square_p_value(counts, expected, samples) > 1e-3


def test_rows_with_and_without_a_grammar_share_a_batch(model, char_tokenizer):
    """Each row, free or constrained, decodes in a mixed batch exactly as it does alone."""
    grammars = [SCHEMAS[3], None, SCHEMAS[4], None]
    mixed = generate(model, char_tokenizer, grammars, batch=4, max_new_tokens=60)
    for b, grammar in enumerate(grammars):
        alone = generate(model, char_tokenizer, grammar, batch=1, max_new_tokens=60, prompts=[PROMPTS[b]])
        assert until_stop(mixed[b]) == until_stop(alone[0])


def test_the_static_cache_decodes_under_a_grammar_as_the_dynamic_one(model, char_tokenizer):
    grammars = [SCHEMAS[6], ("regex", REGEXES[2]), None]
    for mode in ("default", "lossless"):
        dynamic = generate(model, char_tokenizer, grammars, batch=3, max_new_tokens=80, **MODES[mode])
        static = generate(
            model, char_tokenizer, grammars, batch=3, max_new_tokens=80, cache_implementation="static", **MODES[mode]
        )
        assert static == dynamic
