"""`wedlm-hf bench-serve`: N concurrent streaming clients against each server, all on 127.0.0.1 in one run.

Servers: `wedlm` = `wedlm-hf serve` (continuous batching, max batch 16); `wedlm-b1` = the same limited to batch size
1; `tf` / `tf-cb` = `transformers serve` (AR, without / with `--continuous-batching`) on the same weights saved as a
stock Qwen3 checkpoint. `transformers serve` needs transformers >= 5.24, newer than the suite's, so it runs from
another Python (`--transformers-serve-python`, e.g. a venv made as docs/benchmarks.md shows); without it those rows are
skipped. Each server is started, warmed up (one request, then one burst at the highest concurrency, untimed),
measured at every concurrency level (each client sends `--requests` greedy /v1/completions requests one after the
other, streamed), and stopped before the next starts. Reported: requests/s and output tokens/s over the level's
wall time, time to first token and request latency (p50 / p95).

`wedlm-tp` is `wedlm` split over `--tensor-parallel-size` ranks; `wedlm-bi` is `wedlm` with `--batch-invariant` (each
answer its solo answer), reported as its throughput over `wedlm`'s at every concurrency level; `--dtype` is every
server's.

`--rounds N` (N > 1) runs the servers side by side: all are started first, then each level is measured N times per
server, the servers taking turns in an order that rotates each round (`interleaved_runs.rotated`), and each server's
best round is kept, so that a busy machine slows every server alike. With one round, one server runs at a time.

`--workload shared-prefix` sends prompts that share a ~600-token start (a system prompt, a few-shot block) and end
in a short question each, to `wedlm` against `wedlm-nocache` (the same server with `--prefix-cache-tokens 0`).
`--workload long-prompt` is the mixed one where one request of each level (the first client's second) is a copying
prompt as long as the model's context allows: the others' streams are running when it joins, and the longest gap
between a stream's pieces (`gap max`) is the costliest step they sat through while its prompt was prefilled. Its
default server is `wedlm-nocache`: with the prefix cache the prompt would be prefilled once, at the warm-up.
"""

import json
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from .bench_report import Column, plural, ratio_line, table_head, table_row
from .interleaved_runs import rotated
from .server_process import ServerProcess, free_port
from .streaming_clients import LevelResult, run_level

SERVERS = {
    "wedlm": "wedlm-hf serve",
    "wedlm-b1": "wedlm-hf serve --max-batch-size 1",
    "wedlm-nocache": "wedlm-hf serve --prefix-cache-tokens 0",
    "wedlm-tp": "wedlm-hf serve --tensor-parallel-size N",
    "wedlm-bi": "wedlm-hf serve --batch-invariant",
    "tf": "transformers serve (AR)",
    "tf-cb": "transformers serve --continuous-batching (AR)",
}
# The words the shipped model learned to copy (its copying task draws from these).
_WORDS = (
    "apple river stone cloud tiger lamp orange seven piano forest candle mirror silver rocket garden window "
    "yellow thunder pencil planet bridge castle dragon ocean marble rabbit summer winter violin basket"
).split()


WORKLOADS = ("mixed", "shared-prefix", "long-prompt")
_DEFAULT_SERVERS = {
    "mixed": ("wedlm", "wedlm-b1", "tf", "tf-cb"),
    "shared-prefix": ("wedlm", "wedlm-nocache"),
    "long-prompt": ("wedlm-nocache",),  # with its prefix cache, a server would prefill the long prompt once
}
SHARED_PREFIX_TOKENS = 600  # the shared-prefix workload: a common start this long (the shipped context is 1,024)


def shared_prefix_prompts(count: int, count_tokens, seed: int = 0) -> list[str]:
    """A common start of about SHARED_PREFIX_TOKENS tokens (a long copying list, as a system prompt or few-shot
    block would be), then a short question of each request's own."""
    prefix = _word_list(SHARED_PREFIX_TOKENS, count_tokens, random.Random(f"shared-{seed}"))
    return [prefix + f" => ok.\n{question}" for question in bench_prompts(count, seed)]


def long_prompt_prompts(count: int, count_tokens, tokens: int, seed: int = 0) -> list[str]:
    """The mixed prompts, the second a copying prompt of about `tokens` tokens (at most)."""
    prompts = bench_prompts(count, seed)
    prompts[1 % count] = _word_list(tokens - 2, count_tokens, random.Random(f"long-{seed}"), at_most=True) + " =>"
    return prompts


def _word_list(tokens: int, count_tokens, rng: random.Random, at_most: bool = False) -> str:
    """A copying list (words the shipped model learned to copy) of `tokens` tokens or just past it (`at_most`: just
    short of it). Words are added a quarter of what is missing at a time: a few tokenizer calls for any length."""
    text = "copy:"
    while (missing := tokens - count_tokens(text)) > 0:
        words = [rng.choice(_WORDS) for _ in range(max(1, missing // 4))]
        longer = text + " " + " ".join(words)
        if at_most and count_tokens(longer) > tokens:
            longer = text + " " + words[0]
            if count_tokens(longer) > tokens:
                break
        text = longer
    return text


def bench_prompts(count: int, seed: int = 0) -> list[str]:
    """Counting and copying prompts, alternating, in the formats the shipped model was trained on."""
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        if i % 2 == 0:
            start, step, length = rng.randint(0, 200), rng.choice((1, 2, 5, 10)), rng.randint(16, 24)
            prompts.append(f"count from {start} by {step}, {length} numbers:")
        else:
            prompts.append("copy: " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 10))) + " =>")
    return prompts


def server_command(
    kind: str,
    port: int,
    model_dir: str,
    stock_dir: str | None,
    tf_python: str | None,
    threads: int,
    device: str = "cpu",
    dtype: str = "auto",
    tensor_parallel_size: int = 1,
) -> list[str]:
    if kind.startswith("wedlm"):
        batch = "1" if kind == "wedlm-b1" else "16"
        command = [sys.executable, "-m", "wedlm_hf.cli", "serve", "--port", str(port), "--max-batch-size", batch]
        if kind == "wedlm-nocache":
            command += ["--prefix-cache-tokens", "0"]
        if kind == "wedlm-tp":
            command += ["--tensor-parallel-size", str(tensor_parallel_size)]
        if kind == "wedlm-bi":
            command += ["--batch-invariant"]
        command += ["--dtype", dtype]
        return command + ["--threads", str(threads), "--model", model_dir, "--device", device]
    launcher = "import sys; from transformers.cli.transformers import main; sys.argv[0] = 'transformers'; main()"
    command = [tf_python, "-c", launcher, "serve", stock_dir, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--device", device, "--dtype", "auto" if dtype == "auto" else dtype]
    if kind == "tf-cb":  # on CPU the paged cache must be sized by hand, or it claims ~90% of RAM
        command += ["--continuous-batching", "--cb-num-blocks", "64", "--cb-max-batch-tokens", "512"]
    return command


def bench_serve(
    model: str | None = None,
    servers: tuple[str, ...] = tuple(SERVERS),
    clients: tuple[int, ...] = (1, 4, 16),
    requests_per_client: int = 2,
    max_tokens: int = 64,
    transformers_serve_python: str | None = None,
    threads: int = 1,
    device: str = "cpu",
    workload: str = "mixed",
    dtype: str = "auto",
    tensor_parallel_size: int = 2,
    rounds: int = 1,
    print_fn=print,
) -> list[LevelResult]:
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()

    from ..data import default_model_path

    _check_choices(servers, workload, min(clients), requests_per_client, max_tokens, rounds)
    model_dir = model or default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def count_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False).input_ids)

    wanted = list(servers)
    if any(s.startswith("tf") for s in wanted) and not transformers_serve_python:
        print_fn("transformers serve rows skipped: pass --transformers-serve-python (a Python with transformers>=5.24)")
        wanted = [s for s in wanted if not s.startswith("tf")]
    count = max(clients) * requests_per_client
    if workload == "shared-prefix":
        prompts = shared_prefix_prompts(count, count_tokens)
    elif workload == "long-prompt":  # as long as the context leaves room for the answer
        context = getattr(AutoConfig.from_pretrained(model_dir).get_text_config(), "max_position_embeddings", 4096)
        prompts = long_prompt_prompts(count, count_tokens, context - max_tokens - 16)
    else:
        prompts = bench_prompts(count)

    names: dict[str, str] = {}  # what each server calls its model
    stock_dir = None

    def level(kind: str, server: ServerProcess, n: int, requests: int = requests_per_client) -> LevelResult:
        return run_level(server.url, names[kind], n, requests, prompts, max_tokens, kind, count_tokens)

    def warmed(kind: str, server: ServerProcess) -> None:
        """Ready, and past an untimed warm-up (one request, then one burst at the highest concurrency)."""
        server.wait_ready()
        names[kind] = stock_dir if kind.startswith("tf") else _served_name(server.url)
        level(kind, server, 1, 1)
        level(kind, server, max(clients), 1)

    with tempfile.TemporaryDirectory(prefix="wedlm-bench-serve-") as scratch:
        if any(s.startswith("tf") for s in wanted):
            from .stock_qwen3 import save_stock_qwen3

            stock_dir = str(save_stock_qwen3(model_dir, Path(scratch) / "qwen3-stock"))
        options = (model_dir, stock_dir, transformers_serve_python, threads, device, dtype, tensor_parallel_size)

        def started(kind: str) -> ServerProcess:
            port = free_port()
            return ServerProcess(server_command(kind, port, *options), port, Path(scratch) / f"{kind}.log", threads)

        if rounds == 1:  # one server at a time
            return [r for kind in wanted for r in _levels_of(kind, started(kind), warmed, level, clients, print_fn)]
        return _side_by_side(wanted, started, warmed, level, clients, rounds, print_fn)


def _levels_of(kind, server, warmed, level, clients, print_fn) -> list[LevelResult]:
    """Every concurrency level against one server, which is stopped after."""
    try:
        warmed(kind, server)
        results = []
        for n in clients:
            results.append(level(kind, server, n))
            print_fn(_row(results[-1]), flush=True)
        return results
    finally:
        server.stop()


def _side_by_side(wanted, started, warmed, level, clients, rounds: int, print_fn) -> list[LevelResult]:
    """Every server started, then every level `rounds` times per server, the servers taking turns in a rotating
    order; each one's best round (most output tokens/s) is kept. Every server is stopped after."""
    servers = {}
    try:
        for kind in wanted:
            servers[kind] = started(kind)
        for kind, server in servers.items():
            warmed(kind, server)
        results = []
        for n in clients:
            best: dict[str, LevelResult] = {}
            for round_ in range(rounds):
                for kind in rotated(list(servers), round_):
                    result = level(kind, servers[kind], n)
                    if kind not in best or result.tokens_per_s > best[kind].tokens_per_s:
                        best[kind] = result
            for kind in servers:
                results.append(best[kind])
                print_fn(_row(best[kind]), flush=True)
        return results
    finally:
        for server in servers.values():
            server.stop()


def _check_choices(servers, workload: str, fewest_clients: int, requests_per_client: int, max_tokens: int, rounds: int):
    unknown = sorted(set(servers) - set(SERVERS))
    if unknown:
        raise ValueError(f"Unknown server(s) {unknown}: choose from {', '.join(SERVERS)}.")
    if workload not in WORKLOADS:
        raise ValueError(f"Unknown workload {workload!r}: choose from {', '.join(WORKLOADS)}.")
    if fewest_clients < 1 or requests_per_client < 1 or max_tokens < 1 or rounds < 1:
        raise ValueError("--clients, --requests, --max-tokens and --rounds must be at least 1.")


def _served_name(url: str) -> str:
    import httpx

    return httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]


COLUMNS = [
    Column("server", 10, align="<"),
    Column("clients", 7),
    Column("requests", 8),
    Column("req/s", 7, ".2f"),
    Column("out tok/s", 9, ".1f"),
    Column("TTFT p50", 9, ".3f", "s"),
    Column("lat p50", 8, ".2f", "s"),
    Column("lat p95", 8, ".2f", "s"),
    Column("gap p50", 8, ".3f", "s"),
    Column("gap max", 8, ".3f", "s"),
]
HEADER = table_head(COLUMNS, sep=" ")


def _row(r: LevelResult) -> str:
    values = [r.server, r.clients, r.requests, r.requests_per_s, r.tokens_per_s]
    timings = [r.ttft_p50, r.latency_p50, r.latency_p95, r.gap_p50, r.gap_max]
    return table_row(COLUMNS, [*values, *timings], sep=" ")


def summary(results: list[LevelResult]) -> list[str]:
    """Throughput of `wedlm` over each other server at the highest concurrency they share; of `wedlm-bi` (the
    batch-invariant server) over `wedlm` at every concurrency they share."""
    lines = []
    by = {(r.server, r.clients): r for r in results}
    for r in results:
        if r.server == "wedlm-bi" and ("wedlm", r.clients) in by:
            ratio = r.tokens_per_s / by[("wedlm", r.clients)].tokens_per_s
            label = f"wedlm-bi / wedlm output tokens/s at {plural(r.clients, 'client')}"
            lines.append(ratio_line(label, ratio, f" (the switch costs {1 - ratio:.0%})"))
    top = max((r.clients for r in results if r.server == "wedlm"), default=None)
    for other in ("wedlm-b1", "wedlm-nocache", "wedlm-tp", "tf", "tf-cb"):
        if top is not None and (other, top) in by:
            ratio = by[("wedlm", top)].tokens_per_s / by[(other, top)].tokens_per_s
            lines.append(ratio_line(f"wedlm / {other} output tokens/s at {top} clients", ratio))
            if other == "wedlm-nocache":
                faster = by[(other, top)].ttft_p50 / by[("wedlm", top)].ttft_p50
                label = f"time to first token p50, without / with the prefix cache at {top} clients"
                lines.append(ratio_line(label, faster))
    return lines


def bench_serve_command(args) -> None:
    """`wedlm-hf bench-serve`."""
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    print(f"workload: {args.workload}" + (f"; best of {args.rounds} side-by-side rounds" if args.rounds > 1 else ""))
    print(HEADER)
    try:
        results = bench_serve(
            model=args.model,
            servers=tuple(args.servers or _DEFAULT_SERVERS[args.workload]),
            clients=tuple(args.clients),
            requests_per_client=args.requests,
            max_tokens=args.max_tokens,
            transformers_serve_python=args.transformers_serve_python,
            threads=args.threads,
            device=args.device,
            workload=args.workload,
            dtype=args.dtype,
            tensor_parallel_size=args.tensor_parallel_size,
            rounds=args.rounds,
        )
    except (ValueError, RuntimeError) as exc:
        raise SystemExit(f"wedlm-hf bench-serve: {exc}") from None
    for line in summary(results):
        print(line)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
