"""`GET /metrics`: the server's counters in Prometheus' text format (prometheus_client), one registry per app.

Counted as requests end: requests by route and HTTP status, completion tokens, decoding forwards, time to first
token and request latency (histograms); as requests are prepared, each response_format's compile time (a
histogram). Read from the decoding loop at each scrape: waiting rows and requests, live rows, tokens per forward
over all requests so far, and the prefix cache's hit rate and tokens.
"""

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, scheduler):
        self.registry = registry = CollectorRegistry()
        self._tokens = self._forwards = 0
        self.requests = Counter(
            "wedlm_requests", "Requests answered, by route and HTTP status.", ["route", "status"], registry=registry
        )
        self.tokens = Counter("wedlm_completion_tokens", "Completion tokens generated.", registry=registry)
        self.forwards = Counter("wedlm_decoding_forwards", "Decoding forwards, summed over rows.", registry=registry)
        self.first_token = Histogram(
            "wedlm_time_to_first_token_seconds",
            "From a request's arrival to its first token.",
            buckets=_SECONDS,
            registry=registry,
        )
        self.latency = Histogram(
            "wedlm_request_latency_seconds",
            "From a request's arrival to its last token.",
            buckets=_SECONDS,
            registry=registry,
        )

        self.grammar_compile = Histogram(
            "wedlm_grammar_compile_seconds",
            "Time to compile a request's response_format, in its worker thread (a schema seen before: its cache hit).",
            buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0),
            registry=registry,
        )

        def gauge(name: str, text: str, read) -> None:
            Gauge(name, text, registry=registry).set_function(read)

        gauge("wedlm_live_rows", "Rows decoding now.", lambda: scheduler.snapshot()["live_rows"])
        gauge("wedlm_waiting_rows", "Rows waiting to join the batch.", lambda: scheduler.snapshot()["waiting_rows"])
        gauge("wedlm_waiting_requests", "Requests with rows waiting.", lambda: scheduler.snapshot()["waiting_requests"])
        gauge("wedlm_tokens_per_forward", "Completion tokens / decoding forwards so far.", self._tokens_per_forward)
        cache = scheduler.prefix_cache
        gauge("wedlm_prefix_cache_hit_rate", "Lookups that found a cached prefix / lookups.", self._hit_rate(cache))
        gauge(
            "wedlm_prefix_cache_cached_tokens",
            "Prompt tokens served from the prefix cache.",
            lambda: cache.cached_tokens,
        )
        gauge("wedlm_prefix_cache_stored_tokens", "Tokens whose K/V the prefix cache holds.", lambda: cache.tokens)

    def _tokens_per_forward(self) -> float:
        return self._tokens / self._forwards if self._forwards else 0.0

    @staticmethod
    def _hit_rate(cache):
        return lambda: cache.hits / (cache.hits + cache.misses) if cache.hits + cache.misses else 0.0

    def finished(self, route: str, status: int, arrived: float, first: float | None, ended: float, tally=None):
        """A request ended (`tally`: its tokens and forwards, when it decoded)."""
        self.requests.labels(route, str(status)).inc()
        if tally is not None:
            self.tokens.inc(tally.completion_tokens)
            self.forwards.inc(tally.forwards)
            self._tokens += tally.completion_tokens
            self._forwards += tally.forwards
            self.latency.observe(ended - arrived)
            if first is not None:
                self.first_token.observe(first - arrived)

    def render(self) -> bytes:
        return generate_latest(self.registry)
