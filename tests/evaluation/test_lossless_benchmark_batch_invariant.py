"""`wedlm-hf bench-lossless --dtype bfloat16 --batch-invariant`: every decoder runs inside the switch, and lossless
(and prompt lookup) are AR's output on every prompt in bfloat16 (no timing asserts)."""

import pytest

from wedlm_hf import default_model_path
from wedlm_hf.cli import build_parser
from wedlm_hf.evaluation.lossless_benchmark import EXACT, run_lossless_benchmark


def test_bfloat16_under_the_switch_is_checked_against_ar_and_says_so():
    lines = []
    report = run_lossless_benchmark(
        default_model_path(),
        prompts_per_family=1,
        new_tokens=8,
        repeats=1,
        train_items_per_family=200,
        dtype="bfloat16",
        batch_invariant=True,
        log=lines.append,
    )
    assert report["mismatches"] == [] and lines[-1] == "identical to AR generate on every prompt: " + ", ".join(EXACT)
    assert report["settings"]["dtype"] == "bfloat16" and report["settings"]["batch_invariant"] is True
    assert "cpu bfloat16, batch-invariant, 1 CPU thread" in lines[0]


def test_the_options_and_what_they_refuse():
    args = build_parser().parse_args(["bench-lossless", "--dtype", "bfloat16", "--batch-invariant"])
    assert args.dtype == "bfloat16" and args.batch_invariant
    assert build_parser().parse_args(["bench-lossless"]).dtype == "float32"
    with pytest.raises(ValueError, match="--batch-invariant does not cover compiled forwards"):
        run_lossless_benchmark(default_model_path(), compiled=True, batch_invariant=True)
