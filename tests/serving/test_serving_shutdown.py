"""Shutdown with requests in flight: they finish within the grace time, or end with an error; nothing hangs.

The signal tests run the real `wedlm-hf serve` command in a subprocess (signals reach only a main thread).
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from live_server import MODEL_ID, LiveServer, offline_text

from wedlm_hf.evaluation.server_process import free_port

LONG = {"prompt": "def main():", "max_tokens": 900, "wedlm_window_size": 1, "wedlm_entropy_threshold": None}


def read_stream(url: str, body: dict, first_chunk: threading.Event, out: dict) -> None:
    """Reads one SSE response to its end; `out["events"]` gets every data payload."""
    events = []
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[len("data: ") :])
                    first_chunk.set()
    except httpx.HTTPError as exc:
        out["error"] = exc
    out["events"] = events
    first_chunk.set()


def test_shutdown_lets_running_requests_finish():
    prompts = ["count from 7 by 1, 12 numbers:", "copy: apple river stone cloud tiger =>"]
    expected = [offline_text(p, 24) for p in prompts]
    live = LiveServer(shutdown_timeout=120).__enter__()
    outs, started = [{}, {}], [threading.Event(), threading.Event()]
    threads = [
        threading.Thread(target=read_stream, args=(live.url, {"prompt": p, "max_tokens": 24}, started[i], outs[i]))
        for i, p in enumerate(prompts)
    ]
    for t in threads:
        t.start()
    for event in started:
        assert event.wait(60)
    live.stop()  # returns once the in-flight responses are complete
    for t in threads:
        t.join(60)
    for out, (text, reason, _) in zip(outs, expected):
        assert "error" not in out and out["events"][-1] == "[DONE]"
        chunks = [json.loads(e) for e in out["events"][:-1]]
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == text
        assert chunks[-1]["choices"][0]["finish_reason"] == reason
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{live.url}/health", timeout=5)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_ends_requests_still_running_with_an_error_and_the_process_exits(sig, tmp_path):
    port = free_port()
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - closed below
    command = [sys.executable, "-m", "wedlm_hf.cli", "serve", "--port", str(port), "--shutdown-timeout", "0"]
    process = subprocess.Popen(
        command + ["--threads", "1"], stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        streamed, started = {}, threading.Event()
        reader = threading.Thread(target=read_stream, args=(url, LONG, started, streamed))
        plain = {}
        poster = threading.Thread(
            target=lambda: plain.update(response=httpx.post(f"{url}/v1/completions", json=LONG, timeout=120))
        )
        reader.start()
        poster.start()
        assert started.wait(60)
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/health", timeout=5).json()["live_rows"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        process.send_signal(sig)
        process.wait(60)  # raises TimeoutExpired if the server hangs
        reader.join(30)
        poster.join(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
    output = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in output, output
    assert process.returncode in (0, -signal.SIGTERM), output
    events = streamed["events"]
    assert events[-1] == "[DONE]" and "shut down" in json.loads(events[-2])["error"]["message"]
    response = plain["response"]
    assert response.status_code == 503 and "shut down" in response.json()["error"]["message"]
    assert MODEL_ID in output  # the startup line names the model it served
