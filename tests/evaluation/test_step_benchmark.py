"""`wedlm-hf bench-step` measures AR and WeDLM per decoding step and counts host reads (no timing asserts)."""

import math

import torch

import wedlm_hf.modeling.window_filling as window_filling
from wedlm_hf.cli import build_parser
from wedlm_hf.evaluation.lookup_benchmark import SERVER_NGRAM
from wedlm_hf.evaluation.step_benchmark import HostReads, run_step_benchmark, step_model
from wedlm_hf.evaluation.step_calls import TARGET_OPS, per_step_counts
from wedlm_hf.modeling import WeDLMDecodingConfig
from wedlm_hf.serving.request_fields import MAX_CONTEXT_NGRAM


def test_host_reads_are_counted():
    x = torch.arange(6)
    with HostReads() as reads:
        x.sum().item()
        x.tolist()
        bool(x[0] > 1)
        x.nonzero()
        torch.add(x, 1)  # stays on the device: not counted
    assert reads.count == 4


def test_every_cell_is_measured_and_reported():
    lines = []
    report = run_step_benchmark(
        model=step_model(),
        batches=(1, 2),
        ar_tokens=(12, 4),
        wedlm_windows=(3, 1),
        window=4,
        repeats=1,
        compile_backend="eager",  # the static-cache plumbing, without compiling
        lookup_contexts=(64, 512),
        log=lines.append,
    )
    assert set(report) == {1, 2, "per_added_row", "context_lookup"}
    lookups = report["context_lookup"]  # both look-ups found continuations at the same steps (else it raises)
    memory = lookups.pop("index_bytes_per_token")  # at the default n-gram sizes and the server's most
    assert SERVER_NGRAM == MAX_CONTEXT_NGRAM and set(memory) == {WeDLMDecodingConfig.context_ngram, MAX_CONTEXT_NGRAM}
    assert set(lookups) == {64, 512} and 0 < memory[3] < memory[8]
    for cell in lookups.values():
        assert cell["WeDLM index"] > 0 and cell["prompt lookup"] > 0
        assert cell["ratio"] == cell["prompt lookup"] / cell["WeDLM index"] and cell["index_build_ms"] > 0
        assert 0 < cell["index_chunk_ms"] <= cell["index_build_ms"]  # its slowest chunk, a part of the whole build
    assert sum(line.startswith("context ") and " its slowest chunk " in line for line in lines) == 2
    assert lines[-1].startswith("the index's host memory per token of a 512-token context: ")
    for batch in (1, 2):
        seconds = report[batch]["seconds_per_step"]
        assert set(seconds) == {"AR eager", "WeDLM eager", "AR static+compiled", "WeDLM static+compiled"}
        # One repeat of a few steps: a difference of two timings, which a loaded machine can even make negative.
        assert all(math.isfinite(value) for value in seconds.values())
        forward = report[batch]["forward_seconds_per_step"]
        assert set(forward) == set(seconds) and all(math.isfinite(value) for value in forward.values())
        readout = report[batch]["readout_seconds_per_step"]  # WeDLM's readout, timed; AR has none of its own
        assert readout["AR eager"] == readout["AR static+compiled"] == 0.0
        assert all(math.isfinite(readout[name]) for name in seconds if name.startswith("WeDLM"))
        sampled = report[batch]["sampled_seconds_per_step"]  # one sampler for the batch, and one a row
        assert set(sampled) == {"one sampler", "a sampler a row"} and all(map(math.isfinite, sampled.values()))
        assert sum(line.startswith(f"batch {batch:>3}, sampled (eager") for line in lines) == 1
        reads = report[batch]["host_reads_per_step"]
        assert set(reads) == {"AR eager", "WeDLM eager", "WeDLM sampled", "lossless sampled"}
        assert all(count >= 1 for count in reads.values())
    assert sum("target <= 1.3x" in line for line in lines) == 2  # batch 1, eager and compiled
    assert sum("outside the forward" in line and "(readout " in line for line in lines) == 4
    cells = [line for line in lines if "WeDLM's forward alone" in line]
    assert len(cells) == 4
    for line, (batch, mode) in zip(cells, [(b, m) for b in (1, 2) for m in ("eager", "static+compiled")]):
        cell = report[batch]
        ratio = cell["forward_seconds_per_step"][f"WeDLM {mode}"] / cell["seconds_per_step"][f"AR {mode}"]
        assert line.startswith(f"batch {batch:>3}, {mode}") and line.endswith(f"alone: {ratio:4.2f}x AR's step")
    assert build_parser().parse_args(["bench-step", "--batches", "1", "4"]).batches == [1, 4]
    assert build_parser().parse_args(["bench-step"]).batches == [1, 16, 64]
    # Host work counted per step: AR's does not grow with the batch, WeDLM's does (issue 57's measure)
    counts = {batch: report[batch]["calls_and_ops_per_step"] for batch in (1, 2)}
    assert set(counts[1]) == {
        "AR generate",
        "WeDLM default",
        "WeDLM lossless",
        "WeDLM sampled",
        "WeDLM sampled, a sampler a row",  # as a server samples: each row its own sampler, so its own draws
        "WeDLM sampled, a sampler and a penalty a row",  # ... each with a repetition penalty, which reads the context
    }
    assert counts[2]["WeDLM sampled, a sampler a row"][1] > counts[2]["WeDLM sampled"][1]
    assert counts[2]["AR generate"] == counts[1]["AR generate"]
    assert all(counts[2][mode][0] > counts[1][mode][0] for mode in counts[1] if mode != "AR generate")
    added = report["per_added_row"]
    assert added["WeDLM default"][0] == counts[2]["WeDLM default"][0] - counts[1]["WeDLM default"][0]
    assert any(line.startswith("WeDLM default") and line.endswith(("PASS", "FAIL")) for line in lines)


def test_torch_operators_per_step_do_not_grow_with_the_batch():
    """Issue 57's operator target, counted (not timed): from 8 to 24 rows a step costs at most one more torch
    operator per added row in every mode (a per-row view of the logits, or of a sampled fill's distribution, would
    cost one per row or per fill)."""
    model, g = step_model(), torch.Generator().manual_seed(0)
    lengths = {"AR generate": (24, 8), "WeDLM default": (48, 16), "WeDLM lossless": (48, 16), "WeDLM sampled": (48, 16)}
    counts = {
        batch: per_step_counts(model, torch.randint(0, 511, (batch, 8), generator=g), 8, lengths) for batch in (8, 24)
    }
    for mode in lengths:
        added = (counts[24][mode][1] - counts[8][mode][1]) / 16
        assert added <= TARGET_OPS, (mode, added)


def test_rows_with_penalties_of_their_own_cost_fewer_operators_batched_than_each_alone(monkeypatch):
    """Rows that each sample with a repetition penalty of their own (it reads the context) process as one batch
    (`sampler_batch`): each added row costs fewer torch operators than where every sampler processes alone."""
    model, g = step_model(), torch.Generator().manual_seed(0)
    mode = "WeDLM sampled, a sampler and a penalty a row"
    prompts = {batch: torch.randint(0, 511, (batch, 8), generator=g) for batch in (2, 6)}

    def ops_per_added_row() -> float:
        counts = {batch: per_step_counts(model, ids, 8, {mode: (32, 16)})[mode][1] for batch, ids in prompts.items()}
        return (counts[6] - counts[2]) / 4

    batched = ops_per_added_row()
    monkeypatch.setattr(window_filling, "batch_form", lambda sampler: None)
    alone = ops_per_added_row()
    assert batched < alone / 4, (batched, alone)
