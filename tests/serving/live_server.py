"""Test helpers: the real server (uvicorn + the app) in a background thread on a free 127.0.0.1 port, the shipped
model, and offline `generate(strategy="wedlm")` answers to compare the server with."""

import socket
import threading
import time
from functools import lru_cache

import httpx
import torch
from openai import OpenAI
from transformers import AutoTokenizer

from wedlm_hf import WeDLMForCausalLM, default_model_path
from wedlm_hf.serving.engine import ServingEngine
from wedlm_hf.serving.server import ServingServer

MODEL_ID = "wedlm-hf-default"
WEDLM_KEYS = {
    "wedlm_window_size": "window_size",
    "wedlm_entropy_threshold": "entropy_threshold",
    "wedlm_pos_penalty_factor": "pos_penalty_factor",
    "wedlm_lossless": "lossless",
    "wedlm_context_drafts": "context_drafts",
    "wedlm_context_ngram": "context_ngram",
}


@lru_cache(maxsize=1)
def shipped():
    """The shipped model and tokenizer, loaded once per test session (the servers share them)."""
    path = default_model_path()
    model = WeDLMForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


def engine(**kwargs) -> ServingEngine:
    model, tokenizer = shipped()
    return ServingEngine(model, tokenizer, MODEL_ID, **kwargs)


class LiveServer:
    """`ServingServer` on a socket bound here first (so the port is known and cannot be raced), run in a thread."""

    def __init__(self, serving_engine: ServingEngine | None = None, shutdown_timeout: float = 5.0, **server_kwargs):
        self.engine = serving_engine or engine()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = ServingServer(
            self.engine, port=self.port, shutdown_timeout=shutdown_timeout, log_level="warning", **server_kwargs
        )
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kwargs) -> OpenAI:
        return OpenAI(base_url=f"{self.url}/v1", **{"api_key": "unused", "max_retries": 0, **kwargs})

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def wait_for(self, condition, timeout: float = 60.0) -> dict:
        """Polls /health until `condition(health)` holds (a wait, not a timing assertion)."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.health()
            if condition(state):
                return state
            assert time.monotonic() < deadline, f"server never reached the expected state: {state}"
            time.sleep(0.02)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True  # runs ServingServer.shutdown: drain, wait for responses, lifespan shutdown
        self.thread.join(60)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(10)
        self.sock.close()
        assert not self.thread.is_alive(), "the server thread did not end"
        assert not self.engine.scheduler.alive, "the decoding loop did not end"

    def __exit__(self, *exc) -> None:
        self.stop()


def offline_generate(prompt_ids: list[int], max_tokens: int, generate_kwargs: dict | None = None, **body):
    """`generate(strategy="wedlm")` on one prompt with the request's WeDLM options (greedy), and `generate_kwargs`."""
    model, tokenizer = shipped()
    options = {key: body[key] for key in WEDLM_KEYS if key in body}
    return model.generate(
        torch.tensor([prompt_ids]),
        strategy="wedlm",
        max_new_tokens=max_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **options,
        **(generate_kwargs or {}),
    )


def offline_ids(prompt_ids: list[int], max_tokens: int, **body) -> list[int]:
    """What `generate(strategy="wedlm")` commits for one prompt with the request's WeDLM options (greedy)."""
    _, tokenizer = shipped()
    out = offline_generate(prompt_ids, max_tokens, **body)
    generated = out[0, len(prompt_ids) :].tolist()
    if tokenizer.eos_token_id in generated:  # a row that stopped is padded after its eos
        generated = generated[: generated.index(tokenizer.eos_token_id) + 1]
    return generated


def offline_text(prompt: str, max_tokens: int, **body) -> tuple[str, str, int]:
    """(text, finish_reason, completion tokens) of offline generate on a completion prompt."""
    _, tokenizer = shipped()
    return _answer(offline_ids(tokenizer(prompt).input_ids, max_tokens, **body), max_tokens)


def offline_chat(messages: list[dict], max_tokens: int, **body) -> tuple[str, str, int]:
    _, tokenizer = shipped()
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return _answer(offline_ids(tokenizer(text, add_special_tokens=False).input_ids, max_tokens, **body), max_tokens)


def _answer(ids: list[int], max_tokens: int) -> tuple[str, str, int]:
    _, tokenizer = shipped()
    reason = "stop" if ids and ids[-1] == tokenizer.eos_token_id else "length"
    assert reason == "stop" or len(ids) == max_tokens
    return tokenizer.decode(ids, skip_special_tokens=True), reason, len(ids)
