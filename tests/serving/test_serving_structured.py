"""`response_format` through the official client, on both routes, streamed and not: every choice is JSON that
validates, equal to offline `generate(strategy="wedlm", grammar=schema)`; schemas the compiler refuses get a 400."""

import json

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


@pytest.mark.parametrize(
    "schema, words",
    [({"type": "strin"}, "strin"), ({"type": "string", "format": "zzz"}, "format")],
)
def test_a_schema_the_compiler_refuses_is_a_400_naming_it(client, server, schema, words):
    bad = {"type": "json_schema", "json_schema": {"name": "bad", "schema": schema}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=8, response_format=bad)
    error = caught.value.body
    assert error["param"] == "response_format" and words in error["message"]
    assert server.health()["live_rows"] == 0  # it never reached the decoding loop
