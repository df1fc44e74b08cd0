"""Request validation: what is honoured, what is accepted because it asks for the default, what is refused."""

import pytest

from wedlm_hf.modeling import WeDLMDecodingConfig
from wedlm_hf.serving.openai_schema import APIError, parse_chat, parse_completion

DEFAULTS = WeDLMDecodingConfig()


def completion(**body):
    return parse_completion({"prompt": "x", **body}, "m", DEFAULTS)


def refused(parse, body, param: str | None, match: str | None = None):
    with pytest.raises(APIError, match=match) as error:
        parse(body, "m", DEFAULTS)
    assert error.value.status == 400 and error.value.param == param
    assert error.value.body()["error"]["type"] == "invalid_request_error"
    return error.value


def test_defaults_and_honoured_fields():
    request = completion()
    assert (request.n, request.max_tokens, request.stream, request.stop, request.wedlm) == (
        1,
        None,
        False,
        [],
        DEFAULTS,
    )
    request = completion(
        model="m",
        max_tokens=5,
        temperature=0.7,
        top_p=0.9,
        seed=3,
        n=2,
        stop="##",
        stream=True,
        stream_options={"include_usage": True},
        user="me",
        wedlm_window_size=8,
        wedlm_entropy_threshold=None,
        wedlm_pos_penalty_factor=0,
        wedlm_lossless=True,
    )
    assert (request.max_tokens, request.temperature, request.top_p, request.seed, request.n) == (5, 0.7, 0.9, 3, 2)
    assert request.stop == ["##"] and request.stream and request.include_usage
    assert request.wedlm == WeDLMDecodingConfig(8, None, 0.0, True)


def test_context_draft_fields_over_the_checkpoint_defaults():
    """Both fields default to the generation config's values (here: off, 5), a request overrides each alone."""
    checkpoint = WeDLMDecodingConfig(16, 0.4, 0.02, True, context_drafts=False, context_ngram=5)
    request = parse_completion({"prompt": "x"}, "m", checkpoint)
    assert (request.wedlm.context_drafts, request.wedlm.context_ngram) == (False, 5)
    request = parse_completion({"prompt": "x", "wedlm_context_drafts": True}, "m", checkpoint)
    assert (request.wedlm.context_drafts, request.wedlm.context_ngram) == (True, 5)
    request = parse_chat({"messages": [{"role": "user", "content": "hi"}], "wedlm_context_ngram": 8}, "m", checkpoint)
    assert (request.wedlm.context_drafts, request.wedlm.context_ngram) == (False, 8)
    error = refused(parse_completion, {"prompt": "x", "wedlm_context_ngram": 9}, "wedlm_context_ngram")
    assert "from 1 to 8" in error.message and "got 9" in error.message
    unknown = refused(parse_completion, {"prompt": "x", "wedlm_context": 1}, "wedlm_context")
    assert "wedlm_context_drafts, wedlm_context_ngram" in unknown.message  # the known list names the new fields


def test_prompt_shapes():
    assert completion(prompt=["a", "b"]).prompts == ["a", "b"]
    assert completion(prompt=[1, 2, 3]).prompts == [[1, 2, 3]]
    assert completion(prompt=[[1], [2, 3]]).prompts == [[1], [2, 3]]
    for bad in ([], [1, "a"], [[]], {"text": "x"}, 3, [True]):
        refused(parse_completion, {"prompt": bad}, "prompt")


def test_default_values_of_unsupported_features_are_accepted():
    request = completion(presence_penalty=0, frequency_penalty=0.0, logit_bias={}, echo=False, logprobs=None, best_of=1)
    assert request.n == 1 and request.logit_bias is None
    assert completion(n=3, best_of=3).n == 3


@pytest.mark.parametrize(
    "body, param",
    [
        ({"logprobs": 21}, "logprobs"),  # at most 20 top log-probabilities
        ({"logprobs": True}, "logprobs"),  # an integer on /v1/completions
        ({"echo": 1}, "echo"),  # true or false
        ({"best_of": 4}, "best_of"),
        ({"suffix": "end"}, "suffix"),
        ({"presence_penalty": False}, "presence_penalty"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"logit_bias": {"5": 100.5}}, "logit_bias"),
        ({"logit_bias": [5]}, "logit_bias"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": -0.1}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"wedlm_windowsize": 4}, "wedlm_windowsize"),
        ({"wedlm_window_size": 1.5}, "wedlm_window_size"),
        ({"wedlm_entropy_threshold": float("nan")}, "wedlm_entropy_threshold"),
        ({"wedlm_pos_penalty_factor": float("inf")}, "wedlm_pos_penalty_factor"),
        ({"wedlm_lossless": 1}, "wedlm_lossless"),
        ({"wedlm_context_drafts": "yes"}, "wedlm_context_drafts"),
        ({"wedlm_context_drafts": None}, "wedlm_context_drafts"),
        ({"wedlm_context_ngram": 0}, "wedlm_context_ngram"),
        ({"wedlm_context_ngram": 9}, "wedlm_context_ngram"),
        ({"wedlm_context_ngram": 2.0}, "wedlm_context_ngram"),
        ({"wedlm_context_ngram": True}, "wedlm_context_ngram"),
        ({"max_tokens": True}, "max_tokens"),
        ({"seed": 1.0}, "seed"),
        ({"n": 129}, "n"),
        ({"stop": ""}, "stop"),
        ({"stop": [1]}, "stop"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options"),
        ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, "stream_options"),
        ({"user": 5}, "user"),
    ],
)
def test_refused_fields_are_named(body, param):
    error = refused(parse_completion, {"prompt": "x", **body}, param)
    assert param in error.message or "log probabilities" in error.message


def test_unknown_model_and_non_object_bodies():
    for parse, body in (
        (parse_completion, {"prompt": "x"}),
        (parse_chat, {"messages": [{"role": "user", "content": "x"}]}),
    ):
        with pytest.raises(APIError, match="not served here") as error:  # OpenAI's and vLLM's status for it
            parse({**body, "model": "gpt-4o"}, "m", DEFAULTS)
        assert (error.value.status, error.value.param, error.value.code) == (404, "model", "model_not_found")
        assert error.value.body()["error"]["type"] == "invalid_request_error"
    for body in ([], "x", None, 3):
        assert refused(parse_completion, body, None).code == "invalid_json"


def test_chat_messages_and_token_limits():
    request = parse_chat(
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    "name": "u",
                },
            ],
            "max_completion_tokens": 7,
            "response_format": {"type": "text"},
            "tools": None,
        },
        "m",
        DEFAULTS,
    )
    assert request.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}]
    assert request.max_tokens == 7
    user = [{"role": "user", "content": "x"}]
    refused(parse_chat, {"messages": user, "max_tokens": 3, "max_completion_tokens": 4}, "max_completion_tokens")
    refused(parse_chat, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content")
    refused(parse_chat, {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id")
    refused(parse_chat, {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role")
    for bad in (
        "json",
        {"type": "xml"},
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"schema": {}}},
        {"type": "json_schema", "json_schema": {"name": "r", "schema": []}},
        {"type": "json_schema", "json_schema": {"name": "r", "strict": "yes"}},
        {"type": "json_schema", "json_schema": {"name": "r", "format": "x"}},
        {"type": "json_object", "json_schema": {}},
        {"type": "json_schema", "json_schema": {"name": "r", "schema": {"enum": ["x" * 40_000]}}},
    ):
        refused(parse_chat, {"messages": user, "response_format": bad}, "response_format")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = parse_chat({"messages": user, "response_format": {"type": "json_object"}}, "m", DEFAULTS)
    assert chat.json_schema == {"type": "object"}
    body = {"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}}
    assert parse_completion(body, "m", DEFAULTS).json_schema == schema
    refused(parse_chat, {"messages": user, "prompt": "x"}, "prompt")
    refused(parse_completion, {"prompt": "x", "messages": user}, "messages")


def test_sampling_fields_are_parsed():
    request = completion(
        presence_penalty=0.5,
        frequency_penalty=-1,
        logit_bias={"7": -100, "12": 3.5},
        top_k=-1,
        min_p=0.1,
        repetition_penalty=1.2,
    )
    assert (request.presence_penalty, request.frequency_penalty) == (0.5, -1.0)
    assert request.logit_bias == {7: -100.0, 12: 3.5}
    assert (request.top_k, request.min_p, request.repetition_penalty) == (0, 0.1, 1.2)
    assert completion(top_k=5).top_k == 5
    assert completion().top_k is None and completion().repetition_penalty is None
