"""`wedlm-hf serve --tensor-parallel-size 2`: two gloo ranks on this CPU, each holding half of every layer, answer
what one process answers; a rank that dies ends the server within seconds; SIGTERM drains on every rank.

The real command runs in a subprocess (it starts its ranks with torchrun's launcher); the single-process server it is
compared with runs here, on the same shipped model. The prefix cache is on in both: under tensor parallelism rank 0
holds it with whole heads, gathered from the ranks and scattered back to them. The tests that start ranks are
`heavy` (docs/development.md, "Tests")."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest
from conftest import build_model, char_tokenizer  # noqa: F401 - char_tokenizer is a fixture
from live_server import LiveServer, engine

from wedlm_hf.cli import console
from wedlm_hf.evaluation.server_process import free_port
from wedlm_hf.serving.engine import ServingEngine

PROMPTS = ["def fib(n):", "import os\nimport", "The quick brown fox"]
LONG = "copy: apple river stone cloud tiger lamp orange seven piano forest candle mirror silver rocket garden =>"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
REQUESTS = [
    ("completions", {"prompt": PROMPTS, "max_tokens": 24}),
    ("completions", {"prompt": PROMPTS[0], "max_tokens": 24, "wedlm_lossless": True}),
    ("completions", {"prompt": PROMPTS[1], "max_tokens": 24, "temperature": 1.0, "seed": 7, "n": 2}),
    ("completions", {"prompt": PROMPTS[2], "max_tokens": 24, "temperature": 0.8, "seed": 3, "stream": True}),
    ("completions", {"prompt": PROMPTS[0], "max_tokens": 8, "logprobs": 3, "echo": True}),
    ("completions", {"prompt": LONG, "max_tokens": 16}),  # stored in the prefix cache, gathered on rank 0
    ("completions", {"prompt": LONG + " lamp", "max_tokens": 16}),  # its blocks reused: scattered to the ranks
    (
        "chat/completions",
        {
            "messages": [{"role": "user", "content": "A person as JSON."}],
            "max_tokens": 60,
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}},
        },
    ),
]


class RankedServer:
    """The real `wedlm-hf serve --tensor-parallel-size 2` in a subprocess, its output in `log`."""

    def __init__(self, tmp_path, *extra: str):
        for _ in range(3):  # a port found free can be taken before the server binds it (other tests run beside)
            self._start(tmp_path, extra)
            if self._wait_healthy():
                return
            assert "address already in use" in self.output(), self.output()
            self.log.close()
        raise AssertionError(f"no free port in three tries: {self.output()}")

    def _start(self, tmp_path, extra) -> None:
        self.port = free_port()
        self.log_path = tmp_path / f"serve-{self.port}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        command = [sys.executable, "-m", "wedlm_hf.cli", "serve", "--port", str(self.port)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen(
            [*command, "--tensor-parallel-size", "2", *extra], stdout=self.log, stderr=subprocess.STDOUT, env=env
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def _wait_healthy(self) -> bool:
        """True once /health answers; False if the command ended first (the caller reads why)."""
        deadline = time.monotonic() + 180
        while True:
            if self.process.poll() is not None:
                return False
            assert time.monotonic() < deadline, self.output()
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return True
            except httpx.HTTPError:
                time.sleep(0.2)

    def output(self) -> str:
        return self.log_path.read_text()

    def ranks(self) -> list[psutil.Process]:
        return [p for p in psutil.Process(self.process.pid).children() if "wedlm_hf.cli" in " ".join(p.cmdline())]

    def stop(self) -> None:
        if self.process.poll() is None:
            for rank in self.ranks():
                rank.kill()
            self.process.kill()
        self.process.wait(30)
        self.log.close()


@pytest.fixture(scope="module")
def ranked(tmp_path_factory):
    server = RankedServer(tmp_path_factory.mktemp("tp"))
    yield server
    server.stop()


def answer(url: str, path: str, body: dict):
    """The response's choices (texts, finish reasons, log-probabilities) or, streamed, the joined texts."""
    if not body.get("stream"):
        response = httpx.post(f"{url}/v1/{path}", json=body, timeout=300)
        assert response.status_code == 200, response.text
        return response.json()["choices"]
    texts = {}
    with httpx.stream("POST", f"{url}/v1/{path}", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    return texts


def without_logprobs(choices):
    if isinstance(choices, dict):
        return choices
    return [{k: v for k, v in c.items() if k != "logprobs"} for c in choices]


@pytest.mark.heavy
def test_two_ranks_answer_what_one_process_answers(ranked):
    health = httpx.get(f"{ranked.url}/health", timeout=10).json()
    assert health["tensor_parallel_size"] == 2 and health["prefix_cache"]["enabled"]
    with LiveServer(engine()) as single:
        for path, body in REQUESTS:
            split, whole = answer(ranked.url, path, body), answer(single.url, path, body)
            assert without_logprobs(split) == without_logprobs(whole), body
            if body.get("logprobs"):
                a, b = split[0]["logprobs"], whole[0]["logprobs"]
                assert a["tokens"] == b["tokens"]
                assert a["token_logprobs"][0] is None and b["token_logprobs"][0] is None
                assert a["token_logprobs"][1:] == pytest.approx(b["token_logprobs"][1:], abs=1e-4)
    reused = httpx.get(f"{ranked.url}/health", timeout=10).json()["prefix_cache"]
    assert reused["hits"] >= 1 and reused["cached_tokens"] >= 16  # the long prompt's blocks came back from rank 0
    person = json.loads(split[0]["message"]["content"])  # the last request: response_format held on two ranks
    assert set(person) == {"name", "age"}
    assert "Traceback" not in ranked.output()


@pytest.mark.heavy
def test_echo_scoring_beside_decoding_keeps_the_ranks_in_step(ranked):
    """An echo's scoring forward (sent from a worker thread) while streams decode (sent from the loop thread): the
    ranks see every collective in the same order, and every answer is what it is alone."""
    long_prompt = " ".join([LONG] * 6)
    echo = {"prompt": long_prompt, "max_tokens": 1, "logprobs": 1, "echo": True}
    stream = {"prompt": PROMPTS[2], "max_tokens": 48, "stream": True}
    alone = (answer(ranked.url, "completions", echo), answer(ranked.url, "completions", stream))
    results = {}

    def run(name, body):
        results[name] = answer(ranked.url, "completions", body)

    threads = [threading.Thread(target=run, args=(f"echo{i}", echo)) for i in range(3)]
    threads += [threading.Thread(target=run, args=(f"stream{i}", stream)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    for i in range(3):
        assert results[f"echo{i}"][0]["logprobs"]["tokens"] == alone[0][0]["logprobs"]["tokens"]
        assert results[f"echo{i}"][0]["logprobs"]["token_logprobs"][1:] == pytest.approx(
            alone[0][0]["logprobs"]["token_logprobs"][1:], abs=1e-4
        )
        assert results[f"stream{i}"] == alone[1]
    assert httpx.get(f"{ranked.url}/health", timeout=10).json()["step_failures"] == 0


RANDOM_REQUESTS = [
    {"prompt": ["hello world", "abc"], "max_tokens": 24},
    {"prompt": "hello world", "max_tokens": 24, "wedlm_lossless": True},
    {"prompt": "The quick", "max_tokens": 24, "temperature": 1.0, "seed": 11, "n": 2},
    {"prompt": "The quick", "max_tokens": 24, "temperature": 0.7, "seed": 5, "stream": True},
    {"prompt": "hello world", "max_tokens": 4, "logprobs": 2, "echo": True},
]


@pytest.mark.heavy
def test_two_ranks_on_a_float64_random_model_answer_what_one_process_answers(tmp_path, char_tokenizer):  # noqa: F811
    """A random model in float64: a near tie in float32 cannot hide a difference, nor fake one."""
    folder = tmp_path / "random64"
    build_model().save_pretrained(folder)
    char_tokenizer.save_pretrained(folder)
    server = RankedServer(tmp_path, "--model", str(folder), "--dtype", "float64")
    try:
        health = httpx.get(f"{server.url}/health", timeout=10).json()
        assert health["dtype"] == "float64" and health["tensor_parallel_size"] == 2
        single = ServingEngine.load(str(folder), device="cpu", dtype="float64")
        with LiveServer(single) as one:
            for body in RANDOM_REQUESTS:
                split, whole = answer(server.url, "completions", body), answer(one.url, "completions", body)
                assert without_logprobs(split) == without_logprobs(whole), body
                if body.get("logprobs"):
                    a, b = split[0]["logprobs"]["token_logprobs"][1:], whole[0]["logprobs"]["token_logprobs"][1:]
                    assert a == pytest.approx(b, abs=1e-9)
    finally:
        server.stop()


def test_tensor_parallel_refuses_compile_and_quantization(capsys):
    """The command's own exit status and line (`console`, what the installed script runs), in this process: the
    refusal comes before any rank starts or the model loads."""
    for extra in (["--compile"], ["--quantization", "torchao-int8"]):
        assert console(["serve", "--tensor-parallel-size", "2", *extra]) == 1
        stderr = capsys.readouterr().err
        assert f"--tensor-parallel-size: {extra[0]} is not available under tensor parallelism" in stderr


def stream_long(url: str, out: dict, started: threading.Event) -> None:
    body = {"prompt": "def main():", "max_tokens": 900, "wedlm_window_size": 1, "stream": True}
    events = []
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    started.set()
    except httpx.HTTPError as exc:
        out["error"] = exc
    out["events"] = events
    started.set()


@pytest.mark.heavy
@pytest.mark.parametrize("end", ["rank 1 killed", "SIGTERM", "launcher killed"])
def test_a_dead_rank_or_sigterm_ends_every_rank(end, tmp_path):
    server = RankedServer(tmp_path, "--shutdown-timeout", "1")
    try:
        ranks = server.ranks()
        assert len(ranks) == 2
        out, started = {}, threading.Event()
        reader = threading.Thread(target=stream_long, args=(server.url, out, started))
        reader.start()
        assert started.wait(60)
        if end == "SIGTERM":
            server.process.send_signal(signal.SIGTERM)
        elif end == "launcher killed":  # its ranks notice within a second and stop
            server.process.kill()
        else:
            worker = next(r for r in ranks if "--port" in r.cmdline() and r.environ().get("RANK") == "1")
            worker.kill()
        server.process.wait(30)  # raises TimeoutExpired if any rank hangs
        reader.join(30)
        gone, alive = psutil.wait_procs(ranks, timeout=15)
        assert not alive
    finally:
        server.stop()
    output = server.output()
    if end == "launcher killed":
        assert "the launcher is gone; this rank stops" in output
        return
    events = out["events"]
    assert events[-1] == "[DONE]" and "error" in json.loads(events[-2])
    if end == "SIGTERM":
        assert "shut down" in json.loads(events[-2])["error"]["message"]
        assert "Traceback" not in output, output
        assert server.process.returncode == 128 + signal.SIGTERM
    else:
        assert "rank 1 of 2 ended with exit code -9; the server stopped" in output
        assert server.process.returncode == 1
