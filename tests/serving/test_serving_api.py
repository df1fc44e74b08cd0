"""The OpenAI API of `wedlm-hf serve`, driven by the official `openai` client against a real server on 127.0.0.1.

Every greedy answer is compared with offline `generate(strategy="wedlm")` on the same prompt and settings.
"""

import copy
import json
import socket
import threading

import httpx
import openai
import pytest
from live_server import MODEL_ID, LiveServer, engine, offline_chat, offline_ids, offline_text, shipped

from wedlm_hf.serving.engine import ServingEngine

PROMPTS = [
    "count from 100 by 5, 24 numbers:",
    "copy: apple river stone cloud tiger =>",
    "count from 7 by 1, 12 numbers:",
    "sort([5, 3, 9, 1]) =",
    "copy: violin basket summer winter ocean marble =>",
    "count from 40 by 10, 9 numbers:",
    "reverse([1, 2, 3, 4]) =",
    "12 + 30 =",
]
SETTINGS = [
    {},
    {"wedlm_window_size": 8, "wedlm_entropy_threshold": 1.0},
    {"wedlm_window_size": 4, "wedlm_entropy_threshold": None, "wedlm_pos_penalty_factor": 0.1},
    {"wedlm_lossless": True},
]


@pytest.fixture(scope="module")
def server():
    with LiveServer() as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def stream_text(stream) -> tuple[str, str, list]:
    pieces, reason, chunks = [], None, []
    for chunk in stream:
        chunks.append(chunk)
        for choice in chunk.choices:
            text = choice.text if hasattr(choice, "text") else choice.delta.content
            pieces.append(text or "")
            reason = choice.finish_reason or reason
    return "".join(pieces), reason, chunks


@pytest.mark.parametrize("settings", SETTINGS, ids=["default", "w8-tau1", "one-per-forward", "lossless"])
def test_completion_equals_offline_generate(client, settings):
    prompt = PROMPTS[0] if settings != SETTINGS[2] else PROMPTS[1]
    expected, reason, tokens = offline_text(prompt, 32, **settings)
    out = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=32, extra_body=settings)
    assert out.choices[0].text == expected and out.choices[0].finish_reason == reason
    assert out.usage.completion_tokens == tokens and out.usage.prompt_tokens == len(shipped()[1](prompt).input_ids)
    assert out.usage.forwards >= 1 and out.usage.tokens_per_forward == pytest.approx(tokens / out.usage.forwards)

    stream = client.completions.create(
        model=MODEL_ID,
        prompt=prompt,
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=settings,
    )
    text, streamed_reason, chunks = stream_text(stream)
    assert (text, streamed_reason) == (expected, reason)
    commits = [c.choices[0].model_extra["wedlm"] for c in chunks if c.choices and "wedlm" in c.choices[0].model_extra]
    assert [c["forward"] for c in commits] == sorted({c["forward"] for c in commits})  # one chunk per commit
    assert sum(c["tokens"] for c in commits) == tokens == chunks[-1].usage.completion_tokens
    assert chunks[-1].usage.forwards == out.usage.forwards


REPEATING = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"
CONTEXT_SETTINGS = [
    {"wedlm_lossless": True},
    {"wedlm_lossless": True, "wedlm_context_drafts": False},
    {"wedlm_lossless": True, "wedlm_context_ngram": 1},
]


@pytest.mark.parametrize("settings", CONTEXT_SETTINGS, ids=["context-drafts", "model-drafts-only", "ngram-1"])
def test_lossless_usage_splits_accepted_drafts_by_source(client, settings):
    """Code that repeats itself: lossless rows accept drafts copied from the context, and usage counts them apart from
    the model's own; the answer is offline generate's (hence plain AR's) either way, streamed or not."""
    expected, reason, tokens = offline_text(REPEATING, 40, **settings)
    model, tokenizer = shipped()
    ids = tokenizer(REPEATING, return_tensors="pt").input_ids
    plain = model.generate(ids, do_sample=False, max_new_tokens=40, pad_token_id=tokenizer.pad_token_id)
    assert expected == tokenizer.decode(plain[0, ids.shape[1] :], skip_special_tokens=True)  # lossless: AR's text

    out = client.completions.create(model=MODEL_ID, prompt=REPEATING, max_tokens=40, n=2, extra_body=settings)
    assert [c.text for c in out.choices] == [expected] * 2 and out.choices[0].finish_reason == reason
    split = out.usage.model_extra["accepted_drafts"]
    assert set(split) == {"model", "context"} and split["model"] + split["context"] > 0
    if settings.get("wedlm_context_drafts", True):
        assert split["context"] > 0, split
    else:
        assert split["context"] == 0, split

    single = client.completions.create(model=MODEL_ID, prompt=REPEATING, max_tokens=40, extra_body=settings)
    one = single.usage.model_extra["accepted_drafts"]
    assert split == {"model": 2 * one["model"], "context": 2 * one["context"]}  # summed over the request's rows

    stream = client.completions.create(
        model=MODEL_ID,
        prompt=REPEATING,
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=settings,
    )
    text, _, chunks = stream_text(stream)
    assert text == expected and chunks[-1].usage.model_extra["accepted_drafts"] == one


def test_usage_has_no_draft_split_without_lossless_rows(client):
    out = client.completions.create(model=MODEL_ID, prompt=REPEATING, max_tokens=8)
    assert "accepted_drafts" not in out.usage.model_extra


@pytest.mark.parametrize(
    "body, match",
    [
        ({"wedlm_context_ngram": 9}, "wedlm_context_ngram must be an integer from 1 to 8"),
        ({"wedlm_context_drafts": "off"}, "wedlm_context_drafts must be a boolean"),
    ],
)
def test_context_draft_fields_are_refused_with_a_400_naming_them(client, body, match):
    with pytest.raises(openai.BadRequestError, match=match) as error:
        client.completions.create(model=MODEL_ID, prompt="12 + 30 =", max_tokens=4, extra_body=body)
    assert error.value.status_code == 400 and error.value.body["param"] == next(iter(body))


def test_context_draft_defaults_come_from_the_generation_config():
    model, tokenizer = shipped()
    config = model.generation_config
    keys = ("wedlm_context_drafts", "wedlm_context_ngram")
    saved = {key: getattr(config, key) for key in keys if hasattr(config, key)}
    try:
        config.wedlm_context_drafts, config.wedlm_context_ngram = False, 5
        defaults = ServingEngine(model, tokenizer, MODEL_ID).defaults
        assert (defaults.context_drafts, defaults.context_ngram) == (False, 5)
        config.wedlm_context_ngram = 9
        with pytest.raises(ValueError, match="generation_config.json of .*wedlm_context_ngram must be .* from 1 to 8"):
            ServingEngine(model, tokenizer, MODEL_ID)
    finally:
        for key in keys:
            delattr(config, key)
        for key, value in saved.items():
            setattr(config, key, value)


def test_parallel_decoding_shows_in_usage(client):
    out = client.completions.create(model=MODEL_ID, prompt=PROMPTS[0], max_tokens=64)
    assert out.usage.tokens_per_forward > 2  # the counting prompt commits many tokens per forward


def test_chat_equals_offline_generate_on_the_chat_template(client):
    messages = [{"role": "system", "content": "You copy."}, {"role": "user", "content": "copy: apple river =>"}]
    expected, reason, tokens = offline_chat(messages, 12)
    out = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=12)
    assert out.choices[0].message.content == expected and out.choices[0].finish_reason == reason
    assert out.choices[0].message.role == "assistant" and out.usage.completion_tokens == tokens
    text, streamed_reason, chunks = stream_text(
        client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=12, stream=True)
    )
    assert (text, streamed_reason) == (expected, reason)
    assert chunks[0].choices[0].delta.role == "assistant"


def test_chat_without_a_template_is_refused_with_a_400_that_says_so():
    model, tokenizer = shipped()
    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    with LiveServer(ServingEngine(model, bare, MODEL_ID)) as live:
        with pytest.raises(openai.BadRequestError, match="no chat template") as error:
            live.client().chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}])
        assert error.value.status_code == 400 and error.value.body["code"] == "no_chat_template"
        assert live.client().completions.create(model=MODEL_ID, prompt="12 + 30 =", max_tokens=4).choices


def test_stop_string_cuts_the_text_and_the_row(client):
    tokenizer = shipped()[1]
    ids = offline_ids(tokenizer(PROMPTS[0]).input_ids, 48)
    full = tokenizer.decode(ids)
    assert " 115" in full
    expected = full[: full.index(" 115")]
    out = client.completions.create(model=MODEL_ID, prompt=PROMPTS[0], max_tokens=48, stop=[" 115", "zzz"])
    assert out.choices[0].text == expected and out.choices[0].finish_reason == "stop"
    # the row is cut at the token that completes " 115"
    assert out.usage.completion_tokens == next(k for k in range(len(ids)) if " 115" in tokenizer.decode(ids[:k]))
    text, reason, _ = stream_text(
        client.completions.create(model=MODEL_ID, prompt=PROMPTS[0], max_tokens=48, stop=" 115", stream=True)
    )
    assert (text, reason) == (expected, "stop")


def test_n_choices_and_prompt_lists(client):
    out = client.completions.create(model=MODEL_ID, prompt=PROMPTS[1:3], max_tokens=16, n=2)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    for i, choice in enumerate(out.choices):
        assert choice.text == offline_text(PROMPTS[1 + i // 2], 16)[0]
    ids = shipped()[1](PROMPTS[3]).input_ids
    by_ids = client.completions.create(model=MODEL_ID, prompt=ids, max_tokens=16)
    assert by_ids.choices[0].text == offline_text(PROMPTS[3], 16)[0]


def test_seeded_sampling_is_reproducible_and_choices_draw_separately(client):
    kwargs = dict(model=MODEL_ID, prompt="def parse(", max_tokens=24, temperature=1.5, top_p=0.95, seed=7, n=2)
    first = client.completions.create(**kwargs)
    again = client.completions.create(**kwargs)
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert first.choices[0].text != first.choices[1].text
    greedy = client.completions.create(**{**kwargs, "temperature": 0})
    assert greedy.choices[0].text == greedy.choices[1].text == offline_text("def parse(", 24)[0]


def test_sixteen_concurrent_requests_equal_their_offline_answers(server):
    jobs = [(PROMPTS[i % len(PROMPTS)], SETTINGS[i % 3], i % 2 == 0) for i in range(16)]
    expected = [offline_text(prompt, 24, **settings) for prompt, settings, _ in jobs]
    results: list = [None] * len(jobs)
    steps_before = server.health()["steps"]
    start = threading.Barrier(len(jobs))

    def run(i):
        prompt, settings, streamed = jobs[i]
        client = server.client()
        start.wait()
        if streamed:
            text, reason, chunks = stream_text(
                client.completions.create(
                    model=MODEL_ID,
                    prompt=prompt,
                    max_tokens=24,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body=settings,
                )
            )
            results[i] = (text, reason, chunks[-1].usage.completion_tokens, chunks[-1].usage.forwards)
        else:
            out = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=24, extra_body=settings)
            results[i] = (
                out.choices[0].text,
                out.choices[0].finish_reason,
                out.usage.completion_tokens,
                out.usage.forwards,
            )

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [r[:3] for r in results] == expected
    # Rows shared forwards: the loop ran fewer steps than the requests' forwards added up.
    assert server.health()["steps"] - steps_before < sum(r[3] for r in results)


def test_a_client_that_disconnects_mid_stream_does_not_disturb_others(server):
    cancelled = server.health()["cancelled"]
    client = server.client()
    long_body = {"wedlm_window_size": 1, "wedlm_entropy_threshold": None}
    quitter = client.completions.create(
        model=MODEL_ID, prompt="def main():", max_tokens=600, stream=True, extra_body=long_body
    )
    expected = [offline_text(p, 24) for p in PROMPTS[:3]]
    results = [None] * 3

    def run(i):
        results[i] = stream_text(
            client.completions.create(model=MODEL_ID, prompt=PROMPTS[i], max_tokens=24, stream=True)
        )[:2]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    next(iter(quitter))
    quitter.close()  # the client goes away mid-stream
    for t in threads:
        t.join(120)
    assert results == [e[:2] for e in expected]
    state = server.wait_for(lambda h: h["cancelled"] > cancelled and h["live_rows"] == 0)
    assert state["cancelled"] == cancelled + 1


def test_a_non_streaming_client_that_disconnects_is_dropped(server):
    cancelled = server.health()["cancelled"]
    body = b'{"prompt": "def main():", "max_tokens": 600, "wedlm_window_size": 1, "wedlm_entropy_threshold": null}'
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        server.wait_for(lambda h: h["live_rows"] == 1)
    state = server.wait_for(lambda h: h["cancelled"] > cancelled and h["live_rows"] == 0)
    assert state["cancelled"] == cancelled + 1


JSON = {"Content-Type": "application/json"}
BAD_REQUESTS = [
    ("completions", b'{"prompt": "x", "max_tokens": 4', None),
    ("completions", b"not json at all", None),
    ("completions", b"[1, 2, 3]", None),
    ("completions", b'{"prompt": "x", "max_tokens": NaN}', None),
    ("completions", {"prompt": "x", "max_tokens": -3}, "max_tokens"),
    ("completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("completions", {"prompt": "x", "max_tokens": 2.5}, "max_tokens"),
    ("completions", {"prompt": "count " * 1100, "max_tokens": 16}, "prompt"),
    ("completions", {"prompt": "count " * 1000, "max_tokens": 100}, "max_tokens"),
    ("completions", {"prompt": "x", "max_tokens": 5000}, "max_tokens"),
    ("completions", {"prompt": [5000, 1]}, "prompt"),
    ("completions", {"prompt": ""}, "prompt"),
    ("completions", {"max_tokens": 3}, "prompt"),
    ("completions", {"prompt": "x", "wedlm_window_size": 0}, "wedlm_window_size"),
    ("completions", {"prompt": "x", "wedlm_window_size": True}, "wedlm_window_size"),
    ("completions", {"prompt": "x", "wedlm_entropy_threshold": -1}, "wedlm_entropy_threshold"),
    ("completions", {"prompt": "x", "wedlm_pos_penalty_factor": "a"}, "wedlm_pos_penalty_factor"),
    ("completions", {"prompt": "x", "wedlm_lossless": "yes"}, "wedlm_lossless"),
    ("completions", {"prompt": "x", "wedlm_window": 4}, "wedlm_window"),
    ("completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
    ("completions", {"prompt": "x", "echo": "yes"}, "echo"),
    ("completions", {"prompt": "x", "temperature": 3}, "temperature"),
    ("completions", {"prompt": "x", "top_p": 0}, "top_p"),
    ("completions", {"prompt": "x", "n": 0}, "n"),
    ("completions", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("completions", {"prompt": "x", "stream": "yes"}, "stream"),
    ("completions", {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ("completions", {"prompt": "x", "frobnicate": 1}, "frobnicate"),
    ("completions", {"prompt": "x", "presence_penalty": 5}, "presence_penalty"),
    ("chat/completions", {"messages": []}, "messages"),
    ("chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ("chat/completions", {"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools[0]"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2000}, "max_tokens"),
    # hostile sizes and text (issue 14): each a 400 naming the field, never a 500
    ("completions", b"[" * 100_000 + b"]" * 100_000, None),
    ("completions", {"prompt": "a\ud800b"}, "prompt"),
    ("completions", {"prompt": ["fine", "\udfff"]}, "prompt[1]"),
    ("chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages[0].content"),
    ("completions", {"prompt": "x", "stop": ["\ud83d"]}, "stop"),
    ("completions", {"prompt": "x", "stop": "s" * 300}, "stop"),
    ("completions", {"prompt": "x", "wedlm_window_size": 1_000_000}, "wedlm_window_size"),
    ("completions", {"prompt": "x", "n": 129}, "n"),
    ("completions", {"prompt": "x", "n": 65}, "n"),
    ("completions", {"prompt": ["x"] * 65}, "prompt"),
    ("completions", {"prompt": ["x"] * 9, "n": 8}, "n"),
    ("completions", {"prompt": "count " * 150_000}, "prompt"),
    ("completions", {"prompt": [1] * 5000}, "prompt"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x", "name": 3}]}, "messages[0].name"),
]


def test_two_hundred_bad_requests_get_400s_and_leave_the_server_answering(server, client):
    failed = server.health()["failed"]
    with httpx.Client(base_url=f"{server.url}/v1", timeout=30) as http:
        for i in range(200):
            path, body, param = BAD_REQUESTS[i % len(BAD_REQUESTS)]
            response = http.post(
                f"/{path}", content=body if isinstance(body, bytes) else json.dumps(body), headers=JSON
            )  # json.dumps escapes lone surrogates as JSON allows (\ud800); httpx's json= cannot send them
            assert response.status_code == 400, (str(body)[:200], response.text)
            error = response.json()["error"]
            assert error["type"] == "invalid_request_error" and error["message"] and error["param"] == param, error
    unknown_model = (  # OpenAI and vLLM answer a model they do not serve with a 404
        lambda: client.completions.create(model="gpt-4", prompt="x"),
        lambda: client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}]),
    )
    for call in unknown_model:
        with pytest.raises(openai.NotFoundError) as error:
            call()
        assert error.value.body["code"] == "model_not_found" and error.value.body["param"] == "model"
    health = server.health()
    assert health["status"] == "ok" and health["failed"] == failed and health["live_rows"] == 0
    expected = offline_text(PROMPTS[1], 16)
    out = client.completions.create(model=MODEL_ID, prompt=PROMPTS[1], max_tokens=16)
    assert (out.choices[0].text, out.choices[0].finish_reason, out.usage.completion_tokens) == expected


def test_context_error_says_what_to_do(server):
    response = httpx.post(f"{server.url}/v1/completions", json={"prompt": "count " * 1000, "max_tokens": 100})
    message = response.json()["error"]["message"]
    assert (
        "1024" in message
        and "lower max_tokens" in message
        and response.json()["error"]["code"] == "context_length_exceeded"
    )


def test_full_queue_gets_429_with_retry_after():
    with LiveServer(engine(max_batch_size=1, max_queue=1)) as live, live.client() as client:
        long_body = {"wedlm_window_size": 1, "wedlm_entropy_threshold": None}
        running = client.completions.create(
            model=MODEL_ID, prompt="def main():", max_tokens=600, stream=True, extra_body=long_body
        )
        next(iter(running))  # admitted: the one batch slot is taken
        waiting = threading.Thread(
            target=lambda: client.completions.create(model=MODEL_ID, prompt="12 + 30 =", max_tokens=4)
        )
        waiting.start()
        live.wait_for(lambda h: h["waiting_requests"] == 1)
        response = httpx.post(f"{live.url}/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert response.status_code == 429 and response.headers["retry-after"] == "1"
        assert response.json()["error"]["code"] == "queue_full"
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model=MODEL_ID, prompt="x", max_tokens=2)
        running.close()  # frees the slot: the waiting request runs
        waiting.join(60)
        assert not waiting.is_alive()
        assert (
            client.completions.create(model=MODEL_ID, prompt="12 + 30 =", max_tokens=4).choices[0].text
            == (offline_text("12 + 30 =", 4)[0])
        )


def test_models_health_and_unknown_routes(server, client):
    assert [m.id for m in client.models.list()] == [MODEL_ID]
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
    health = server.health()
    assert health["status"] == "ok" and health["model"] == MODEL_ID and health["max_batch_size"] == 16
    response = httpx.get(f"{server.url}/v1/nothing")
    assert response.status_code == 404 and "error" in response.json()


def test_playground_needs_nothing_from_outside(server):
    page = httpx.get(server.url + "/")
    script = httpx.get(server.url + "/playground.js")
    assert page.status_code == script.status_code == 200
    assert "text/javascript" in script.headers["content-type"] and '<script src="/playground.js">' in page.text
    for text in (page.text, script.text):
        assert "http://" not in text and "https://" not in text and "//cdn" not in text
