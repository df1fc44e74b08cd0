"""OpenAI completions and chat bodies in, validated `ParsedRequest` out; OpenAI-style error bodies for everything
refused.

Every field a client sends is either honoured, accepted because it asks for the default (e.g. `presence_penalty: 0`)
or changes nothing here (`prompt_cache_key`, `safety_identifier`, `verbosity`: docs/serving.md), or refused with a
400 that names it: nothing is silently ignored. The null or empty values of the fields OpenAI itself puts in an
answer's message (`refusal`, `annotations`, `audio`, `function_call`) are accepted in the history, since clients
send earlier answers back as they got them (`message.model_dump()`). WeDLM's decoding options travel as extra body
fields (`wedlm_window_size`, ...), which the official client sends with `extra_body=`.
"""

import contextlib
from dataclasses import dataclass, field

from ..modeling import WeDLMDecodingConfig
from . import request_fields as check
from .api_errors import APIError, error_body, invalid
from .request_fields import MAX_LOGPROBS, MAX_N, WEDLM_FIELDS, wedlm_options
from .tool_calls import ToolSpec, history_calls, parse_tools
from .transformers_chat import merge_generation_config

__all__ = ["APIError", "ParsedRequest", "error_body", "invalid", "parse_chat", "parse_completion", "wedlm_options"]
__all__ += ["WEDLM_FIELDS"]


@dataclass
class ParsedRequest:
    """A validated completions, chat or Responses request; prompts are not tokenised yet."""

    kind: str  # "completion" or "chat" (the Responses API decodes as chat)
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
    json_schema: dict | None = None  # the JSON schema the answer's text follows (None: free text)
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
    # What the route's client calls the fields that later checks (prompt length, the grammar) name, where it is not
    # the chat route's name: the Responses API's `max_output_tokens`, `input`, `text.format`.
    names: dict[str, str] = field(default_factory=dict)

    def param(self, name: str) -> str:
        """The field the client sent for `name` (one of max_tokens, messages, response_format, tools)."""
        return self.names.get(name, name)


# Fields accepted only with the value that means "off"; anything else is refused as unsupported.
_OFF_VALUES = {
    "suffix": ((None, ""), None),
    "functions": ((None, []), None),
    "function_call": ((None, "none"), None),
    "service_tier": ((None, "auto", "default"), None),
    "store": ((None, False), None),
    "metadata": ((None, {}), None),
    "modalities": ((None, ["text"]), None),
    "reasoning_effort": ((None,), None),
}
_COMMON = {"model", "n", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "user"}
_COMMON |= {"cache_salt", "presence_penalty", "frequency_penalty", "logit_bias", "top_k", "min_p", "repetition_penalty"}
_COMMON |= {"prompt_cache_key", "safety_identifier"}
_COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "suffix", "response_format", "best_of", "logprobs"}
_CHAT_FIELDS = (
    _COMMON
    | {"messages", "max_completion_tokens", "logprobs", "verbosity"}
    | {"top_logprobs", "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls"}
    | {"response_format", "service_tier", "store", "metadata", "modalities", "reasoning_effort"}
)
_ROLES = ("system", "developer", "user", "assistant", "tool")
# What an answer's message holds besides content and tool_calls, null or empty unless the model refused or spoke.
_ECHOED = {"refusal": (None, ""), "annotations": (None, []), "audio": (None,), "function_call": (None,)}


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
    check.known_fields(body, _COMPLETION_FIELDS, _OFF_VALUES)
    request.prompts = _prompts(body.get("prompt"))
    request.echo = check.flag(body, "echo")
    if request.echo and body.get("max_tokens") == 0:
        request.max_tokens = 0  # scoring the prompt only
    else:
        request.max_tokens = check.positive_int(
            body, "max_tokens", hint=" (0 only with echo: true, to score the prompt)"
        )
    logprobs = body.get("logprobs")
    if logprobs is not None and (not check.is_int(logprobs) or not 0 <= logprobs <= MAX_LOGPROBS):
        raise invalid("logprobs", f"logprobs must be an integer from 0 to {MAX_LOGPROBS} (top tokens per position).")
    request.logprobs = logprobs
    common(body, request, model_id, defaults, max_window)
    request.json_schema = check.schema_format(body.get("response_format"), "response_format")
    return request


def parse_chat(body, model_id: str, defaults: WeDLMDecodingConfig, max_window: int | None = None) -> ParsedRequest:
    """`POST /v1/chat/completions`: `messages` with text content (a string or text parts)."""
    body, eos, origins = merge_generation_config(_object(body))
    with _named_for(origins):
        return _parse_chat(body, ParsedRequest(kind="chat", eos_token_ids=eos), model_id, defaults, max_window)


def _parse_chat(body: dict, request: ParsedRequest, model_id, defaults, max_window) -> ParsedRequest:
    check.known_fields(body, _CHAT_FIELDS, _OFF_VALUES)
    request.messages = _messages(body.get("messages"))
    max_tokens = check.positive_int(body, "max_tokens")
    max_completion = check.positive_int(body, "max_completion_tokens")
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise invalid("max_completion_tokens", "Give max_completion_tokens or max_tokens, not two different values.")
    request.max_tokens = max_completion if max_completion is not None else max_tokens
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise invalid("logprobs", f"logprobs must be true or false, got {logprobs!r}.")
    if top is not None and (not check.is_int(top) or not 0 <= top <= MAX_LOGPROBS):
        raise invalid("top_logprobs", f"top_logprobs must be an integer from 0 to {MAX_LOGPROBS}.")
    if top is not None and not logprobs:
        raise invalid("top_logprobs", "top_logprobs needs logprobs: true.")
    request.logprobs = (top or 0) if logprobs else None
    check.verbosity(body.get("verbosity"), "verbosity")
    common(body, request, model_id, defaults, max_window)
    request.json_schema = check.schema_format(body.get("response_format"), "response_format")
    request.tools = parse_tools(body)
    if request.tools is not None and request.tools.active and request.stop:
        raise invalid("stop", "stop strings cannot be combined with tools: one could end the answer inside a call.")
    return request


def common(body: dict, request: ParsedRequest, model_id: str, defaults: WeDLMDecodingConfig, max_window) -> None:
    """The fields every route reads alike (a route refuses, by its known fields, those it does not take)."""
    check.checked_model(body, model_id)
    check.identifiers(body)
    n = body.get("n", 1)
    if n is None:
        n = 1
    if not check.is_int(n) or not 1 <= n <= MAX_N:
        raise invalid("n", f"n must be an integer from 1 to {MAX_N}, got {n!r}.")
    if body.get("best_of") not in (None, 1, n):
        raise invalid("best_of", "best_of is not supported by this server; leave it out.", "unsupported_parameter")
    request.n = n
    seed = body.get("seed")
    if seed is not None and not check.is_int(seed):
        raise invalid("seed", f"seed must be an integer, got {seed!r}.")
    request.seed = seed
    request.stop = check.stop(body.get("stop"))
    request.stream = check.flag(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not request.stream:
            raise invalid("stream_options", "stream_options is only allowed with stream: true.")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise invalid("stream_options", 'stream_options takes only {"include_usage": true|false}.')
        include = options.get("include_usage", False)
        if not isinstance(include, bool):
            raise invalid("stream_options", "stream_options.include_usage must be true or false.")
        request.include_usage = include
    check.sampling(body, request)
    request.cache_salt = check.cache_salt(body)
    request.wedlm = wedlm_options(body, defaults, max_window)


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


def _prompts(prompt) -> list:
    if prompt is None:
        raise invalid("prompt", "prompt is required: a string, a list of strings, or token ids.", "missing_field")
    if isinstance(prompt, str):
        return [check.text(prompt, "prompt")]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [check.text(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
        if all(check.is_int(t) for t in prompt):
            return [list(prompt)]
        if all(isinstance(p, list) and p and all(check.is_int(t) for t in p) for p in prompt):
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
        _message_fields(message, role, param)
        calls = message.get("tool_calls") or None  # null and [] (an answer that called nothing) alike
        content = message.get("content")
        if content is None and role == "assistant":  # an answer that only called tools (or said nothing)
            content = ""
        entry = {"role": role, "content": _content(content, f"{param}.content")}
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


def _message_fields(message: dict, role: str, param: str) -> None:
    """A message has only the fields its role takes; an assistant's echoed answer fields only when null or empty."""
    allowed = {"role", "content", "name"} | {"assistant": {"tool_calls"}, "tool": {"tool_call_id"}}.get(role, set())
    echoed = set(_ECHOED) if role == "assistant" else set()
    extra = set(message) - allowed - echoed
    if extra:
        raise invalid(param, f"{param} has fields this server does not support: {', '.join(sorted(extra))}.")
    for name in sorted(echoed & set(message)):
        if not any(check.same(message[name], empty) for empty in _ECHOED[name]):
            raise invalid(
                f"{param}.{name}",
                f"{param}.{name} must be null or empty here: this server's answers never hold one (send the "
                "assistant's text as content).",
            )
    if "name" in message and not isinstance(message["name"], str):
        raise invalid(f"{param}.name", f"{param}.name must be a string.")


def _content(content, param: str) -> str:
    if isinstance(content, str):
        return check.text(content, param)
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid(param, f"{param} parts must be text parts ({{'type': 'text', 'text': ...}}).")
            texts.append(part["text"])
        return check.text("".join(texts), param)
    raise invalid(param, f"{param} must be a string or a list of text parts.")
