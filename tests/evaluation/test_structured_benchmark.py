"""`wedlm-hf bench-structured` checks lossless + grammar against AR + processor and every output against its
schema before timing anything, and reports where the tokens came from (no timing asserts)."""

from wedlm_hf import default_model_path
from wedlm_hf.cli import build_parser
from wedlm_hf.evaluation.structured_benchmark import COMPILED_DECODERS, DECODERS, run_structured_benchmark


def test_every_decoder_is_checked_and_its_tokens_accounted_for():
    lines = []
    report = run_structured_benchmark(
        default_model_path(), new_tokens=96, repeats=1, compile_backend="eager", log=lines.append
    )
    assert report["mismatches"] == [] and report["invalid"] == []
    rows = report["decoders"]
    assert list(rows) == [*DECODERS, *COMPILED_DECODERS]
    assert rows["AR + processor"]["tokens"] == rows["lossless + grammar"]["tokens"]
    for name, row in rows.items():
        assert row["tokens_per_forward"] == row["tokens"] / row["forwards"]
        assert row["vs_ar_compiled"] == row["tokens_per_s"] / rows["AR + processor, compiled"]["tokens_per_s"]
        if not name.startswith("AR + processor"):
            assert row["forced"] + row["constrained"] + row["model"] == row["tokens"]
            assert row["forced"] > 0 and row["forwards"] < row["tokens"]
    text = "\n".join(lines)
    assert all(name in text for name in DECODERS) and "identical to AR + processor" in text


def test_the_command_parses():
    args = build_parser().parse_args(["bench-structured", "--repeats", "2", "--new-tokens", "32", "--no-compile"])
    assert (args.repeats, args.new_tokens, args.model, args.no_compile) == (2, 32, None, True)
