"""`POST /v1/responses` (OpenAI's Responses API, stateless) through the official client against a real server.

The route decodes on the chat path, so every greedy answer is compared with the chat route's for the same
conversation and budget (and with offline `generate(strategy="wedlm")` once)."""

import json

import httpx
import jsonschema
import openai
import pytest
from conftest import WEATHER
from live_server import MODEL_ID, LiveServer, offline_chat, shipped
from prometheus_client.parser import text_string_to_metric_families

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["n"],
    "additionalProperties": False,
}
JSON_FORMAT = {"type": "json_schema", "name": "digit", "schema": SCHEMA, "strict": True}
TOOLS = [{"type": "function", "name": "get_weather", "description": "the forecast", "parameters": WEATHER}]
NAMED = {"type": "function", "name": "get_weather"}
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}
OPENING = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


@pytest.fixture(scope="module")
def server():
    with LiveServer() as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def chat_answer(client, messages, max_tokens, **body):
    out = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=max_tokens, **body)
    return out.choices[0], out.usage


def check_response(response, choice, usage):
    """`response` says what the chat route's `choice` and `usage` say, in the Responses API's terms."""
    assert response.id.startswith("resp_") and response.object == "response" and response.model == MODEL_ID
    assert response.output_text == choice.message.content
    [message] = response.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    if choice.finish_reason == "stop":
        assert response.status == message.status == "completed" and response.incomplete_details is None
    else:
        assert response.status == message.status == "incomplete"
        assert response.incomplete_details.reason == "max_output_tokens"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (usage.prompt_tokens, usage.completion_tokens)
    assert response.usage.total_tokens == usage.total_tokens
    assert response.usage.output_tokens_details.reasoning_tokens == 0
    assert response.usage.input_tokens_details.cached_tokens <= response.usage.input_tokens
    assert response.usage.model_extra["forwards"] >= 1  # WeDLM's extras, as on the chat route


def test_a_string_input_is_one_user_message(client):
    prompt = "count from 100 by 5, 24 numbers:"
    choice, usage = chat_answer(client, [{"role": "user", "content": prompt}], 12)
    response = client.responses.create(model=MODEL_ID, input=prompt, max_output_tokens=12)
    check_response(response, choice, usage)
    assert response.max_output_tokens == 12 and response.tools == [] and response.store is False


def test_messages_and_instructions_equal_the_chat_route_and_offline_generate(client):
    """`instructions` is a system message put first; items with and without `"type": "message"`, string content
    and text parts (an earlier answer's `output_text` included) all become chat messages."""
    given = [
        {"role": "user", "content": "count from 7 by 1:"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "7 8", "annotations": []}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "go "}, {"type": "input_text", "text": "on"}],
        },
    ]
    messages = [
        {"role": "system", "content": "You count."},
        {"role": "user", "content": "count from 7 by 1:"},
        {"role": "assistant", "content": "7 8"},
        {"role": "user", "content": "go on"},
    ]
    choice, usage = chat_answer(client, messages, 16)
    response = client.responses.create(
        model=MODEL_ID,
        input=given,
        instructions="You count.",
        max_output_tokens=16,
        metadata={"case": "instructions"},
        user="tester",
    )
    check_response(response, choice, usage)
    assert response.output_text == offline_chat(messages, 16)[0]
    assert response.instructions == "You count." and response.metadata == {"case": "instructions"}
    assert response.user == "tester"

    again = client.responses.create(
        model=MODEL_ID, input=given + response.output, instructions="You count.", max_output_tokens=4
    )
    assert again.status in ("completed", "incomplete")  # a previous response's output items are valid input


def test_max_output_tokens_cuts_the_answer_as_incomplete(client):
    choice, usage = chat_answer(client, [{"role": "user", "content": "count to 500:"}], 3)
    assert choice.finish_reason == "length"
    response = client.responses.create(model=MODEL_ID, input="count to 500:", max_output_tokens=3)
    check_response(response, choice, usage)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3


def test_text_format_json_schema_gives_json_that_validates(client):
    messages = [{"role": "user", "content": "one digit as JSON"}]
    response_format = {"type": "json_schema", "json_schema": {"name": "digit", "schema": SCHEMA, "strict": True}}
    choice, usage = chat_answer(client, messages, 40, response_format=response_format)
    response = client.responses.create(
        model=MODEL_ID, input="one digit as JSON", max_output_tokens=40, text={"format": JSON_FORMAT}
    )
    check_response(response, choice, usage)
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), SCHEMA)
    assert response.text.format.type == "json_schema" and response.text.format.name == "digit"

    as_object = client.responses.create(
        model=MODEL_ID, input="an object", max_output_tokens=40, text={"format": {"type": "json_object"}}
    )
    assert as_object.output_text.startswith("{")


def test_a_stream_sends_the_documented_events_in_order(client):
    """`responses.stream`: created, in_progress, the item and part added, deltas that join to the text, then the
    text, part and item done and `response.completed`, numbered 0, 1, 2, ..."""
    whole = client.responses.create(model=MODEL_ID, input="one digit as JSON", text={"format": JSON_FORMAT})
    with client.responses.stream(model=MODEL_ID, input="one digit as JSON", text={"format": JSON_FORMAT}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    deltas = [event for event in events if event.type == "response.output_text.delta"]
    assert kinds == OPENING + ["response.output_text.delta"] * len(deltas) + CLOSING + ["response.completed"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert deltas and all(event.delta for event in deltas)
    text = "".join(event.delta for event in deltas)
    assert text == final.output_text == events[-4].text == whole.output_text  # output_text.done has it whole
    assert final.status == "completed" and final.usage.output_tokens == whole.usage.output_tokens


def test_a_stream_cut_by_length_ends_with_response_incomplete(client):
    """As the API ends such a stream (the official client's `get_final_response` waits for response.completed
    only, so read the last event). Deltas carry WeDLM's `wedlm: {forward, tokens}`, as chat chunks do."""
    events = list(client.responses.create(model=MODEL_ID, input="count to 500:", max_output_tokens=5, stream=True))
    assert [e.type for e in events[:4]] == OPENING and [e.type for e in events[-4:-1]] == CLOSING
    last = events[-1]
    assert last.type == "response.incomplete" and last.response.incomplete_details.reason == "max_output_tokens"
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for e in deltas) == last.response.output_text and last.response.usage.output_tokens == 5
    commits = [e.model_extra["wedlm"] for e in deltas]  # one delta per commit that adds text, as chat's chunks
    assert [c["forward"] for c in commits] == sorted({c["forward"] for c in commits})
    assert 0 < sum(c["tokens"] for c in commits) <= 5


def test_an_error_mid_stream_is_an_error_event_then_response_failed(client, monkeypatch):
    model, _ = shipped()
    forward, calls = model.forward, {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("out of memory (simulated)")
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", failing)
    events = list(
        client.responses.create(
            model=MODEL_ID,
            input="count to 500:",
            max_output_tokens=40,
            stream=True,
            extra_body={"wedlm_entropy_threshold": None},
        )
    )
    assert [e.type for e in events[:4]] == OPENING
    assert {e.type for e in events[4:-2]} <= {"response.output_text.delta"}
    error, failed = events[-2:]
    assert error.type == "error" and "out of memory" in error.message and error.code == "server_error"
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert "out of memory" in failed.response.error.message
    assert [e.sequence_number for e in events] == list(range(len(events)))


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "stateless"),
        ({"conversation": "conv_1"}, "conversation", "stateless"),
        ({"store": True}, "store", "stores no responses"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]", "functions only"),
        ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name", "letters"),
        (
            {"tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"x": []}}}]},
            "tools[0].parameters",
            "tool 'f' cannot be used",
        ),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"frobnicate": 1}, "frobnicate", "Unrecognized request argument"),
        ({"max_tokens": 4}, "max_tokens", "Unrecognized request argument"),
        ({"wedlm_bogus": 1}, "wedlm_bogus", "Unknown WeDLM option"),
        ({"max_output_tokens": 0}, "max_output_tokens", ">= 1"),
        ({"max_output_tokens": 100_000}, "max_output_tokens", "lower max_output_tokens"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "strin"}}}},
            "text.format",
            "cannot be used",
        ),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0]", "takes string"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type", "function calls"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0]", "text part"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role", "must be one of"),
        ({"input": []}, "input", "input is required"),
        # errors name this route's own fields, never the chat route's
        ({"input": [CALL | {"arguments": "{not json"}]}, "input[0].arguments", "JSON object"),
        ({"input": [CALL | {"arguments": '{"a": NaN}'}]}, "input[0].arguments", "NaN"),
        (
            {"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
            "input[0].call_id",
            "call_id",
        ),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0]", "unknown fields: function"),
        ({"tools": [{"type": "function", "name": "f", "parameters": []}]}, "tools[0].parameters", '"type": "object"'),
        ({"tools": [{"type": "function", "name": "f", "strict": "yes"}]}, "tools[0].strict", "true or false"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            "tool_choice",
            '{"type": "function", "name": NAME}',
        ),
        ({"text": {"verbosity": "loud"}}, "text.verbosity", "low"),
        ({"prompt_cache_key": 5}, "prompt_cache_key", "string"),
    ],
)
def test_refused_fields_get_a_400_naming_them(client, body, param, words):
    with pytest.raises(openai.BadRequestError, match=words) as error:
        client.responses.create(model=MODEL_ID, extra_body={"input": "hi", "max_output_tokens": 4, **body})
    assert error.value.status_code == 400 and error.value.body["param"] == param


def test_accepted_no_op_fields_and_wedlm_options(client):
    """Fields that ask for what the server does anyway are accepted; WeDLM's options travel as on the chat route."""
    settings = {"wedlm_window_size": 4, "wedlm_entropy_threshold": None}
    choice, usage = chat_answer(client, [{"role": "user", "content": "12 + 30 ="}], 8, extra_body=settings)
    response = client.responses.create(
        model=MODEL_ID,
        input="12 + 30 =",
        max_output_tokens=8,
        store=False,
        tools=[],
        tool_choice="none",
        parallel_tool_calls=False,
        truncation="disabled",
        extra_body=settings,
    )
    check_response(response, choice, usage)
    assert response.usage.model_extra["forwards"] == usage.model_extra["forwards"]


def test_the_route_is_counted_in_the_metrics(server, client):
    def count(status: str) -> float:
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        labels = {"route": "/v1/responses", "status": status}
        return sum(s.value for s in samples if s.name == "wedlm_requests_total" and s.labels == labels)

    ok, refused = count("200"), count("400")
    client.responses.create(model=MODEL_ID, input="x", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL_ID, input="x", store=True)
    assert (count("200"), count("400")) == (ok + 1, refused + 1)


def test_a_function_call_is_an_output_item_with_valid_arguments(client):
    response = client.responses.create(
        model=MODEL_ID, input="Weather in Paris?", tools=TOOLS, tool_choice=NAMED, parallel_tool_calls=False,
        max_output_tokens=48,
    )  # fmt: skip
    assert response.status == "completed" and response.tool_choice.name == "get_weather"
    [call] = response.output  # no text before the call: no message item
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)


def test_a_streamed_function_call_has_its_events(client):
    with client.responses.stream(
        model=MODEL_ID, input="Weather in Paris?", tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
        max_output_tokens=48,
    ) as stream:  # fmt: skip
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    calls = ["response.output_item.added", "response.function_call_arguments.delta"]
    calls += ["response.function_call_arguments.done", "response.output_item.done"]
    assert kinds == OPENING[:2] + calls + ["response.completed"]  # no message item: the answer holds no text
    [call] = final.output  # as the whole answer has it
    assert call.type == "function_call" and events[-2].item.arguments == call.arguments
    assert events[2].output_index == 0
    jsonschema.validate(json.loads(call.arguments), WEATHER)


def test_calls_and_their_outputs_go_back_in_as_input_items(client):
    given = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris", "days": 2}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    response = client.responses.create(model=MODEL_ID, input=given, tools=TOOLS, max_output_tokens=4)
    function = {"name": "get_weather", "arguments": given[1]["arguments"]}
    chat = [
        given[0],
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": function}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    tools = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]
    _, usage = chat_answer(client, chat, 4, tools=tools)
    assert response.usage.input_tokens == usage.prompt_tokens


def test_text_format_beside_tools_and_the_fields_clients_echo(client):
    """Tools with a response schema (openai-agents sends both for every Agent with tools and an output_type): a
    call under required, the schema's JSON under none; `prompt_cache_key` and `safety_identifier` are taken, and an
    earlier response's output items (`model_dump()`) go back in."""
    both = dict(model=MODEL_ID, input="Weather in Paris?", tools=TOOLS, text={"format": JSON_FORMAT})
    called = client.responses.create(**both, tool_choice="required", max_output_tokens=48)
    assert called.status == "completed" and {item.type for item in called.output} == {"function_call"}
    answered = client.responses.create(
        **both, tool_choice="none", max_output_tokens=40, prompt_cache_key="conv-1", safety_identifier="u1"
    )
    jsonschema.validate(json.loads(answered.output_text), SCHEMA)
    results = [{"type": "function_call_output", "call_id": item.call_id, "output": "sunny"} for item in called.output]
    given = [{"role": "user", "content": "Weather in Paris?"}, *[i.model_dump() for i in called.output], *results]
    again = client.responses.create(**(both | {"input": given}), tool_choice="none", max_output_tokens=40)
    jsonschema.validate(json.loads(again.output_text), SCHEMA)


def test_a_grammar_failure_names_the_tools_on_this_route(client):
    """A schema that exhausts the grammar library while decoding fails its request with a 400 that names this
    route's field: `tools` (the calls' grammar), not response_format."""
    endless = {"type": "object", "properties": {"a": {"$ref": "#/$defs/R"}}, "required": ["a"]}
    hostile = {  # its start is the model's choice of k; then the forced `, "a": {"a": ...` never ends
        "type": "object",
        "properties": {"k": {"enum": [1, 2]}, "a": {"$ref": "#/$defs/R"}},
        "required": ["k", "a"],
        "$defs": {"R": endless},
    }
    tools = [{"type": "function", "name": "loop", "parameters": hostile}]
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(model=MODEL_ID, input="go", tools=tools, tool_choice="required", max_output_tokens=400)
    assert error.value.body["param"] == "tools" and error.value.body["code"] == "grammar_failed"
    assert "The grammar of tools failed" in error.value.body["message"]
