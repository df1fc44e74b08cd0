"""What one client can do to the others: nothing beyond a bounded share (issue 14's hostile cases).

The real `wedlm-hf serve` command in a subprocess takes the oversized bodies and prompts (its peak RSS is read from
/proc); the in-process server (live_server) takes the fairness, seeding and access cases with the official client.
Timing assertions are relative and generous: a small request under load within 10x its unloaded latency.
"""

import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
from live_server import MODEL_ID, LiveServer, engine

from wedlm_hf.cli import console
from wedlm_hf.serving.engine import default_model_name

JSON = {"Content-Type": "application/json"}


# ---- the real command: oversized bodies, prompts that cannot fit, the bound address ----------------------------


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return int(re.search(r"VmHWM:\s+(\d+) kB", status.read()).group(1)) / 1024


def raw_request(port: int, head: bytes, body: bytes = b"") -> bytes:
    """Sends a request (possibly a truncated body) on a raw socket and reads the response until it is closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + body)
        chunks = []
        while True:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not data:
                break
            chunks.append(data)
            if b"\r\n\r\n" in b"".join(chunks) and b"}" in data:
                break
    return b"".join(chunks)


@pytest.fixture(scope="module")
def process(tmp_path_factory):
    """`wedlm-hf serve --port 0 --served-model-name tiny`; yields (process, base url, log path)."""
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    command = [sys.executable, "-m", "wedlm_hf.cli", "serve", "--port", "0", "--threads", "1"]
    proc = subprocess.Popen(
        command + ["--served-model-name", "tiny"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 120
        while not (found := re.search(r"serving tiny on (http://127\.0\.0\.1:(\d+))", log_path.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        url = found.group(1)
        assert int(found.group(2)) != 0  # the bound port, not the 0 asked for
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        yield proc, url, log_path
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    assert "Traceback" not in log_path.read_text()


def test_an_oversized_body_is_refused_before_it_is_read(process):
    proc, url, _ = process
    port = int(url.rsplit(":", 1)[1])
    before = peak_rss_mb(proc.pid)
    declared = 50 * 1024 * 1024
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {declared}\r\n\r\n".encode()
    )
    started = time.monotonic()
    response = raw_request(port, head, b'{"prompt": "' + b"x" * 65536)
    assert response.startswith(b"HTTP/1.1 413"), response[:300]
    assert b"--max-request-bytes" in response and time.monotonic() - started < 10
    # A body sent in chunks, with no declared length, is cut off once it passes the limit.
    chunked = httpx.post(
        f"{url}/v1/completions",
        content=iter([b'{"prompt": "'] + [b"y" * 65536] * 20 + [b'"}']),
        headers=JSON,
        timeout=30,
    )
    assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "request_too_large"
    assert peak_rss_mb(proc.pid) - before < 100


def test_a_prompt_that_cannot_fit_is_refused_quickly_and_health_keeps_answering(process):
    proc, url, _ = process
    before = peak_rss_mb(proc.pid)
    body = json.dumps({"model": "tiny", "prompt": "count " * 170_000})  # ~1 MB: 170,000 tokens, context 1,024
    answers, done = [], threading.Event()

    def poll_health():
        while not done.is_set() or len(answers) < 2:
            started = time.monotonic()
            assert httpx.get(f"{url}/health", timeout=30).status_code == 200
            answers.append(time.monotonic() - started)

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        health = pool.submit(poll_health)
        posts = [
            pool.submit(httpx.post, f"{url}/v1/completions", content=body, headers=JSON, timeout=60) for _ in (1, 2)
        ]
        responses = [p.result() for p in posts]
        elapsed = time.monotonic() - started
        done.set()
        health.result()
    for response in responses:
        error = response.json()["error"]
        assert response.status_code == 400 and error["code"] == "context_length_exceeded", error
        assert "at least" in error["message"] and "1024" in error["message"]
    assert elapsed < 10 and max(answers) < 2, (elapsed, answers)
    assert peak_rss_mb(proc.pid) - before < 100


def test_the_served_name_hides_the_model_path(process):
    _, url, log_path = process
    models = httpx.get(f"{url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    health = httpx.get(f"{url}/health", timeout=10).text
    assert health.count("tiny") == 1 and "/" not in json.loads(health)["model"]
    wrong = httpx.post(f"{url}/v1/completions", json={"model": "default_model", "prompt": "x"}, timeout=10)
    assert wrong.status_code == 404 and wrong.json()["error"]["param"] == "model"


def test_default_model_names_are_never_paths(tmp_path):
    folder = tmp_path / "my-wedlm"
    folder.mkdir()
    assert default_model_name(str(folder)) == default_model_name(str(folder) + "/") == "my-wedlm"
    assert default_model_name(None) == MODEL_ID
    assert default_model_name("tencent/WeDLM-8B-Instruct") == "tencent/WeDLM-8B-Instruct"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--port", "70000"], "--port: '70000' is not a TCP port"),
        (["--port", "-1"], "--port: '-1' is not a TCP port"),
        (["--device", "nonsense"], "--device 'nonsense' is not a torch device"),
        (["--device", "cuda:0"], "--device 'cuda:0' cannot be used"),
        (["--max-window-size", "40", "--max-step-tokens", "64"], "--max-step-tokens (64) must be at least twice"),
        (["--max-request-rows", "10", "--max-queue", "5"], "--max-request-rows (10) cannot exceed --max-queue (5)"),
    ],
)
def test_bad_serve_options_are_one_line_before_the_model_loads(argv, message, capsys, monkeypatch):
    if argv[:2] == ["--device", "cuda:0"] and __import__("torch").cuda.is_available():
        pytest.skip("a GPU is present: cuda:0 is a usable device")
    from wedlm_hf.serving.engine import ServingEngine

    monkeypatch.setattr(ServingEngine, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    try:
        status = console(["serve", *argv])
    except SystemExit as exit_:  # argparse's errors
        status = exit_.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert status in (1, 2) and len(lines) == 1, lines
    assert lines[0].startswith("wedlm-hf serve: error: ") and message in lines[0], lines


# ---- fairness: one request cannot take the whole batch -----------------------------------------------------------

ONE_PER_STEP = {"wedlm_window_size": 1, "wedlm_entropy_threshold": None}


def small_latency(client) -> float:
    started = time.monotonic()
    out = client.completions.create(model=MODEL_ID, prompt="12 + 30 =", max_tokens=4, extra_body=ONE_PER_STEP)
    assert out.usage.completion_tokens >= 1
    return time.monotonic() - started


def test_a_small_request_is_admitted_beside_a_request_of_many_rows():
    with LiveServer(engine(max_batch_size=4, max_queue=64)) as live:
        client = live.client(timeout=300)
        unloaded = min(small_latency(client) for _ in range(3))
        big = {"prompt": [f"count from {i} by 3, 30 numbers:" for i in range(8)], "n": 4, "max_tokens": 40}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(httpx.post, f"{live.url}/v1/completions", json={**big, **ONE_PER_STEP}, timeout=600)
            state = live.wait_for(lambda h: h["live_rows"] == 3 and h["waiting_rows"] == 29)
            assert state["max_batch_size"] == 4  # one request holds 3 of 4 slots: a quarter stays for others
            loaded = small_latency(client)
            assert live.health()["waiting_rows"] > 0, "the big request must still be waiting for the comparison"
            assert running.result().status_code == 200
        assert loaded < 10 * unloaded, (loaded, unloaded)


def test_rows_not_requests_fill_the_queue():
    with LiveServer(engine(max_batch_size=1, max_queue=6, max_request_rows=4)) as live:
        client = live.client()
        too_many = httpx.post(f"{live.url}/v1/completions", json={"prompt": "x", "n": 5}, timeout=30)
        assert too_many.status_code == 400 and too_many.json()["error"]["code"] == "too_many_rows"
        assert "--max-request-rows" in too_many.json()["error"]["message"]
        long_body = {**ONE_PER_STEP, "max_tokens": 600}
        running = client.completions.create(model=MODEL_ID, prompt="def main():", stream=True, extra_body=long_body)
        next(iter(running))  # the one batch slot is taken
        waiting = threading.Thread(
            target=lambda: client.completions.create(model=MODEL_ID, prompt="x", n=4, max_tokens=2)
        )
        waiting.start()
        live.wait_for(lambda h: h["waiting_rows"] == 4)
        full = httpx.post(f"{live.url}/v1/completions", json={"prompt": "x", "n": 3, "max_tokens": 2}, timeout=30)
        assert full.status_code == 429 and "rows" in full.json()["error"]["message"]
        fits = threading.Thread(target=lambda: client.completions.create(model=MODEL_ID, prompt="x", n=2, max_tokens=2))
        fits.start()
        live.wait_for(lambda h: h["waiting_rows"] == 6)
        running.close()
        for thread in (waiting, fits):
            thread.join(120)
            assert not thread.is_alive()


# ---- seeded sampling does not depend on the batch ----------------------------------------------------------------

SEEDED = {"prompt": "def parse(", "max_tokens": 24, "temperature": 1.5}


@pytest.mark.parametrize("lossless", [False, True], ids=["default", "lossless"])
def test_a_seeded_request_repeats_its_answer_whatever_shares_its_batch(lossless):
    options = {"wedlm_window_size": 8, "wedlm_entropy_threshold": 0.8, "wedlm_lossless": lossless}
    others = [
        {"prompt": "count from 100 by 5, 24 numbers:", "max_tokens": 30, "wedlm_window_size": 16},
        {"prompt": "def main():\n    " * 20, "max_tokens": 20, "temperature": 0.9, "wedlm_lossless": not lossless},
        {"prompt": "sort([5, 3, 9, 1]) =", "max_tokens": 12, "temperature": 1.2, "seed": 3, "wedlm_window_size": 3},
        {"prompt": "12 + 30 =", "max_tokens": 8, "n": 3, "temperature": 0.7},
    ]
    with LiveServer() as live:
        client = live.client(timeout=120)

        def seeded():
            out = client.completions.create(model=MODEL_ID, seed=11, **SEEDED, extra_body=options)
            return out.choices[0].text

        def other(body):
            return httpx.post(f"{live.url}/v1/completions", json=body, timeout=120).status_code

        alone = seeded()
        assert alone == seeded()
        different = client.completions.create(model=MODEL_ID, seed=12, **SEEDED, extra_body=options)
        assert different.choices[0].text != alone  # the seed matters, so the comparison below can fail
        with concurrent.futures.ThreadPoolExecutor(len(others) + 1) as pool:
            for shift in range(3):  # the seeded request joins at different points of the others' decoding
                futures = [pool.submit(other, body) for body in others]
                time.sleep(0.05 * shift)
                assert seeded() == alone
                assert all(f.result() == 200 for f in futures)


# ---- who may send requests -----------------------------------------------------------------------------------------


def test_host_content_type_and_api_key_are_checked():
    with LiveServer(api_key="s3cret") as live:
        body = {"model": MODEL_ID, "prompt": "12 + 30 =", "max_tokens": 2}
        auth = {"Authorization": "Bearer s3cret"}
        ok = httpx.post(f"{live.url}/v1/completions", json=body, headers=auth, timeout=30)
        assert ok.status_code == 200
        for host in ("localhost", f"localhost:{live.port}", "[::1]:80"):
            response = httpx.post(f"{live.url}/v1/completions", json=body, headers={**auth, "Host": host}, timeout=30)
            assert response.status_code == 200, host
        rebound = httpx.post(f"{live.url}/v1/completions", json=body, headers={**auth, "Host": "evil.example"})
        assert rebound.status_code == 400 and rebound.json()["error"]["code"] == "invalid_host"
        assert "--allowed-hosts" in rebound.json()["error"]["message"]
        as_text = httpx.post(
            f"{live.url}/v1/completions",
            content=json.dumps(body),
            headers={**auth, "Content-Type": "text/plain"},
            timeout=30,
        )
        assert as_text.status_code == 415 and "application/json" in as_text.json()["error"]["message"]
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            response = httpx.post(f"{live.url}/v1/completions", json=body, headers=headers, timeout=30)
            assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{live.url}/v1/models", timeout=30).status_code == 401
        assert httpx.get(f"{live.url}/health", timeout=30).status_code == 200
        with pytest.raises(openai.AuthenticationError):
            live.client().completions.create(model=MODEL_ID, prompt="x", max_tokens=2)
        keyed = openai.OpenAI(base_url=f"{live.url}/v1", api_key="s3cret", max_retries=0)
        assert keyed.completions.create(model=MODEL_ID, prompt="12 + 30 =", max_tokens=2).choices[0].text


def test_allowed_hosts_can_be_widened():
    with LiveServer(allowed_hosts=["wedlm.internal"]) as live:
        body = {"prompt": "x", "max_tokens": 1}
        named = httpx.post(f"{live.url}/v1/completions", json=body, headers={"Host": "wedlm.internal:8000"})
        assert named.status_code == 200
        assert httpx.post(f"{live.url}/v1/completions", json=body).status_code == 400  # 127.0.0.1 is not listed
    with LiveServer(allowed_hosts=["*"]) as live:
        anything = httpx.post(f"{live.url}/v1/completions", json=body, headers={"Host": "evil.example"})
        assert anything.status_code == 200


def test_the_command_line_defaults_are_the_limits_defaults():
    from wedlm_hf.cli import build_parser
    from wedlm_hf.serving.limits import ServingLimits
    from wedlm_hf.serving.server import limits_from_args

    assert limits_from_args(build_parser().parse_args(["serve"])) == ServingLimits()
    # a small --max-queue lowers the default --max-request-rows with it, as the Python API does
    small = limits_from_args(build_parser().parse_args(["serve", "--max-queue", "2"]))
    assert (small.max_queue, small.max_request_rows) == (2, 2)
    with pytest.raises(ValueError, match="cannot exceed --max-queue"):
        limits_from_args(build_parser().parse_args(["serve", "--max-queue", "2", "--max-request-rows", "3"]))
