"""Structured output on the shipped model and its byte-level tokenizer: records that a program reads."""

import json

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer

from wedlm_hf import WeDLMForCausalLM, default_model_path
from wedlm_hf.structured import GrammarLogitsProcessor

RECORD = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "line": {"type": "integer", "minimum": 1, "maximum": 9999},
        "kind": {"enum": ["function", "class", "constant"]},
        "public": {"type": "boolean"},
        "args": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "line", "kind", "public", "args"],
    "additionalProperties": False,
}
SCHEMAS = [
    RECORD,
    {"type": "object", "properties": {"module": {"enum": ["os", "sys", "json"]}}, "required": ["module"]},
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"key": {"type": "string", "maxLength": 6}, "n": {"type": "integer", "minimum": 0}},
                    "required": ["key", "n"],
                    "additionalProperties": False,
                },
                "minItems": 1,
                "maxItems": 2,
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    },
]
PROMPTS = ["def parse(path):\n    record = ", "import json\nconfig = ", "# the table\nrows = "]


@pytest.fixture(scope="module")
def shipped():
    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    return WeDLMForCausalLM.from_pretrained(path).eval(), tokenizer


@pytest.mark.parametrize("lossless", [False, True])
def test_outputs_parse_and_validate(shipped, lossless):
    model, tokenizer = shipped
    inputs = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    out = model.generate(
        **inputs, strategy="wedlm", grammar=SCHEMAS, tokenizer=tokenizer, max_new_tokens=120, wedlm_lossless=lossless
    )
    for schema, row in zip(SCHEMAS, out[:, inputs.input_ids.shape[1] :]):
        tokens = row.tolist()
        assert tokenizer.eos_token_id in tokens
        jsonschema.validate(json.loads(tokenizer.decode(tokens, skip_special_tokens=True)), schema)


def test_lossless_equals_ar_with_the_processor(shipped):
    model, tokenizer = shipped
    inputs = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    processor = GrammarLogitsProcessor(SCHEMAS, tokenizer)
    ar = model.generate(**inputs, max_new_tokens=120, do_sample=False, logits_processor=[processor])
    wedlm = model.generate(
        **inputs, strategy="wedlm", wedlm_lossless=True, grammar=SCHEMAS, tokenizer=tokenizer, max_new_tokens=120
    )
    assert torch.equal(wedlm, ar)


def test_a_forced_string_is_filled_whole(shipped):
    """llguidance alone stops before ' "' (a token that could merge with what follows); the forced string is
    spelled out to its end, as far as the grammar accepts it."""
    model, tokenizer = shipped
    from wedlm_hf.structured import compile_grammar

    state = compile_grammar(RECORD, tokenizer, model.config.vocab_size).matcher()
    forced = state.forced()
    assert tokenizer.decode(forced) == '{"name": "'
    assert state.accepted(forced) == len(forced)


def records_at_w4(model, tokenizer, inputs, **sampling):
    """Default mode at W = 4 (greedy unless `sampling` says otherwise), one of SCHEMAS per row."""
    return model.generate(
        **inputs,
        **sampling,
        strategy="wedlm",
        wedlm_window_size=4,
        grammar=SCHEMAS,
        tokenizer=tokenizer,
        max_new_tokens=120,
        return_dict_in_generate=True,
    )


def spy_on_guesses(monkeypatch) -> list[tuple[int, bool]]:
    """From now on, each default-mode commit under a grammar appends (guesses checked, whether one failed)."""
    from wedlm_hf.modeling import commit_rules

    checked = []
    commit_valid = commit_rules.commit_valid

    def spy(row, run):
        guesses = [i for i in range(1, run) if row.window[i].guess]
        count, failed = commit_valid(row, run)
        checked.append((len(guesses), failed))
        return count, failed

    monkeypatch.setattr(commit_rules, "commit_valid", spy)
    return checked


def test_guesses_save_forwards(shipped, monkeypatch):
    """Greedy default mode places an unconfident choice that a fixed string follows (a separator, a one-token value)
    as a guess, checked against AR's own restricted choice by the forward that feeds it: fewer forwards, and every
    output still validates."""
    from wedlm_hf.modeling import grammar_hook

    model, tokenizer = shipped
    inputs = tokenizer(PROMPTS, return_tensors="pt", padding=True)

    def decode():
        out = records_at_w4(model, tokenizer, inputs)
        for schema, row in zip(SCHEMAS, out.sequences[:, inputs.input_ids.shape[1] :]):
            jsonschema.validate(json.loads(tokenizer.decode(row, skip_special_tokens=True)), schema)
        return sum(s.forwards for s in out.wedlm_stats)

    checked = spy_on_guesses(monkeypatch)
    with_guesses = decode()
    assert sum(n for n, _ in checked) > sum(failed for _, failed in checked)  # guesses were made, and most held
    monkeypatch.setattr(grammar_hook, "worth_a_guess", lambda *args: False)
    assert with_guesses < decode()


def test_sampled_rows_guess_too(shipped, monkeypatch):
    """Sampled rows place guesses as greedy rows do (each kept with AR's probability of it, the unit tests check the
    rule): fewer forwards over a few seeds, and every output still validates."""
    from wedlm_hf.modeling import grammar_hook

    model, tokenizer = shipped
    inputs = tokenizer(PROMPTS, return_tensors="pt", padding=True)

    def forwards():
        total = 0
        for seed in range(3):
            torch.manual_seed(seed)
            out = records_at_w4(model, tokenizer, inputs, do_sample=True, temperature=0.7)
            for schema, row in zip(SCHEMAS, out.sequences[:, inputs.input_ids.shape[1] :]):
                jsonschema.validate(json.loads(tokenizer.decode(row, skip_special_tokens=True)), schema)
            total += sum(s.forwards for s in out.wedlm_stats)
        return total

    checked = spy_on_guesses(monkeypatch)
    with_guesses = forwards()
    assert sum(n for n, _ in checked) > sum(failed for _, failed in checked) > 0  # guesses made; most held, not all
    monkeypatch.setattr(grammar_hook, "worth_a_guess", lambda *args: False)
    assert with_guesses < forwards()


def test_a_step_whose_guess_failed_keeps_none_of_its_mask_fills(shipped, monkeypatch):
    """Every mask fed with a guess saw it: when the guess fails, no fill drawn from those masks stays."""
    from wedlm_hf.modeling import commit_rules

    model, tokenizer = shipped
    inputs = tokenizer(PROMPTS, return_tensors="pt", padding=True)

    def model_fills():
        out = records_at_w4(model, tokenizer, inputs)
        return sum(s.tokens - s.forced_tokens - s.constrained_tokens for s in out.wedlm_stats)

    assert model_fills() > 0  # the model's own fills commit in this run
    commit_valid = commit_rules.commit_valid
    monkeypatch.setattr(commit_rules, "commit_valid", lambda row, run: (commit_valid(row, run)[0], True))
    assert model_fills() == 0


def test_lossless_guesses_save_forwards_and_stay_ar_with_the_processor(shipped, monkeypatch):
    """In lossless mode a guess is a draft: the output stays AR + processor's, in fewer forwards."""
    from wedlm_hf.evaluation.structured_benchmark import PROMPTS as RECORD_PROMPTS
    from wedlm_hf.evaluation.structured_benchmark import SCHEMAS as RECORDS
    from wedlm_hf.modeling import grammar_hook

    model, tokenizer = shipped
    schemas = list(RECORDS.values())
    inputs = tokenizer([RECORD_PROMPTS[0]] * len(schemas), return_tensors="pt", padding=True)
    ar = model.generate(
        **inputs, max_new_tokens=96, do_sample=False, logits_processor=[GrammarLogitsProcessor(schemas, tokenizer)]
    )

    def forwards():
        out = model.generate(
            **inputs,
            strategy="wedlm",
            wedlm_lossless=True,
            grammar=schemas,
            tokenizer=tokenizer,
            max_new_tokens=96,
            return_dict_in_generate=True,
        )
        assert torch.equal(out.sequences, ar)
        return sum(s.forwards for s in out.wedlm_stats)

    with_guesses = forwards()
    monkeypatch.setattr(grammar_hook, "worth_a_guess", lambda *args: False)
    assert with_guesses < forwards()


def test_a_grammar_row_computes_only_the_logits_its_commit_reads(shipped, monkeypatch):
    """Default mode under a grammar reads one AR row per step (the slot after the commit) and the row before each
    guess: the other rows of a run (a forced key, say) get no logits, and the output is the same as with all."""
    from wedlm_hf.modeling import step_feed

    model, tokenizer = shipped
    inputs = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    rows = []
    hook = model.lm_head.register_forward_hook(
        lambda module, args, out: rows.append(args[0].shape[0] * args[0].shape[1])
    )

    def decode(**sampling):
        rows.clear()
        torch.manual_seed(0)
        sequences = records_at_w4(model, tokenizer, inputs, **sampling).sequences
        return sequences.tolist(), sum(rows)

    try:
        few = [decode(), decode(do_sample=True, temperature=0.7)]
        monkeypatch.setattr(step_feed, "logit_slots", lambda row, run: list(range(run)))
        every = [decode(), decode(do_sample=True, temperature=0.7)]
    finally:
        hook.remove()
    for (tokens, fed), (all_tokens, all_fed) in zip(few, every):
        assert tokens == all_tokens
        assert fed < all_fed


@pytest.mark.parametrize("lossless", [False, True])
def test_a_closing_string_forced_to_the_stop_token_needs_no_forward(shipped, monkeypatch, lossless):
    """The record's last choice is followed by what the grammar forces up to the stop token (the closing brace):
    they commit with that choice, in default mode and in lossless mode (AR under the grammar has no other choice),
    not one forward later. Same outputs, and (default mode) one forward fewer per row."""
    from wedlm_hf.modeling import streaming_decoder

    model, tokenizer = shipped
    inputs = tokenizer(PROMPTS, return_tensors="pt", padding=True)

    def decode():
        out = model.generate(
            **inputs,
            strategy="wedlm",
            wedlm_window_size=4,
            wedlm_lossless=lossless,
            grammar=SCHEMAS,
            tokenizer=tokenizer,
            max_new_tokens=120,
            return_dict_in_generate=True,
        )
        return out.sequences, [s.forwards for s in out.wedlm_stats]

    sequences, forwards = decode()
    monkeypatch.setattr(streaming_decoder, "commit_ending", lambda row: 0)
    sequences_then, forwards_then = decode()
    assert torch.equal(sequences, sequences_then)
    saved = [then - now for now, then in zip(forwards, forwards_then)]
    if lossless:  # a row whose last choice is a draft that the final forward verifies saves nothing
        assert set(saved) <= {0, 1} and sum(saved) > 0
    else:
        assert saved == [1] * len(PROMPTS)
