"""A server in its own process on 127.0.0.1, on a port chosen before it binds it: started, waited for, stopped.

`free_port` is also what tests use to tell a server (or a rendezvous store) its port in advance.
"""

import os
import random
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

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
