"""The server's connection limits (connections.py): half-sent requests are answered 408 and closed, a flood of
connections from one address is refused with a 503 before it exhausts the open-file limit, and neither floods the
log, prints tracebacks or holds up shutdown."""

import http.client
import logging
import os
import re
import resource
import select
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from live_server import MODEL_ID, LiveServer

from wedlm_hf.cli import console

PARTIAL_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
BODY_HEAD = PARTIAL_HEAD + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"


def connect(port: int, data: bytes, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    sock.sendall(data)
    return sock


def read_to_close(sock: socket.socket, deadline: float) -> bytes:
    """What the server sends until it closes the connection; fails if it is still open at `deadline` (monotonic)."""
    chunks = []
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            pytest.fail(f"the connection was still open at the deadline; received {b''.join(chunks)[:200]!r}")
        except ConnectionResetError:
            data = b""
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def completes(live: LiveServer) -> bool:
    out = live.client(timeout=60).completions.create(model=MODEL_ID, prompt="12 + 30 =", max_tokens=4)
    return out.usage.completion_tokens >= 1


class Records(logging.Handler):
    """Collects what the named loggers write (after their filters) while in a `with` block, at `level` or above.
    Enter it after the server is built: uvicorn's logging setup removes the handlers of its loggers."""

    def __init__(self, *names: str, level: int = logging.WARNING):
        super().__init__(level)
        self.loggers, self.records = [logging.getLogger(name) for name in names], []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> "Records":
        self.levels = [logger.level for logger in self.loggers]
        for logger in self.loggers:
            logger.addHandler(self)
            if logger.getEffectiveLevel() > self.level:
                logger.setLevel(self.level)
        return self

    def __exit__(self, *exc) -> None:
        for logger, level in zip(self.loggers, self.levels):
            logger.removeHandler(self)
            logger.setLevel(level)

    def saying(self, text: str) -> list[logging.LogRecord]:
        return [record for record in self.records if text in record.getMessage()]


def test_half_sent_requests_are_answered_408_and_closed():
    with LiveServer(request_read_timeout=1.0) as live:
        started = time.monotonic()
        sockets = [connect(live.port, PARTIAL_HEAD) for _ in range(50)]
        sockets += [connect(live.port, BODY_HEAD % 1000 + b'{"prompt":') for _ in range(20)]
        try:
            assert completes(live)  # the held connections keep nobody else out
            answers = [read_to_close(sock, started + 15) for sock in sockets]
        finally:
            for sock in sockets:
                sock.close()
        for answer in answers:
            assert answer.startswith(b"HTTP/1.1 408 ") and b"--request-read-timeout" in answer, answer[:300]
        assert live.health()["timed_out_requests"] == 70
        # A keep-alive connection that answered one request, then trickles the next one's headers.
        kept = http.client.HTTPConnection("127.0.0.1", live.port, timeout=30)
        try:
            kept.request("GET", "/health")
            assert kept.getresponse().read()
            kept.sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            assert read_to_close(kept.sock, time.monotonic() + 10).startswith(b"HTTP/1.1 408 ")
        finally:
            kept.close()
        assert live.health()["timed_out_requests"] == 71
        silent = connect(live.port, b"")  # a connection that sends nothing is closed as an idle one, no answer
        try:
            assert read_to_close(silent, time.monotonic() + 10) == b""
        finally:
            silent.close()
        upgrades = [  # served as plain HTTP (no WebSocket routes): each connection is released, none leaks
            connect(
                live.port,
                b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            )
            for _ in range(5)
        ]
        for sock in upgrades:
            sock.close()
        live.wait_for(lambda state: state["open_connections"] == 1)  # /health's own


ATTACKER = """
import json, resource, socket, sys, time, urllib.request
port, count = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)

def taken_in():  # connections the server has admitted or refused, besides this /health one
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
            state = json.load(answer)
    except OSError:
        return 0
    return state["open_connections"] - 1 + state["refused_connections"]

held, deadline = [], time.monotonic() + 20
while len(held) < count:  # all at once: the kernel queues them, the server accepts them a backlog at a time
    held.append(socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.2", 0)))
    try:
        held[-1].sendall(b"POST /v1/completions HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n")
    except OSError:  # refused and closed already
        pass
while time.monotonic() < deadline and taken_in() < len(held):
    time.sleep(0.01)
print(len(held), flush=True)
sys.stdin.read()  # holds them until the test closes stdin or kills this process
"""


def test_a_connection_flood_is_refused_within_the_open_file_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2000:
        pytest.skip(f"the attacker needs ~1,100 open files; the hard limit is {hard}")
    limit = 2 * len(os.listdir("/proc/self/fd")) + 400  # room for this process, the held share and a wave
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    attacker = None
    try:
        with LiveServer() as live, Records("uvicorn.error", "asyncio") as records:
            assert live.health()["max_connections"] == min(1024, limit // 2)  # derived from the lowered limit
            attacker = subprocess.Popen(
                [sys.executable, "-c", ATTACKER, str(live.port), "1100"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert select.select([attacker.stdout], [], [], 60)[0], "the attacker did not finish connecting"
            assert attacker.stdout.readline().strip() == "1100"  # all connected (refused ones closed by now)
            state = live.health()
            share = state["max_connections"] - state["max_connections"] // 4  # what one address may hold
            assert state["refused_connections"] > 0 and state["open_connections"] <= share + 1  # + this /health
            assert completes(live)
            attacker.stdin.close()
            assert attacker.wait(30) == 0
        assert not [r for r in records.records if r.exc_info or "open files" in r.getMessage()], records.records
        assert 1 <= len(records.saying("Refused a connection")) <= 3  # not one line per connection
    finally:
        if attacker is not None:
            attacker.kill()
            attacker.wait()
            attacker.stdout.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_cut_upload_is_one_log_line_without_a_traceback():
    with LiveServer() as live, Records("uvicorn.error", "asyncio", level=logging.INFO) as records:
        # its own source address: RepeatedLines would hide a line another test wrote within the last 10 s
        connect(live.port, BODY_HEAD % 100_000 + b"x" * 1000, source="127.0.0.3").close()
        live.wait_for(lambda state: records.saying("127.0.0.3"), timeout=10)
        assert completes(live)
    assert [r.getMessage() for r in records.saying("127.0.0.3")] == [
        "A client from 127.0.0.3 went away before its request arrived whole."
    ]
    assert not [r for r in records.records if r.exc_info], records.records


def test_sigterm_closes_stalled_uploads_at_once(tmp_path):
    log_path = tmp_path / "serve.log"
    command = [sys.executable, "-m", "wedlm_hf.cli", "serve", "--port", "0", "--threads", "1"]
    # a read timeout beyond the 30 s + 5 s backstop: only the shutdown itself may close the stalled uploads
    command += ["--shutdown-timeout", "30", "--request-read-timeout", "120"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    sockets = []
    try:
        deadline = time.monotonic() + 120
        while not (found := re.search(r"serving \S+ on http://127\.0\.0\.1:(\d+)", log_path.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        port = int(found.group(1))
        sockets = [connect(port, BODY_HEAD % 1000 + b'{"prompt": "' + b"x" * 480) for _ in range(5)]
        health = f"http://127.0.0.1:{port}/health"
        while httpx.get(health, timeout=10).json()["open_connections"] < 6:  # the five and /health's own
            assert time.monotonic() < deadline
            time.sleep(0.05)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
        assert time.monotonic() - started < 15
    finally:
        for sock in sockets:
            sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log_path.read_text()
    assert proc.returncode in (0, -signal.SIGTERM), text  # uvicorn re-raises the signal once it has shut down
    assert "Traceback" not in text and " 500" not in text, text


def test_max_connections_beyond_the_open_file_limit_is_one_line(capsys, monkeypatch):
    from wedlm_hf.serving.engine import ServingEngine

    monkeypatch.setattr(ServingEngine, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        status = console(["serve", "--max-connections", str(10**7)])
    except SystemExit as exit_:
        status = exit_.code
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, limit)  # serve raised the soft limit to the hard one
    err = capsys.readouterr().err
    assert status == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("wedlm-hf serve: error: --max-connections 10000000 ") and "open-file limit" in err, err
