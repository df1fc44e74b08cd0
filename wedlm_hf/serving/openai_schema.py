"""OpenAI request bodies in, validated `ParsedRequest` out; OpenAI-style error bodies for everything refused.

Every field a client sends is either honoured, accepted because it asks for the default (e.g. `presence_penalty: 0`),
or refused with a 400 that names it: nothing is silently ignored. WeDLM's decoding options travel as extra body
fields (`wedlm_window_size`, ...), which the official client sends with `extra_body=`.
"""

import contextlib
import json
import math
from dataclasses import dataclass, field

from ..modeling import WeDLMDecodingConfig, WeDLMOptionError
from .api_errors import APIError, error_body, invalid
from .tool_calls import ToolSpec, history_calls, parse_tools
from .transformers_chat import merge_generation_config

__all__ = ["APIError", "ParsedRequest", "error_body", "invalid", "parse_chat", "parse_completion", "wedlm_options"]


@dataclass
class ParsedRequest:
    """A validated completions or chat request; prompts are not tokenised yet."""

    kind: str  # "completion" or "chat"
    prompts: list = field(default_factory=list)  # completion: list of str or list of token-id lists
    messages: list[dict] = field(default_factory=list)  # chat: [{"role", "content"}] with string content
    n: int = 1
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None  # None: none asked for; k: each token's log-probability and the k most likely
    echo: bool = False  # completions: the prompt (and its tokens' log-probabilities) before the completion
    json_schema: dict | None = None  # response_format: the JSON schema every choice's text follows (None: free text)
    tools: ToolSpec | None = None  # chat: the functions the model may call (`tool_calls`)
    cache_salt: str | None = None  # prefix-cache blocks are shared only with requests of the same salt
    # Sampling fields beyond temperature and top_p (`sampling.choice_sampler`); None: the model's default.
    top_k: int | None = None  # 0: off (the request's -1 or 0)
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[int, float] | None = None  # token id -> bias
    eos_token_ids: list[int] | None = None  # from `transformers chat`'s generation_config: must be the model's
    wedlm: WeDLMDecodingConfig | None = None  # the WeDLM options: the request's wedlm_* fields over the model's


WEDLM_FIELDS = WeDLMDecodingConfig.keys()
# A context-draft lookup tries every suffix size from n down to 1, each comparing up to 64 earlier occurrences of
# n tokens: its cost grows as n squared on the server's decoding thread, and longer suffixes rarely match anyway.
MAX_CONTEXT_NGRAM = 8
MAX_N = 128  # OpenAI's bound; the server's --max-request-rows bounds prompts x n further
MAX_LOGPROBS = 20  # top log-probabilities per token, as vLLM and OpenAI's chat route allow
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 256
MAX_SALT_CHARS = 256
MAX_SCHEMA_CHARS = 32_768  # a response_format schema, as JSON text: compiled per request (cached by text)
MAX_LOGIT_BIAS = 300  # logit_bias entries: one dense vector per choice, built from them
# A repetition penalty divides a repeated token's positive logits: far below 1, float32 logits overflow to inf.
MIN_REPETITION_PENALTY = 0.01

# Fields accepted only with the value that means "off"; anything else is refused as unsupported.
_OFF_VALUES = {
    "suffix": (None, ""),
    "functions": (None, []),
    "function_call": (None, "none"),
    "service_tier": (None, "auto", "default"),
    "store": (None, False),
    "metadata": (None, {}),
    "modalities": (None, ["text"]),
    "reasoning_effort": (None,),
}
_COMMON = {"model", "n", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "user"}
_COMMON |= {"cache_salt", "presence_penalty", "frequency_penalty", "logit_bias", "top_k", "min_p", "repetition_penalty"}
_COMPLETION_FIELDS = (
    _COMMON
    | {"prompt", "echo", "suffix", "response_format"}
    | {
        "best_of",
        "logprobs",
    }
)
_CHAT_FIELDS = (
    _COMMON
    | {"messages", "max_completion_tokens", "logprobs"}
    | {"top_logprobs", "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls"}
    | {"response_format", "service_tier", "store", "metadata", "modalities", "reasoning_effort"}
)
_ROLES = ("system", "developer", "user", "assistant", "tool")


def parse_completion(
    body, model_id: str, defaults: WeDLMDecodingConfig, max_window: int | None = None
) -> ParsedRequest:
    """`POST /v1/completions`: `prompt` is a string, a list of strings, a token-id list or a list of those."""
    body, eos, origins = merge_generation_config(_object(body))
    with _named_for(origins):
        return _parse_completion(
            body, ParsedRequest(kind="completion", eos_token_ids=eos), model_id, defaults, max_window
        )


def _parse_completion(body: dict, request: ParsedRequest, model_id, defaults, max_window) -> ParsedRequest:
    _known_fields(body, _COMPLETION_FIELDS)
    request.prompts = _prompts(body.get("prompt"))
    echo = body.get("echo", False)
    if echo is None:
        echo = False
    if not isinstance(echo, bool):
        raise invalid("echo", f"echo must be true or false, got {echo!r}.")
    request.echo = echo
    if echo and body.get("max_tokens") == 0:
        request.max_tokens = 0  # scoring the prompt only
    else:
        request.max_tokens = _positive_int(body, "max_tokens", hint=" (0 only with echo: true, to score the prompt)")
    logprobs = body.get("logprobs")
    if logprobs is not None and (not _is_int(logprobs) or not 0 <= logprobs <= MAX_LOGPROBS):
        raise invalid("logprobs", f"logprobs must be an integer from 0 to {MAX_LOGPROBS} (top tokens per position).")
    request.logprobs = logprobs
    _common(body, request, model_id, defaults, max_window)
    return request


def parse_chat(body, model_id: str, defaults: WeDLMDecodingConfig, max_window: int | None = None) -> ParsedRequest:
    """`POST /v1/chat/completions`: `messages` with text content (a string or text parts)."""
    body, eos, origins = merge_generation_config(_object(body))
    with _named_for(origins):
        return _parse_chat(body, ParsedRequest(kind="chat", eos_token_ids=eos), model_id, defaults, max_window)


def _parse_chat(body: dict, request: ParsedRequest, model_id, defaults, max_window) -> ParsedRequest:
    _known_fields(body, _CHAT_FIELDS)
    request.messages = _messages(body.get("messages"))
    max_tokens = _positive_int(body, "max_tokens")
    max_completion = _positive_int(body, "max_completion_tokens")
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise invalid("max_completion_tokens", "Give max_completion_tokens or max_tokens, not two different values.")
    request.max_tokens = max_completion if max_completion is not None else max_tokens
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise invalid("logprobs", f"logprobs must be true or false, got {logprobs!r}.")
    if top is not None and (not _is_int(top) or not 0 <= top <= MAX_LOGPROBS):
        raise invalid("top_logprobs", f"top_logprobs must be an integer from 0 to {MAX_LOGPROBS}.")
    if top is not None and not logprobs:
        raise invalid("top_logprobs", "top_logprobs needs logprobs: true.")
    request.logprobs = (top or 0) if logprobs else None
    _common(body, request, model_id, defaults, max_window)
    request.tools = parse_tools(body)
    if request.tools is not None and request.tools.active and request.json_schema is not None:
        raise invalid("response_format", "Give tools or response_format, not both: each decides the answer's form.")
    if request.tools is not None and request.tools.active and request.stop:
        raise invalid("stop", "stop strings cannot be combined with tools: one could end the answer inside a call.")
    return request


@contextlib.contextmanager
def _named_for(origins: dict[str, str]):
    """Errors about a field that `transformers chat`'s generation_config set name the key the client sent."""
    try:
        yield
    except APIError as error:
        if error.param in origins:
            error.message = f"{origins[error.param]}: {error.message}"
            error.param = origins[error.param]
        raise


def _object(body) -> dict:
    if not isinstance(body, dict):
        raise invalid(None, "The request body must be a JSON object.", code="invalid_json")
    return body


def _known_fields(body: dict, allowed: set[str]) -> None:
    for name in body:
        if name.startswith("wedlm_"):
            if name not in WEDLM_FIELDS:
                raise invalid(
                    name, f"Unknown WeDLM option {name!r}; known: {', '.join(WEDLM_FIELDS)}.", "unknown_field"
                )
        elif name not in allowed:
            raise invalid(name, f"Unrecognized request argument supplied: {name}.", "unknown_field")
        elif name in _OFF_VALUES and not any(_same(body[name], off) for off in _OFF_VALUES[name]):
            raise invalid(name, f"{name} is not supported by this server; leave {name} out.", "unsupported_parameter")


def _common(
    body: dict, request: ParsedRequest, model_id: str, defaults: WeDLMDecodingConfig, max_window: int | None
) -> None:
    model = body.get("model")
    if model is not None and model != model_id:
        raise APIError(  # 404, as OpenAI and vLLM answer a model they do not serve
            404,
            f"The model {model!r} is not served here; this server serves {model_id!r} (see GET /v1/models).",
            param="model",
            code="model_not_found",
        )
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise invalid("user", "user must be a string.")
    n = body.get("n", 1)
    if n is None:
        n = 1
    if not _is_int(n) or not 1 <= n <= MAX_N:
        raise invalid("n", f"n must be an integer from 1 to {MAX_N}, got {n!r}.")
    if body.get("best_of") not in (None, 1, n):
        raise invalid("best_of", "best_of is not supported by this server; leave it out.", "unsupported_parameter")
    request.n = n
    request.temperature = _number(body, "temperature", 0.0, 2.0)
    request.top_p = _number(body, "top_p", 0.0, 1.0)
    if request.top_p == 0.0:
        raise invalid("top_p", "top_p must be above 0 and at most 1 (1 keeps every token).")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise invalid("seed", f"seed must be an integer, got {seed!r}.")
    request.seed = seed
    request.stop = _stop(body.get("stop"))
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise invalid("stream", f"stream must be true or false, got {stream!r}.")
    request.stream = stream
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise invalid("stream_options", "stream_options is only allowed with stream: true.")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise invalid("stream_options", 'stream_options takes only {"include_usage": true|false}.')
        include = options.get("include_usage", False)
        if not isinstance(include, bool):
            raise invalid("stream_options", "stream_options.include_usage must be true or false.")
        request.include_usage = include
    _sampling(body, request)
    request.json_schema = _response_format(body.get("response_format"))
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not 0 < len(salt) <= MAX_SALT_CHARS):
        raise invalid("cache_salt", f"cache_salt must be a non-empty string of at most {MAX_SALT_CHARS} characters.")
    request.cache_salt = salt
    request.wedlm = wedlm_options(body, defaults, max_window)


def _sampling(body: dict, request: ParsedRequest) -> None:
    """OpenAI's penalties and logit_bias, and vLLM's top_k, min_p and repetition_penalty, with their ranges."""
    request.presence_penalty = _number(body, "presence_penalty", -2.0, 2.0)
    request.frequency_penalty = _number(body, "frequency_penalty", -2.0, 2.0)
    request.min_p = _number(body, "min_p", 0.0, 1.0)
    request.repetition_penalty = _number(body, "repetition_penalty", MIN_REPETITION_PENALTY, 2.0)
    top_k = body.get("top_k")
    if top_k is not None and (not _is_int(top_k) or top_k < -1):
        raise invalid("top_k", f"top_k must be an integer >= 1, or -1 or 0 to consider every token; got {top_k!r}.")
    request.top_k = None if top_k is None else max(top_k, 0)
    request.logit_bias = _logit_bias(body.get("logit_bias"))


def _logit_bias(value) -> dict[int, float] | None:
    """{token id (a decimal string, as JSON keys are): bias from -100 to 100}; ids are checked against the
    vocabulary when the choices are made."""
    if value is None or value == {}:
        return None
    if not isinstance(value, dict) or len(value) > MAX_LOGIT_BIAS:
        raise invalid(
            "logit_bias",
            f"logit_bias must be an object of at most {MAX_LOGIT_BIAS} token ids mapped to biases from -100 to 100.",
        )
    bias = {}
    for key, number in value.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 9):
            raise invalid("logit_bias", f"logit_bias keys are token ids written as decimal strings, got {key!r}.")
        if not _is_number(number) or math.isnan(number) or not -100 <= number <= 100:
            raise invalid("logit_bias", f"logit_bias[{key!r}] must be a number from -100 to 100, got {number!r}.")
        bias[int(key)] = float(number)
    return bias


def _response_format(value) -> dict | None:
    """OpenAI's response_format: None for text, else the JSON schema the output follows ({"type": "object"} for
    json_object; a json_schema without a schema admits any JSON value)."""
    kinds = '"text", "json_object" or "json_schema"'
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise invalid("response_format", f'response_format must be an object with a "type": {kinds}.')
    kind, extra = value["type"], set(value) - {"type", "json_schema"}
    if kind not in ("text", "json_object", "json_schema"):
        raise invalid("response_format", f"response_format type {kind!r} is not one of {kinds}.")
    if extra or (kind != "json_schema" and "json_schema" in value):
        raise invalid(
            "response_format", f"response_format {{'type': {kind!r}}} takes no {sorted(set(value) - {'type'})}."
        )
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise invalid(
            "response_format",
            'response_format {"type": "json_schema"} needs "json_schema": {"name": "...", "schema": {...}}.',
        )
    unknown = sorted(set(spec) - {"name", "description", "schema", "strict"})
    if unknown:
        raise invalid(
            "response_format", f"response_format.json_schema takes name, description, schema and strict, not {unknown}."
        )
    if spec.get("strict") not in (None, True, False):
        raise invalid("response_format", "response_format.json_schema.strict must be true or false.")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise invalid("response_format", "response_format.json_schema.schema must be a JSON schema object.")
    if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
        raise invalid(
            "response_format", f"response_format's schema is over this server's limit of {MAX_SCHEMA_CHARS} characters."
        )
    return schema


def wedlm_options(body: dict, defaults: WeDLMDecodingConfig, max_window: int | None = None) -> WeDLMDecodingConfig:
    """The body's `wedlm_*` fields over `defaults`, checked by the core (a 400 naming the field, in the words
    `generate` uses), then against this server's own limits: W at most `max_window`, the context n-gram at most
    `MAX_CONTEXT_NGRAM`."""
    given = {key: body[key] for key in WEDLM_FIELDS if key in body}
    try:
        options = WeDLMDecodingConfig.from_values(defaults.as_kwargs(), given)
    except WeDLMOptionError as error:
        raise invalid(error.key, str(error)) from None
    if max_window is not None and options.window_size > max_window:
        raise invalid(
            "wedlm_window_size",
            f"wedlm_window_size {options.window_size} is above this server's limit of {max_window} "
            "(--max-window-size); 16 is usual.",
        )
    if options.context_ngram > MAX_CONTEXT_NGRAM:
        raise invalid(
            "wedlm_context_ngram",
            f"wedlm_context_ngram must be an integer from 1 to {MAX_CONTEXT_NGRAM} on this server (3 is usual), got "
            f"{options.context_ngram!r}.",
        )
    return options


def _prompts(prompt) -> list:
    if prompt is None:
        raise invalid("prompt", "prompt is required: a string, a list of strings, or token ids.", "missing_field")
    if isinstance(prompt, str):
        return [_text(prompt, "prompt")]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [_text(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
        if all(_is_int(t) for t in prompt):
            return [list(prompt)]
        if all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt):
            return [list(p) for p in prompt]
    raise invalid("prompt", "prompt must be a string, a non-empty list of strings, a token-id list or a list of those.")


def _messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "messages must be a non-empty list of {role, content} objects.", "missing_field")
    parsed = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid(param, f"{param} must be an object with role and content.")
        role = message.get("role")
        if role not in _ROLES:
            raise invalid(f"{param}.role", f"{param}.role must be one of {', '.join(_ROLES)}, got {role!r}.")
        allowed = {"role", "content", "name"} | {"assistant": {"tool_calls"}, "tool": {"tool_call_id"}}.get(role, set())
        extra = set(message) - allowed
        if extra:
            raise invalid(param, f"{param} has fields this server does not support: {', '.join(sorted(extra))}.")
        if "name" in message and not isinstance(message["name"], str):
            raise invalid(f"{param}.name", f"{param}.name must be a string.")
        calls = message.get("tool_calls")
        if calls is not None and message.get("content") is None:  # an assistant turn that only called tools
            parsed.append({"role": role, "content": "", "tool_calls": history_calls(calls, f"{param}.tool_calls")})
            continue
        entry = {"role": role, "content": _content(message.get("content"), f"{param}.content")}
        if calls is not None:
            entry["tool_calls"] = history_calls(calls, f"{param}.tool_calls")
        if role == "tool":
            call_id = message.get("tool_call_id")
            called = {c.get("id") for m in parsed for c in m.get("tool_calls", ())}
            if not isinstance(call_id, str) or call_id not in called:
                raise invalid(
                    f"{param}.tool_call_id", f"{param}.tool_call_id must name a call of an earlier assistant message."
                )
            entry["tool_call_id"] = call_id
        parsed.append(entry)
    return parsed


def _content(content, param: str) -> str:
    if isinstance(content, str):
        return _text(content, param)
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid(param, f"{param} parts must be text parts ({{'type': 'text', 'text': ...}}).")
            texts.append(part["text"])
        return _text("".join(texts), param)
    raise invalid(param, f"{param} must be a string or a list of text parts.")


def _stop(stop) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOP_STRINGS or not all(isinstance(s, str) and s for s in stops):
        raise invalid("stop", f"stop must be a non-empty string or a list of up to {MAX_STOP_STRINGS} of them.")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise invalid("stop", f"stop strings must be at most {MAX_STOP_CHARS} characters long.")
    return [_text(s, "stop") for s in stops]


def _text(value: str, param: str) -> str:
    """A string that is valid Unicode text: JSON can carry lone surrogates (\\ud800), which no tokenizer takes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid(
            param,
            f"{param} is not valid Unicode: a lone surrogate at character {exc.start} (e.g. \\ud800 without "
            "its pair); send UTF-8 text.",
            code="invalid_text",
        ) from None
    return value


def _positive_int(body: dict, name: str, hint: str = "") -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value) or value < 1:
        raise invalid(name, f"{name} must be an integer >= 1{hint}, got {value!r}.")
    return value


def _number(body: dict, name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_number(value) or math.isnan(value) or not low <= value <= high:
        raise invalid(name, f"{name} must be a number from {low:g} to {high:g}, got {value!r}.")
    return float(value)


def _same(value, off) -> bool:
    """Equal and of the same JSON type (so `logprobs: 0`, which asks for log probabilities, is not `false`)."""
    if isinstance(off, (int, float)) and not isinstance(off, bool):
        return _is_number(value) and value == off
    return type(value) is type(off) and value == off


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
