"""`wedlm-hf bench-lossless` runs every decoder on every family and checks outputs against AR (no timing asserts)."""

import pytest
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
    generate_compile_config,
    repeat_prompts,
    run_lossless_benchmark,
)
from wedlm_hf.modeling import WeDLMForCausalLM


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


def test_compiled_decoders_can_compile_as_generate_does_on_a_gpu(tmp_path, char_tokenizer, monkeypatch):
    """On a GPU the compiled decoders use generate's own compile of the decoding step (CUDA graphs); on this CPU
    that path runs when asked, with the "eager" backend."""
    made = []
    original = WeDLMForCausalLM.get_compiled_call

    def counted(self, compile_config):
        made.append(compile_config)
        return original(self, compile_config)

    monkeypatch.setattr(WeDLMForCausalLM, "get_compiled_call", counted)
    report, lines = tiny_run(tmp_path, char_tokenizer, compiled=True, compile_backend="eager", compile_in_generate=True)
    assert report["mismatches"] == [] and report["settings"]["compiled_in_generate"] is True
    assert made and all(config.backend == "eager" for config in made)
    assert any(line.startswith("compiled: cache_implementation='static' with generate's own compile") for line in lines)
    assert report["families"]["all"]["identical_to_ar"] == dict.fromkeys(EXACT + EXACT_COMPILED, True)


def test_generate_compile_config_is_transformers_default_for_inductor():
    config = generate_compile_config("inductor", "cuda")
    assert (config.backend, config.mode) == ("inductor", "reduce-overhead") and not config._compile_all_devices
    config = generate_compile_config("eager", "cpu")
    assert (config.backend, config.mode) == ("eager", None) and config._compile_all_devices


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_a_cuda_device_without_cuda_names_the_argument(tmp_path, char_tokenizer):
    with pytest.raises(ValueError, match=r"--device cuda: torch sees no CUDA device here; leave out --device"):
        tiny_run(tmp_path, char_tokenizer, device="cuda")


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
    assert args.model is None and args.json is None and not args.compiled and args.device == "cpu"
    assert build_parser().parse_args(["bench-lossless", "--compiled"]).compiled
    assert callable(lossless_benchmark.bench_lossless_command)
