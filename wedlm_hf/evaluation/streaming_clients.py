"""Concurrent streaming clients against one OpenAI-compatible server, timed: what `wedlm-hf bench-serve` measures at
each concurrency level (requests/s, output tokens/s, time to first token, latency percentiles, and the gaps between a
stream's pieces: the longest is the costliest step a stream sat through)."""

import asyncio
import json
import math
import time
from dataclasses import dataclass


@dataclass
class RequestTiming:
    ttft: float
    latency: float
    tokens: int
    gaps: list[float]  # seconds between a stream's consecutive text pieces


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
    gap_p50: float  # over every gap of every stream (0 where no stream sent two pieces)
    gap_max: float


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
    start, arrivals, pieces, tokens = time.perf_counter(), [], [], None
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
                    arrivals.append(time.perf_counter())
                    pieces.append(choice["text"])
    end = time.perf_counter()
    if tokens is None:
        tokens = count_tokens("".join(pieces))
    gaps = [later - earlier for earlier, later in zip(arrivals, arrivals[1:])]
    return RequestTiming((arrivals[0] if arrivals else end) - start, end - start, tokens, gaps)


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
    latencies, gaps = [t.latency for t in timings], [gap for t in timings for gap in t.gaps] or [0.0]
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
        gap_p50=percentile(gaps, 50),
        gap_max=max(gaps),
    )


def _no_count(text: str) -> int:
    raise RuntimeError("the server sent no usage; pass count_tokens to count the streamed text")
