"""`response_format` through the official client, on both routes, streamed and not: every choice is JSON that
validates, equal to offline `generate(strategy="wedlm", grammar=schema)`; schemas the compiler refuses get a 400."""

import json
import threading

import httpx
import jsonschema
import openai
import pytest
from live_server import MODEL_ID, LiveServer, offline_generate, shipped

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "size": {"type": "integer", "minimum": 0, "maximum": 999},
        "kind": {"enum": ["file", "dir"]},
    },
    "required": ["name", "size", "kind"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "entry", "schema": SCHEMA, "strict": True}}
PROMPT = "entry = "
MESSAGES = [{"role": "user", "content": "describe one file as JSON"}]


@pytest.fixture(scope="module")
def server():
    with LiveServer() as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def offline_text(prompt_ids: list[int], **body) -> str:
    _, tokenizer = shipped()
    out = offline_generate(prompt_ids, 80, {"grammar": SCHEMA, "tokenizer": tokenizer}, **body)
    return tokenizer.decode(out[0, len(prompt_ids) :], skip_special_tokens=True)


@pytest.mark.parametrize("body", [{}, {"wedlm_lossless": True}], ids=["default", "lossless"])
def test_completions_follow_the_schema_and_equal_offline_generate(client, body):
    _, tokenizer = shipped()
    response = client.completions.create(
        model=MODEL_ID, prompt=PROMPT, max_tokens=80, extra_body={"response_format": FORMAT, **body}
    )
    choice = response.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.text), SCHEMA)
    assert choice.text == offline_text(tokenizer(PROMPT).input_ids, **body)


def test_chat_streamed_and_not_with_n_and_sampling(client):
    options = dict(model=MODEL_ID, messages=MESSAGES, max_tokens=80, response_format=FORMAT, n=3, temperature=1.0)
    whole = client.chat.completions.create(seed=5, **options)
    streamed = ["", "", ""]
    for chunk in client.chat.completions.create(stream=True, seed=5, **options):
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
    for choice in whole.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
        assert streamed[choice.index] == choice.message.content


def test_json_object_gives_an_object(client):
    response = client.chat.completions.create(
        model=MODEL_ID, messages=MESSAGES, max_tokens=60, response_format={"type": "json_object"}
    )
    choice = response.choices[0]
    if choice.finish_reason == "stop":  # any object: it may run to the budget, but never out of JSON
        assert isinstance(json.loads(choice.message.content), dict)
    assert choice.message.content.startswith("{")


def test_free_text_and_structured_requests_share_the_batch(client):
    """A request without response_format is not touched by the others' grammars."""
    _, tokenizer = shipped()
    free = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=24)
    out = offline_generate(tokenizer(PROMPT).input_ids, 24)
    assert free.choices[0].text == tokenizer.decode(
        out[0, len(tokenizer(PROMPT).input_ids) :], skip_special_tokens=True
    )


SELF_CONTAINED = {"type": "object", "properties": {"a": {"$ref": "#/$defs/R"}}, "required": ["a"]}
DEFS = {"$defs": {"R": SELF_CONTAINED}}


@pytest.mark.parametrize(
    "schema, words",
    [
        ({"type": "strin"}, "strin"),
        ({"type": "string", "format": "zzz"}, "format"),
        ({"$ref": "#"}, "admits no text"),  # compiles, and nothing completes it: was a 200 with "" and "stop"
        ({"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}, "admits no text"),
        ({**SELF_CONTAINED, **DEFS}, "cannot be decoded"),  # its forced start never ends
    ],
)
def test_a_schema_the_compiler_refuses_is_a_400_naming_it(client, server, schema, words):
    bad = {"type": "json_schema", "json_schema": {"name": "bad", "schema": schema}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=8, response_format=bad)
    error = caught.value.body
    assert error["param"] == "response_format" and words in error["message"]
    assert server.health()["live_rows"] == 0  # it never reached the decoding loop


def test_echo_without_new_tokens_checks_the_schema_too(server):
    bad = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"$ref": "#"}}}
    body = {"model": MODEL_ID, "prompt": PROMPT, "echo": True, "logprobs": 0, "response_format": bad}
    for max_tokens in (0, 4):
        response = httpx.post(f"{server.url}/v1/completions", json={**body, "max_tokens": max_tokens}, timeout=60)
        assert response.status_code == 400 and response.json()["error"]["param"] == "response_format"


def test_a_grammar_that_fails_while_decoding_fails_its_own_request_alone(server, client):
    """The schema passes every check up front (its start is `{"k": ` then the model's choice of 1 or 2); after the
    choice, the forced text `, "a": {"a": ...` never ends and the grammar library stops at its item limit inside a
    step the whole batch shares. Before, the four plain streams decoding beside it ended with a 500; now that
    request alone gets a 400 naming response_format, and the streams finish as offline generate does."""
    _, tokenizer = shipped()
    spec = {"type": "object", "properties": {"k": {"enum": [1, 2]}, "a": {"$ref": "#/$defs/R"}}, "required": ["k", "a"]}
    hostile = {"type": "json_schema", "json_schema": {"name": "r", "schema": {**spec, **DEFS}}}
    prompts = [f"{i} apples and {i} pears:" for i in range(4)]
    slow = {"wedlm_entropy_threshold": None}  # one token per forward: the streams are still decoding
    texts, errors = {}, []

    def stream(prompt):
        try:
            chunks = client.completions.create(
                model=MODEL_ID, prompt=prompt, max_tokens=120, stream=True, extra_body=slow
            )
            texts[prompt] = "".join(c.choices[0].text for c in chunks if c.choices)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=stream, args=(p,)) for p in prompts]
    for thread in threads:
        thread.start()
    server.wait_for(lambda health: health["live_rows"] >= 4)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=64, extra_body={"response_format": hostile})
    assert server.health()["live_rows"] >= 1  # it failed while the streams were still decoding
    for thread in threads:
        thread.join(120)
    error = caught.value.body
    assert error["param"] == "response_format" and error["code"] == "grammar_failed"
    assert "Too many items" in error["message"] and "\n" not in error["message"]
    assert not errors and len(texts) == 4
    for prompt in prompts:
        out = offline_generate(tokenizer(prompt).input_ids, 120, **slow)
        assert texts[prompt] == tokenizer.decode(out[0, len(tokenizer(prompt).input_ids) :], skip_special_tokens=True)
    assert server.health()["step_failures"] == 0
