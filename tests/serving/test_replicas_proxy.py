"""examples/replicas/nginx.conf, as shipped (only its ports moved to free ones), in front of two real `wedlm-hf serve`
replicas: it balances requests over both, keeps a conversation on one replica, streams, and one replica's death
leaves the other serving. Needs Debian's nginx (scripts/setup.sh installs it where it may)."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from wedlm_hf.evaluation.server_process import free_port

CONFIG = Path(__file__).parents[2] / "examples" / "replicas" / "nginx.conf"
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
pytestmark = [
    pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)"),
    pytest.mark.heavy,  # three processes: two servers and nginx
]


def wait_healthy(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 180
    while True:
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)


def completed(port: int) -> int:
    return httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["completed"]


def test_nginx_balances_two_replicas_and_survives_one(tmp_path):
    ports = [free_port(), free_port()]
    processes = []
    try:
        for port in ports:
            log = tmp_path / f"replica-{port}.log"
            command = [sys.executable, "-m", "wedlm_hf.cli", "serve", "--port", str(port), "--threads", "1"]
            env = {**os.environ, "HF_HUB_OFFLINE": "1"}
            processes.append((subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env), log))
        for port, (process, log) in zip(ports, processes):
            wait_healthy(f"http://127.0.0.1:{port}", process, log)

        proxy_port = free_port()
        config = CONFIG.read_text()
        for old, new in (("127.0.0.1:8001", ports[0]), ("127.0.0.1:8002", ports[1]), ("127.0.0.1:8000", proxy_port)):
            assert old in config
            config = config.replace(old, f"127.0.0.1:{new}")
        prefix = tmp_path / "nginx"
        (prefix / "logs").mkdir(parents=True)
        (prefix / "tmp").mkdir()
        (tmp_path / "nginx.conf").write_text(config)
        nginx_log = tmp_path / "nginx.out"
        nginx = subprocess.Popen(
            [NGINX, "-p", str(prefix), "-c", str(tmp_path / "nginx.conf"), "-g", "daemon off;"],
            stdout=nginx_log.open("w"),
            stderr=subprocess.STDOUT,
        )
        processes.append((nginx, nginx_log))
        proxy = f"http://127.0.0.1:{proxy_port}"
        wait_healthy(proxy, nginx, nginx_log)

        body = {"prompt": "count from 7 by 1, 12 numbers:", "max_tokens": 8}
        for _ in range(24):  # no conversation id: spread over both replicas (all on one: p < 1e-4)
            assert httpx.post(f"{proxy}/v1/completions", json=body, timeout=120).status_code == 200
        spread = [completed(port) for port in ports]
        assert min(spread) > 0 and sum(spread) == 24, spread

        conversation = {"X-Conversation-Id": "conversation-42"}
        for _ in range(4):  # one conversation: one replica
            assert httpx.post(f"{proxy}/v1/completions", json=body, headers=conversation, timeout=120).is_success
        grown = [completed(port) - before for port, before in zip(ports, spread)]
        assert sorted(grown) == [0, 4], grown

        with httpx.stream("POST", f"{proxy}/v1/completions", json={**body, "stream": True}, timeout=120) as response:
            events = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) > 2

        sticky = ports[grown.index(4)]  # the replica that held the conversation dies
        victim = next(p for (p, _), port in zip(processes, ports) if port == sticky)
        victim.kill()
        victim.wait(30)
        for _ in range(4):
            response = httpx.post(f"{proxy}/v1/completions", json=body, headers=conversation, timeout=120)
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["text"]
    finally:
        for process, _ in processes:
            if process.poll() is None:
                process.kill()
                process.wait(30)
