"""`wedlm-hf bench-serve`: N concurrent streaming clients against each server, all on 127.0.0.1 in one run.

Servers: `wedlm` = `wedlm-hf serve` (continuous batching, max batch 16); `wedlm-b1` = the same limited to batch size
1; `tf` / `tf-cb` = `transformers serve` (AR, without / with `--continuous-batching`) on the same weights saved as a
stock Qwen3 checkpoint. `transformers serve` needs transformers >= 5.24, newer than the suite's, so it runs from
another Python (`--transformers-serve-python`, e.g. a venv made as docs/benchmarks.md shows); without it those rows are
skipped. Each server is started, warmed up (one request, then one burst at the highest concurrency, untimed),
measured at every concurrency level (each client sends `--requests` greedy /v1/completions requests one after the
other, streamed), and stopped before the next starts. Reported: requests/s and output tokens/s over the level's
wall time, time to first token and request latency (p50 / p95).

`wedlm-tp` is `wedlm` split over `--tensor-parallel-size` ranks; `--dtype` is every server's.

`--workload shared-prefix` sends prompts that share a ~600-token start (a system prompt, a few-shot block) and end
in a short question each, to `wedlm` against `wedlm-nocache` (the same server with `--prefix-cache-tokens 0`).
"""

import asyncio
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SERVERS = {
    "wedlm": "wedlm-hf serve",
    "wedlm-b1": "wedlm-hf serve --max-batch-size 1",
    "wedlm-nocache": "wedlm-hf serve --prefix-cache-tokens 0",
    "wedlm-tp": "wedlm-hf serve --tensor-parallel-size N",
    "tf": "transformers serve (AR)",
    "tf-cb": "transformers serve --continuous-batching (AR)",
}
# The words the shipped model learned to copy (its copying task draws from these).
_WORDS = (
    "apple river stone cloud tiger lamp orange seven piano forest candle mirror silver rocket garden window "
    "yellow thunder pencil planet bridge castle dragon ocean marble rabbit summer winter violin basket"
).split()


WORKLOADS = ("mixed", "shared-prefix")
_DEFAULT_SERVERS = {"mixed": ("wedlm", "wedlm-b1", "tf", "tf-cb"), "shared-prefix": ("wedlm", "wedlm-nocache")}
SHARED_PREFIX_TOKENS = 600  # the shared-prefix workload: a common start this long (the shipped context is 1,024)


def shared_prefix_prompts(count: int, count_tokens, seed: int = 0) -> list[str]:
    """A common start of about SHARED_PREFIX_TOKENS tokens (a long copying list, as a system prompt or few-shot
    block would be), then a short question of each request's own."""
    rng = random.Random(f"shared-{seed}")
    prefix = "copy:"
    while count_tokens(prefix) < SHARED_PREFIX_TOKENS:
        prefix += " " + " ".join(rng.choice(_WORDS) for _ in range(10))
    return [prefix + f" => ok.\n{question}" for question in bench_prompts(count, seed)]


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


@dataclass
class RequestTiming:
    ttft: float
    latency: float
    tokens: int


@dataclass
class LevelResult:
    server: str
    clients: int
    requests: int
    seconds: float
    requests_per_s: float
    tokens_per_s: float
    ttft_p50: float
    latency_p50: float
    latency_p95: float


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


async def _request(http, url: str, model: str, prompt: str, max_tokens: int, count_tokens) -> RequestTiming:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start, first, pieces, tokens = time.perf_counter(), None, [], None
    async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"{url}: {chunk['error']}")
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices") or []:
                if choice.get("text"):
                    first = first or time.perf_counter()
                    pieces.append(choice["text"])
    end = time.perf_counter()
    if tokens is None:
        tokens = count_tokens("".join(pieces))
    return RequestTiming((first or end) - start, end - start, tokens)


async def _level(url, model, clients, requests_per_client, prompts, max_tokens, count_tokens):
    import httpx

    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits) as http:

        async def client(c: int) -> list[RequestTiming]:
            return [
                await _request(
                    http, url, model, prompts[(c * requests_per_client + r) % len(prompts)], max_tokens, count_tokens
                )
                for r in range(requests_per_client)
            ]

        start = time.perf_counter()
        per_client = await asyncio.gather(*(client(c) for c in range(clients)))
        return [t for timings in per_client for t in timings], time.perf_counter() - start


def run_level(
    url: str,
    model: str,
    clients: int,
    requests_per_client: int,
    prompts: list[str],
    max_tokens: int,
    server: str = "",
    count_tokens=None,
) -> LevelResult:
    """`clients` concurrent streaming clients against `url`, each sending `requests_per_client` requests."""
    timings, seconds = asyncio.run(
        _level(url, model, clients, requests_per_client, prompts, max_tokens, count_tokens or _no_count)
    )
    latencies = [t.latency for t in timings]
    return LevelResult(
        server=server,
        clients=clients,
        requests=len(timings),
        seconds=seconds,
        requests_per_s=len(timings) / seconds,
        tokens_per_s=sum(t.tokens for t in timings) / seconds,
        ttft_p50=percentile([t.ttft for t in timings], 50),
        latency_p50=percentile(latencies, 50),
        latency_p95=percentile(latencies, 95),
    )


def _no_count(text: str) -> int:
    raise RuntimeError("the server sent no usage; pass count_tokens to count the streamed text")


_PORTS = random.SystemRandom()  # not the `random` module's state: a seeded test would make every run pick alike
_GIVEN: set[int] = set()  # ports this process was given, perhaps not bound yet: never given twice
_GIVING = threading.Lock()


def unassigned_ports() -> range | None:
    """Ports the kernel never hands out by itself (`bind(0)`, a client's `connect`): up to 12,000 below its
    ephemeral range, else above it; None where neither side has 1,000 (a range of nearly every port)."""
    try:
        low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2])
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default; other systems start theirs higher
    for ports in (range(max(1024, low - 12000), low), range(high + 1, min(65536, high + 12001))):
        if len(ports) >= 1000:
            return ports
    return None


def free_port() -> int:
    """A free 127.0.0.1 port for a server that binds it later, never the same twice in this process.

    A port the kernel hands out for `bind(0)` can be handed out again, to a rendezvous store, a gloo pair or any
    client socket, before the server that was told it binds it: the port comes from outside the kernel's range
    (`unassigned_ports`), drawn from the system's entropy, so that concurrent runs stay apart."""
    ports = unassigned_ports()
    with _GIVING:
        for _ in range(200):
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", 0 if ports is None else _PORTS.choice(ports)))
                except OSError:
                    continue
                port = sock.getsockname()[1]
            if port not in _GIVEN:
                _GIVEN.add(port)
                return port
    raise RuntimeError("no free port on 127.0.0.1 after 200 tries")


class ServerProcess:
    """A server in its own process on 127.0.0.1, ready once GET /health answers 200."""

    def __init__(self, command: list[str], port: int, log: Path, threads: int):
        self.port, self.log = port, log
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self._log_file = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, stdout=self._log_file, stderr=subprocess.STDOUT, env=env)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 300.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"the server did not answer /health within {timeout:.0f} s; log: {self.log}")

    def stop(self) -> None:
        """SIGINT, then SIGTERM, then SIGKILL (transformers serve with continuous batching ignores the first)."""
        for sig, wait in ((signal.SIGINT, 20), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            if self.process.poll() is not None:
                break
            self.process.send_signal(sig)
            try:
                self.process.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        self._log_file.close()


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
    print_fn=print,
) -> list[LevelResult]:
    from transformers import AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()

    from ..data import default_model_path

    unknown = sorted(set(servers) - set(SERVERS))
    if unknown:
        raise ValueError(f"Unknown server(s) {unknown}: choose from {', '.join(SERVERS)}.")
    if workload not in WORKLOADS:
        raise ValueError(f"Unknown workload {workload!r}: choose from {', '.join(WORKLOADS)}.")
    if min(clients) < 1 or requests_per_client < 1 or max_tokens < 1:
        raise ValueError("--clients, --requests and --max-tokens must be at least 1.")
    model_dir = model or default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def count_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False).input_ids)

    wanted = list(servers)
    if any(s.startswith("tf") for s in wanted) and not transformers_serve_python:
        print_fn("transformers serve rows skipped: pass --transformers-serve-python (a Python with transformers>=5.24)")
        wanted = [s for s in wanted if not s.startswith("tf")]
    count = max(clients) * requests_per_client
    prompts = shared_prefix_prompts(count, count_tokens) if workload == "shared-prefix" else bench_prompts(count)
    results = []
    with tempfile.TemporaryDirectory(prefix="wedlm-bench-serve-") as scratch:
        stock_dir = None
        if any(s.startswith("tf") for s in wanted):
            from .stock_qwen3 import save_stock_qwen3

            stock_dir = str(save_stock_qwen3(model_dir, Path(scratch) / "qwen3-stock"))
        for kind in wanted:
            port = free_port()
            command = server_command(
                kind,
                port,
                model_dir,
                stock_dir,
                transformers_serve_python,
                threads,
                device,
                dtype,
                tensor_parallel_size,
            )
            server = ServerProcess(command, port, Path(scratch) / f"{kind}.log", threads)
            try:
                server.wait_ready()
                name = stock_dir if kind.startswith("tf") else _served_name(server.url)
                run_level(server.url, name, 1, 1, prompts, max_tokens, kind, count_tokens)  # warm-up, untimed
                run_level(server.url, name, max(clients), 1, prompts, max_tokens, kind, count_tokens)
                for n in clients:
                    result = run_level(
                        server.url, name, n, requests_per_client, prompts, max_tokens, kind, count_tokens
                    )
                    results.append(result)
                    print_fn(_row(result), flush=True)
            finally:
                server.stop()
    return results


def _served_name(url: str) -> str:
    import httpx

    return httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]


HEADER = (
    f"{'server':<10} {'clients':>7} {'requests':>8} {'req/s':>7} {'out tok/s':>9} {'TTFT p50':>9} "
    f"{'lat p50':>8} {'lat p95':>8}"
)


def _row(r: LevelResult) -> str:
    return (
        f"{r.server:<10} {r.clients:>7} {r.requests:>8} {r.requests_per_s:>7.2f} {r.tokens_per_s:>9.1f} "
        f"{r.ttft_p50:>8.3f}s {r.latency_p50:>7.2f}s {r.latency_p95:>7.2f}s"
    )


def summary(results: list[LevelResult]) -> list[str]:
    """Throughput of `wedlm` over each other server at the highest concurrency they share."""
    lines = []
    by = {(r.server, r.clients): r for r in results}
    top = max((r.clients for r in results if r.server == "wedlm"), default=None)
    for other in ("wedlm-b1", "wedlm-nocache", "wedlm-tp", "tf", "tf-cb"):
        if top is not None and (other, top) in by:
            ratio = by[("wedlm", top)].tokens_per_s / by[(other, top)].tokens_per_s
            lines.append(f"wedlm / {other} output tokens/s at {top} clients: {ratio:.2f}x")
            if other == "wedlm-nocache":
                faster = by[(other, top)].ttft_p50 / by[("wedlm", top)].ttft_p50
                lines.append(
                    f"time to first token p50, without / with the prefix cache at {top} clients: {faster:.2f}x"
                )
    return lines


def bench_serve_command(args) -> None:
    """`wedlm-hf bench-serve`."""
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    print(f"workload: {args.workload}")
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
        )
    except (ValueError, RuntimeError) as exc:
        raise SystemExit(f"wedlm-hf bench-serve: {exc}") from None
    for line in summary(results):
        print(line)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
