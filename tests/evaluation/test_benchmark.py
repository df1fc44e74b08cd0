"""The benchmark entry point runs all the decoders side by side and reports consistent counts (no timing asserts)."""

import pytest
import torch
from conftest import build_model

from wedlm_hf.cli import build_parser
from wedlm_hf.evaluation.benchmark import load_bench_model, run_benchmark
from wedlm_hf.evaluation.blockwise_baseline import blockwise_generate
from wedlm_hf.evaluation.compiled_forward import swapped_forward


def test_benchmark_reports_every_run_and_ratio():
    lines = []
    report = run_benchmark(
        model=build_model(dtype=torch.float32),
        new_tokens=24,
        long_tokens=32,
        window_size=8,
        batch=2,
        repeats=1,
        threads=1,
        compile=False,
        log=lines.append,
    )
    names = list(report["results"])
    assert names[0].startswith("AR generate") and any(n.startswith("block-wise") for n in names)
    assert set(report["ratios"]) == {
        "wedlm_vs_ar",
        "wedlm_w1_vs_ar",
        "w1_forward_vs_ar_step",
        "w1_alone_forward_vs_ar_step",
        "batched_vs_singles",
        "wedlm_vs_blockwise_long",
        "blockwise_rows_per_wedlm_row",
    }
    wedlm = report["results"]["WeDLM, 24 tokens"]
    # Threshold huge: every mask is accepted; W=8 fills 8 per forward, and the last 8 reach the budget and commit at
    # once (no confirming forward).
    assert wedlm["tokens"] == 24 and wedlm["forwards"] == 3
    assert any("WeDLM / AR generate tokens/s" in line for line in lines)
    at_one = report["results"]["WeDLM W=1 (AR's work), 24 tokens"]  # AR's token each forward, copies aside
    assert at_one["tokens"] == 24 and 12 <= at_one["forwards"] <= 24 and at_one["p_cache"] <= 1
    assert any("WeDLM W=1 / AR generate tokens/s" in line for line in lines)
    assert any("WeDLM W=1 seconds per forward / AR seconds per step" in line for line in lines)
    alone = report["results"]["WeDLM W=1 lossless, no copies, 24 tokens"]  # exactly AR's work: one token a forward
    assert alone["tokens"] == alone["forwards"] == 24 and alone["p_cache"] == 1
    assert any("WeDLM W=1 lossless, no copies, seconds per forward" in line for line in lines)


def test_compiled_rows_are_timed_and_produce_the_eager_tokens():
    """torch.compile's "eager" backend runs the compiled plumbing (the swapped forward, the static cache) cheaply."""
    model = build_model(dtype=torch.float32)
    own_forward = model.forward
    lines = []
    report = run_benchmark(
        model=model,
        new_tokens=16,
        long_tokens=0,
        window_size=4,
        batch=1,
        repeats=2,
        threads=1,
        compile_backend="eager",
        log=lines.append,
    )
    results = report["results"]
    ar, wedlm = results["AR static+compiled, 16 tokens"], results["WeDLM static+compiled, 16 tokens"]
    assert ar["tokens"] == ar["forwards"] == 16 and wedlm["tokens"] == 16 and wedlm["forwards"] < 16
    assert wedlm["forwards"] == results["WeDLM, 16 tokens"]["forwards"]
    assert {"wedlm_compiled_vs_ar_compiled", "wedlm_compiled_vs_wedlm", "ar_compiled_vs_ar"} <= set(report["ratios"])
    assert report["mismatches"] == []
    assert any(line.startswith("WeDLM static+compiled / AR static+compiled tokens/s:") for line in lines)
    assert any(line.startswith("WeDLM static+compiled / WeDLM eager tokens/s:") for line in lines)
    assert "static+compiled runs produce the eager runs' tokens: AR generate, WeDLM" in lines
    # The eager rows ran the model's own forward, and the model has it back.
    assert "forward" not in vars(model) and model.forward == own_forward


def test_swapped_forward_puts_back_an_instance_forward_too():
    model = build_model(dtype=torch.float32)
    with swapped_forward(model, "compiled"):
        assert model.forward == "compiled"
    assert "forward" not in vars(model)
    model.forward = mine = model.forward
    with pytest.raises(RuntimeError), swapped_forward(model, "compiled"):
        raise RuntimeError
    assert vars(model)["forward"] is mine


def test_a_swapped_compiled_forward_keeps_compiling_past_dynamos_default_limit():
    """The benchmarks' decoders share one compiled forward: more shapes than dynamo's default limit must still run
    compiled, not fall back to eager."""
    model = build_model(dtype=torch.float32)
    compiled = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)  # a new function: no graphs yet
    graphs = torch._dynamo.utils.counters["stats"]
    before, shapes = graphs["unique_graphs"], torch._dynamo.config.recompile_limit + 4
    with swapped_forward(model, compiled):
        for n in range(1, shapes + 1):
            assert torch.equal(model.forward(torch.ones(n)), torch.full((n,), 2.0))
    assert graphs["unique_graphs"] - before == shapes


def test_blockwise_baseline_equals_streaming_when_every_mask_is_accepted():
    """With tau huge both fill whole blocks from the same logits distribution of the same context."""
    model = build_model()
    ids = torch.randint(0, 90, (1, 6), generator=torch.Generator().manual_seed(0))
    seq, forwards, rows = blockwise_generate(model, ids, 95, max_new_tokens=8, block_size=8, entropy_threshold=1e9)
    streamed = model.generate(  # the paper's rule, which the baseline decodes by blocks
        ids, strategy="wedlm", max_new_tokens=8, wedlm_window_size=8, wedlm_entropy_threshold=1e9, eos_token_id=None,
        wedlm_context_drafts=False,
    )  # fmt: skip
    assert forwards == 1 and rows == 6 + 8 and torch.equal(seq, streamed)


def test_bench_command_parses():
    args = build_parser().parse_args(["bench", "--new-tokens", "8", "--long-tokens", "0"])
    assert args.threshold == 1e9 and args.new_tokens == 8 and not args.no_compile
    assert build_parser().parse_args(["bench", "--no-compile"]).no_compile


def test_bench_header_counts_in_words(capsys):
    lines = []
    run_benchmark(
        model=build_model(dtype=torch.float32),
        new_tokens=4,
        long_tokens=0,
        batch=1,
        repeats=1,
        threads=1,
        compile=False,
        log=lines.append,
    )
    assert "cpu, float32, 1 thread;" in lines[0] and "best of 1 interleaved run" in lines[0]
    assert "1 threads" not in lines[0] and "1 runs" not in lines[0]


def test_bench_model_device_and_dtype():
    args = build_parser().parse_args(["bench", "--device", "cpu", "--dtype", "bfloat16"])
    model = load_bench_model(None, args.device, args.dtype)
    assert model.dtype == torch.bfloat16 and model.device.type == "cpu"
    assert build_parser().parse_args(["bench"]).device == "cpu"
    with pytest.raises(ValueError, match="--device gpu: not a torch device; use cpu, cuda or cuda:N"):
        load_bench_model(None, "gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="--device cuda: torch sees no CUDA device"):
            load_bench_model(None, "cuda")
