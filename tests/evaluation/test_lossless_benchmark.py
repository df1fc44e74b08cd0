"""`wedlm-hf bench-lossless` runs every decoder on every family and checks outputs against AR (no timing asserts)."""

import torch
from conftest import VOCAB, build_model

from wedlm_hf.cli import build_parser
from wedlm_hf.data import FAMILIES
from wedlm_hf.evaluation import lossless_benchmark
from wedlm_hf.evaluation.lossless_benchmark import (
    COLUMNS,
    COMPILED_COLUMNS,
    COMPILED_DECODERS,
    DECODERS,
    EXACT,
    EXACT_COMPILED,
    repeat_prompts,
    run_lossless_benchmark,
)


def tiny_run(tmp_path, char_tokenizer, repeats=1, **options):
    build_model(dtype=torch.float32).save_pretrained(tmp_path, tokenizer=char_tokenizer)
    lines = []
    report = run_lossless_benchmark(
        str(tmp_path),
        prompts_per_family=1,
        new_tokens=6,
        repeats=repeats,
        train_items_per_family=200,
        log=lines.append,
        **options,
    )
    return report, "\n".join(lines).splitlines()


def test_every_family_and_decoder_is_reported_and_checked_against_ar(tmp_path, char_tokenizer):
    report, lines = tiny_run(tmp_path, char_tokenizer, repeats=2)
    families = [*FAMILIES, "code", "repeat", "all"]
    assert list(report["families"]) == families and report["mismatches"] == []
    for row in report["families"].values():
        assert all(row[name]["tokens_per_s"] > 0 for name in DECODERS)
        assert row["identical_to_ar"] == dict.fromkeys(EXACT, True)
        assert row["lossless_vs_ar"] > 0 and row["lossless_vs_prompt_lookup"] > 0
        assert row["lossless"]["tokens_per_forward"] > 0 and row["lossless"]["accepted_context_drafts"] >= 0
        assert len(row["lossless_vs_prompt_lookup_per_run"]) == 2  # one ratio per timed run
    header = next(i for i, line in enumerate(lines) if line.startswith("family"))
    assert lines[header].split()[: len(COLUMNS)] == list(COLUMNS)
    table = lines[header + 1 : header + 1 + len(families)]
    assert [line.split()[0] for line in table] == families
    for line, row in zip(table, report["families"].values()):  # the last column: the single runs' LL/PLD range
        runs = row["lossless_vs_prompt_lookup_per_run"]
        assert line.split()[-1] == f"{min(runs):.2f}-{max(runs):.2f}"
    assert lines[-1] == "identical to AR generate on every prompt: " + ", ".join(EXACT)


def test_compiled_decoders_are_reported_and_checked_against_ar(tmp_path, char_tokenizer):
    """torch.compile's "eager" backend: the compiled plumbing (swapped forward, static cache) without compiling."""
    report, lines = tiny_run(tmp_path, char_tokenizer, compiled=True, compile_backend="eager")
    assert report["mismatches"] == [] and report["settings"]["compiled"] == "eager"
    for row in report["families"].values():
        assert all(row[name]["tokens_per_s"] > 0 for name in (*DECODERS, *COMPILED_DECODERS))
        assert row["identical_to_ar"] == dict.fromkeys(EXACT + EXACT_COMPILED, True)
        assert row["lossless_compiled_vs_ar_compiled"] > 0 and row["lossless compiled"]["tokens_per_forward"] > 0
        speed = row["lossless compiled"]["tokens_per_s"]
        assert row["lossless_compiled_vs_prompt_lookup"] == speed / row["prompt lookup"]["tokens_per_s"]
    header = next(i for i, line in enumerate(lines) if line.startswith("family ") and "ARc" in line)
    assert lines[header].split()[: len(COMPILED_COLUMNS)] == list(COMPILED_COLUMNS)
    assert lines[header + 1].split()[0] == FAMILIES[0]
    assert lines[-1] == "identical to AR generate on every prompt: " + ", ".join(EXACT + EXACT_COMPILED)


def test_a_decoder_that_differs_from_ar_is_reported(tmp_path, char_tokenizer, monkeypatch):
    """Every token suppressed: greedy picks token 0 throughout, which AR does not."""
    monkeypatch.setitem(DECODERS, "prompt lookup", dict(do_sample=False, suppress_tokens=list(range(VOCAB))))
    report, lines = tiny_run(tmp_path, char_tokenizer)
    assert report["mismatches"] and {m["decoder"] for m in report["mismatches"]} == {"prompt lookup"}
    assert any(line.startswith("!!! MISMATCH: prompt lookup differs") for line in lines)
    assert report["families"]["all"]["identical_to_ar"]["prompt lookup"] is False
    assert lines[-1].startswith("!!! NOT identical to AR generate: prompt lookup on")


def test_repeat_prompts_and_command_defaults():
    prompts = repeat_prompts(3)
    assert len(set(prompts)) == 3 and prompts == repeat_prompts(3) and prompts[2].startswith("def unpack(")
    args = build_parser().parse_args(["bench-lossless"])
    assert (args.prompts_per_family, args.new_tokens, args.repeats, args.threads) == (10, 64, 3, 1)
    assert args.model is None and args.json is None and not args.compiled
    assert build_parser().parse_args(["bench-lossless", "--compiled"]).compiled
    assert callable(lossless_benchmark.bench_lossless_command)
