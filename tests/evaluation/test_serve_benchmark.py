"""`wedlm-hf bench-serve` smoke test: the real command with servers (a) and (b) at tiny sizes (not a timing test)."""

import json
import random
import socket
import sys
from pathlib import Path

import pytest

from wedlm_hf.cli import main as cli
from wedlm_hf.evaluation.serve_benchmark import bench_prompts, server_command
from wedlm_hf.evaluation.server_process import free_port, unassigned_ports
from wedlm_hf.evaluation.streaming_clients import percentile, run_level

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))
from live_server import MODEL_ID, LiveServer  # noqa: E402


def test_clients_measure_a_live_server():
    with LiveServer() as server:
        result = run_level(
            server.url, MODEL_ID, clients=3, requests_per_client=2, prompts=bench_prompts(6), max_tokens=8
        )
        assert server.health()["completed"] == 6
    assert result.requests == 6 and result.tokens_per_s > 0 and result.requests_per_s > 0
    assert 0 < result.ttft_p50 <= result.latency_p50 <= result.latency_p95
    assert 0 < result.gap_p50 <= result.gap_max < result.latency_p95  # 8 tokens come in several pieces


def test_prompts_percentiles_and_baseline_commands():
    prompts = bench_prompts(4)
    assert prompts[0].startswith("count from ") and prompts[1].startswith("copy: ") and prompts == bench_prompts(4)
    assert percentile([4, 1, 3, 2], 50) == 2 and percentile(list(range(1, 21)), 95) == 19
    cb = server_command("tf-cb", 9000, "m", "/stock", "/py/python", 1)
    assert cb[0] == "/py/python" and "serve" in cb and "/stock" in cb and "--continuous-batching" in cb
    assert "--max-batch-size" in server_command("wedlm-b1", 9000, "m", None, None, 1)


def test_bench_serve_command_runs_serve_and_its_batch_size_1_twin(tmp_path, capsys):
    """With the long-prompt workload: one of the two requests fills the shipped model's context."""
    out = tmp_path / "bench.json"
    cli(
        ["bench-serve", "--servers", "wedlm", "wedlm-b1", "--clients", "2", "--requests", "1", "--max-tokens", "8"]
        + ["--workload", "long-prompt", "--json", str(out)]
    )
    printed = capsys.readouterr().out
    assert "transformers serve" not in printed and "wedlm / wedlm-b1 output tokens/s at 2 clients" in printed
    assert "gap max" in printed
    rows = json.loads(out.read_text())
    assert [(r["server"], r["clients"], r["requests"]) for r in rows] == [("wedlm", 2, 2), ("wedlm-b1", 2, 2)]
    assert all(r["gap_max"] >= r["gap_p50"] > 0 for r in rows)


def test_the_long_prompt_workload_fills_the_context_but_the_answer():
    from wedlm_hf.evaluation.serve_benchmark import long_prompt_prompts

    def count_tokens(text):
        return len(text.split())

    prompts = long_prompt_prompts(6, count_tokens, 300)
    assert 290 <= count_tokens(prompts[1]) <= 300 and prompts[1].startswith("copy: ") and prompts[1].endswith(" =>")
    assert prompts[:1] + prompts[2:] == bench_prompts(6)[:1] + bench_prompts(6)[2:]


def test_bench_serve_refuses_unknown_servers(capsys):
    with pytest.raises(SystemExit):
        cli(["bench-serve", "--servers", "vllm"])
    assert "argument --servers: invalid choice: 'vllm'" in capsys.readouterr().err


def test_shared_prefix_workload_prompts_and_servers():
    from wedlm_hf.evaluation.serve_benchmark import SHARED_PREFIX_TOKENS, shared_prefix_prompts

    words = shared_prefix_prompts(4, lambda text: len(text.split()))
    start = words[0].split(" => ok.")[0]
    assert len(start.split()) >= SHARED_PREFIX_TOKENS and all(p.startswith(start) for p in words)
    assert len(set(words)) == 4
    nocache = server_command("wedlm-nocache", 9000, "m", None, None, 1)
    assert nocache[nocache.index("--prefix-cache-tokens") + 1] == "0"
    split = server_command("wedlm-tp", 9000, "m", None, None, 1, "cpu", "bfloat16", 3)
    assert split[split.index("--tensor-parallel-size") + 1] == "3" and split[split.index("--dtype") + 1] == "bfloat16"
    assert "--tensor-parallel-size" not in nocache


def test_free_ports_lie_outside_the_ephemeral_range_and_differ_whatever_the_seed():
    """Servers are told a port before they bind it: one the kernel could hand a rendezvous store or a client socket
    meanwhile (its ephemeral range) would be lost, and a seeded `random` would give parallel runs the same ones."""
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not ranges.exists() or unassigned_ports() is None:
        pytest.skip("no ephemeral port range to stay out of here")
    low, high = (int(n) for n in ranges.read_text().split()[:2])
    state, ports = random.getstate(), []
    try:
        for _ in range(2):
            random.seed(0)
            ports += [free_port() for _ in range(20)]
    finally:
        random.setstate(state)
    assert len(set(ports)) == len(ports) and all(port >= 1024 and not low <= port <= high for port in ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))
