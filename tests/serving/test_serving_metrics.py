"""`GET /metrics`: Prometheus' text format, read back with prometheus_client's own parser."""

import time

import httpx
import pytest
from live_server import MODEL_ID, LiveServer, shipped
from prometheus_client.parser import text_string_to_metric_families


def scrape(server) -> dict:
    response = httpx.get(f"{server.url}/metrics", timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_metrics_count_requests_tokens_and_latencies():
    with LiveServer(api_key="secret") as server:  # the scrape needs no key, as /health
        client = server.client(api_key="secret")
        usages = [client.completions.create(model=MODEL_ID, prompt=p, max_tokens=8).usage for p in ("12 + 30 =", "x")]
        streamed = client.completions.create(model=MODEL_ID, prompt="count to 5:", max_tokens=6, stream=True)
        assert [chunk for chunk in streamed]
        bad = httpx.post(
            f"{server.url}/v1/completions", json={"prompt": "x", "n": 0}, headers={"Authorization": "Bearer secret"}
        )
        assert bad.status_code == 400
        found = scrape(server)
    ok = (("route", "/v1/completions"), ("status", "200"))
    assert found["wedlm_requests_total", ok] == 3
    assert found["wedlm_requests_total", (("route", "/v1/completions"), ("status", "400"))] == 1
    tokens = found["wedlm_completion_tokens_total", ()]
    assert tokens >= sum(u.completion_tokens for u in usages) + 1
    assert found["wedlm_time_to_first_token_seconds_count", ()] == 3
    assert found["wedlm_request_latency_seconds_count", ()] == 3
    assert found["wedlm_tokens_per_forward", ()] == tokens / found["wedlm_decoding_forwards_total", ()]
    assert found["wedlm_live_rows", ()] == 0 and found["wedlm_waiting_rows", ()] == 0
    assert 0 <= found["wedlm_prefix_cache_hit_rate", ()] <= 1


def test_each_response_format_compile_is_timed():
    """Every request with a response_format observes its compile time once (for a schema seen before, that of the
    compiler's cache hit); free-text requests and refused schemas observe nothing."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    with LiveServer() as server:
        client = server.client()
        client.completions.create(model=MODEL_ID, prompt="n = ", max_tokens=4)
        for _ in range(3):
            client.completions.create(model=MODEL_ID, prompt="n = ", max_tokens=12, extra_body={"response_format": fmt})
        bad = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "strin"}}}
        refused = httpx.post(
            f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 4, "response_format": bad}, timeout=30
        )
        assert refused.status_code == 400
        found = scrape(server)
    assert found["wedlm_grammar_compile_seconds_count", ()] == 3
    assert 0 < found["wedlm_grammar_compile_seconds_sum", ()] < 60


def test_requests_whose_client_went_away_are_counted_as_such():
    """A stream abandoned after its first chunk and a plain request whose client timed out are counted with status
    499 (nginx's "client closed request"); before, requests that ended this way were missing from the counter."""
    # One token a forward and no drafts, so neither request can finish before its client leaves (about 4 s of work
    # here against the 0.3 s read timeout; the default mode writes 400 tokens in 0.2 s).
    slow = {"model": MODEL_ID, "prompt": "count to 500:", "max_tokens": 1000}
    no_end = {str(shipped()[1].eos_token_id): -100}
    slow |= {"wedlm_window_size": 1, "wedlm_context_drafts": False, "logit_bias": no_end}
    with LiveServer() as server:
        with httpx.stream("POST", f"{server.url}/v1/completions", json={**slow, "stream": True}, timeout=60) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: {"):
                    break  # one chunk, then the client goes away
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/completions", json=slow, timeout=httpx.Timeout(60, read=0.3))
        server.wait_for(lambda health: health["live_rows"] == 0 and health["open_requests"] == 0)
        gone = (("route", "/v1/completions"), ("status", "499"))
        deadline = time.monotonic() + 30
        while scrape(server).get(("wedlm_requests_total", gone)) != 2:  # counted as each handler ends
            assert time.monotonic() < deadline, scrape(server)
            time.sleep(0.05)
