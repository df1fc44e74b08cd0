"""Drives Debian's headless chromium over the Chrome DevTools Protocol (one websocket, JSON commands).

Real input events: text arrives through `Input.insertText` and clicks are mouse presses at the element's centre,
so the page is used the way a person would use it. Only `websocket-client` is needed besides the browser.
"""

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

import websocket

from wedlm_hf.evaluation.server_process import free_port

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--mute-audio",
    "--window-size=1100,800",
]


def find_or_install_chromium() -> tuple[str | None, str]:
    """(path to chromium, why not) — installs Debian's package with apt-get when missing and allowed."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found, ""
    if not shutil.which("apt-get") or os.geteuid() != 0:
        return None, "chromium is not installed and apt-get cannot install it here (needs Debian and root)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            return None, f"chromium is not installed and `{' '.join(command)}` failed: {done.stderr[-300:]}"
    found = shutil.which("chromium")
    return found, "" if found else "apt-get installed chromium but it is not on PATH"


class Browser:
    def __init__(self, executable: str):
        self.profile = tempfile.mkdtemp(prefix="wedlm-chromium-")
        port = free_port()
        self.process = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={self.profile}", f"--remote-debugging-port={port}"]
            + ["--remote-debugging-address=127.0.0.1", "--remote-allow-origins=*", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as answer:
                    page = next(t for t in json.load(answer) if t["type"] == "page")
                break
            except (OSError, StopIteration, ValueError):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError("chromium did not open its DevTools endpoint") from None
                time.sleep(0.1)
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self._next_id = 0

    def send(self, method: str, **params) -> dict:
        self._next_id += 1
        ident = self._next_id
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def eval(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.send("Page.enable")
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def wait_for(self, condition: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.eval(f"!!({condition})"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{condition} (page status: {self.eval('document.body.innerText')[-300:]!r})")
            time.sleep(0.05)

    def type_into(self, selector: str, text: str) -> None:
        self.eval(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.focus(); e.select(); }})()")
        self.send("Input.insertText", text=text)

    def box(self, selector: str) -> dict:
        return self.eval(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
            " return {x: r.x, y: r.y, width: r.width, height: r.height, scale: window.devicePixelRatio}; })()"
        )

    def click(self, selector: str) -> None:
        box = self.box(selector)
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def screenshot(self, path) -> None:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
