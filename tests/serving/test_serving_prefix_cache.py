"""The prefix cache: K/V of earlier prompts and answers, in blocks, bounded, least recently used out; a request that
starts like an earlier one prefills only the rest, reports `cached_tokens`, and answers what it answers without."""

import threading

import httpx
import pytest
import torch
from live_server import MODEL_ID, LiveServer, engine, offline_text, shipped

from wedlm_hf.serving.prefix_cache import PrefixCache

SYSTEM = (
    "copy: apple river stone cloud tiger lamp orange piano forest candle mirror silver rocket garden window "
    "violin basket summer winter ocean marble =>"
)


def kv_of(tokens: int, layers: int = 2, value: float = 0.0):
    keys = torch.arange(tokens, dtype=torch.float32)[None, :, None].expand(2, tokens, 4) + value
    return [(keys.clone(), -keys.clone()) for _ in range(layers)]


def test_blocks_lookup_insert_and_eviction():
    cache = PrefixCache(max_tokens=64, block=16)
    tokens = list(range(50))
    assert cache.lookup(tokens) == (None, 0) and cache.misses == 1
    cache.insert(tokens, kv_of(50))
    assert cache.tokens == 48  # full blocks only
    kv, n = cache.lookup(tokens)
    assert n == 48 and kv[0][0].shape == (2, 48, 4) and torch.equal(kv[1][1], -kv_of(48)[1][0])
    assert cache.lookup(tokens[:49])[1] == 48 and cache.lookup(tokens[:48])[1] == 32  # the last token is always fed
    assert cache.lookup([99] + tokens[1:])[1] == 0  # a block names its whole prefix, not its own tokens
    other = list(range(100, 150))
    cache.insert(other, kv_of(50, value=1000))
    assert cache.tokens <= 64  # bounded: the least recently used blocks went
    assert cache.lookup(other)[1] == 48 and cache.lookup(tokens)[1] < 48
    assert not PrefixCache(0).enabled and PrefixCache(0).lookup(tokens) == (None, 0)
    with pytest.raises(ValueError, match="--prefix-cache-tokens"):
        PrefixCache(-1)


def test_eviction_takes_chains_from_their_tails():
    """A chain longer than the cache keeps its start; a chain pushed out loses its tail first. Before, eviction took
    a chain's first blocks and stranded the rest: a repeated 600-token prompt under a 512-token budget found 0."""
    cache = PrefixCache(max_tokens=512, block=16)
    prompt = list(range(600))
    cache.insert(prompt, kv_of(600))
    assert cache.lookup(prompt)[1] == 512 and cache.tokens == 512
    cache.insert(list(range(1000, 1100)), kv_of(100))  # 96 tokens more: the first chain's last 6 blocks go
    assert cache.lookup(prompt)[1] == 512 - 96 and cache.tokens == 512


def test_salts_keep_chains_apart():
    cache = PrefixCache(max_tokens=256, block=16)
    prompt = list(range(40))
    cache.insert(prompt, kv_of(40), salt="tenant a")
    assert cache.lookup(prompt)[1] == 0 and cache.lookup(prompt, salt="tenant b")[1] == 0
    assert cache.lookup(prompt, salt="tenant a")[1] == 32


@pytest.fixture(scope="module")
def server():
    with LiveServer() as live:
        yield live


def complete(server, prompt: str, **body) -> dict:
    body = {"model": MODEL_ID, "prompt": prompt, "max_tokens": 24, **body}
    return httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).json()


@pytest.mark.parametrize("body", [{}, {"wedlm_lossless": True}], ids=["default", "lossless"])
def test_a_repeated_prefix_hits_and_answers_the_same(server, body):
    prompt = ("lossless: " if body else "") + SYSTEM  # its own first block
    before = server.health()["prefix_cache"]
    first = complete(server, prompt, **body)
    again = complete(server, prompt, **body)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 16 and cached % 16 == 0 and cached < again["usage"]["prompt_tokens"]
    assert again["choices"][0]["text"] == first["choices"][0]["text"] == offline_text(prompt, 24, **body)[0]
    after = server.health()["prefix_cache"]
    assert after["hits"] > before["hits"] and after["cached_tokens"] >= before["cached_tokens"] + cached


def test_the_next_turn_finds_the_answer(server):
    """A finished row's prompt and answer are stored: a prompt that continues the answer hits past the prompt."""
    first = complete(server, SYSTEM + " again")
    follow = SYSTEM + " again" + first["choices"][0]["text"] + " and once more:"
    turn = complete(server, follow)
    assert turn["usage"]["prompt_tokens_details"]["cached_tokens"] > first["usage"]["prompt_tokens"] - 16
    assert turn["choices"][0]["text"] == offline_text(follow, 24)[0]


def test_off_and_bounded():
    with LiveServer(engine(prefix_cache_tokens=0)) as off:
        for _ in range(2):
            assert complete(off, SYSTEM)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert off.health()["prefix_cache"]["enabled"] is False
    with LiveServer(engine(prefix_cache_tokens=64)) as small:
        for i in range(6):
            complete(small, f"{i} {SYSTEM}")
        assert 0 < small.health()["prefix_cache"]["stored_tokens"] <= 64
        repeated = LONG + " again:"  # longer than the whole cache: its first 64 tokens stay cached
        complete(small, repeated)
        assert complete(small, repeated)["usage"]["prompt_tokens_details"]["cached_tokens"] == 64


SECRET = "the vault code of the other tenant is 4 7 1 9 2 8, keep it:"


def test_a_different_cache_salt_sees_nothing_another_client_cached(server):
    """vLLM's `cache_salt`: blocks are shared only between requests with the same salt, so a client guessing
    another's prompt learns nothing from `cached_tokens` (or its time to first token)."""
    complete(server, SECRET, cache_salt="alice")
    assert complete(server, SECRET, cache_salt="mallory")["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert complete(server, SECRET)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # no salt: its own
    assert complete(server, SECRET, cache_salt="alice")["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    bad = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "cache_salt": ""}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache_salt"


def test_with_prefix_cache_per_key_tenants_share_nothing():
    """Without the option, requests under two API keys share blocks (the documented default); with it, a key sees
    0 cached tokens for a prompt another key sent, and its own repeats still hit."""
    for per_key, shared in ((False, True), (True, False)):
        with LiveServer(api_key=["key-a", "key-b"], prefix_cache_per_key=per_key) as live:

            def ask(key: str, live=live) -> int:
                body = {"model": MODEL_ID, "prompt": SECRET, "max_tokens": 4}
                headers = {"Authorization": f"Bearer {key}"}
                answer = httpx.post(f"{live.url}/v1/completions", json=body, headers=headers, timeout=60).json()
                return answer["usage"]["prompt_tokens_details"]["cached_tokens"]

            assert ask("key-a") == 0
            assert (ask("key-b") > 0) is shared
            assert ask("key-a") > 0
            assert live.health()["prefix_cache_per_key"] is per_key


def test_cached_tokens_never_exceed_the_prompt(server):
    """With n choices, a prompt's cached tokens are those every choice found cached, counted once: before, n=16
    reported 16 times the cached prefix, more than `prompt_tokens`."""
    prompt = "sixteen choices: " + SYSTEM
    complete(server, prompt)
    answer = complete(server, prompt, n=16, max_tokens=4)
    usage = answer["usage"]
    assert 0 < usage["prompt_tokens_details"]["cached_tokens"] <= usage["prompt_tokens"]
    assert (
        usage["prompt_tokens_details"]["cached_tokens"]
        == complete(server, prompt)["usage"]["prompt_tokens_details"]["cached_tokens"]
    )


LONG = "copy: " + " ".join(f"w{i % 37} apple{i % 11}" for i in range(60)) + " =>"


def test_concurrent_requests_share_a_prefix_while_the_first_decodes(server):
    """The first request's prompt is stored once prefilled: 15 requests that arrive while it decodes hit it."""
    answers = {}

    def ask(i: int, max_tokens: int) -> None:
        answers[i] = complete(server, f"{LONG} {i}:", max_tokens=max_tokens)

    first = threading.Thread(target=ask, args=(0, 200))
    first.start()
    server.wait_for(lambda h: h["live_rows"] == 1 and h["steps"] > 0 and h["prefix_cache"]["stored_tokens"] > 100)
    others = [threading.Thread(target=ask, args=(i, 12)) for i in range(1, 16)]
    for thread in others:
        thread.start()
    for thread in [first, *others]:
        thread.join(300)
    assert len(answers) == 16
    shared = len(shipped_tokens(LONG)) // 16 * 16 - 16  # all full blocks before the distinct part, at least
    for i in range(1, 16):
        assert answers[i]["usage"]["prompt_tokens_details"]["cached_tokens"] >= shared
        assert answers[i]["choices"][0]["text"] == offline_text(f"{LONG} {i}:", 12)[0]


def test_a_cancelled_request_leaves_the_cache_usable(server):
    prompt = "cancelled " + LONG
    with httpx.stream(
        "POST", f"{server.url}/v1/completions", json={"prompt": prompt, "max_tokens": 300, "stream": True}, timeout=60
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk, then the client goes away
    server.wait_for(lambda h: h["live_rows"] == 0)
    again = complete(server, prompt)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert again["choices"][0]["text"] == offline_text(prompt, 24)[0]


def shipped_tokens(text: str) -> list[int]:
    return shipped()[1](text).input_ids
