"""The checks every route's request fields share, each told the field's name as that route's client sent it.

A route's parser (`openai_schema` for completions and chat, `responses_request` for the Responses API) walks its
own body shape and calls these with its own names, so an error always names the field the caller wrote: never a
field of another route.
"""

import json
import math

from ..modeling import WeDLMDecodingConfig, WeDLMOptionError
from .api_errors import APIError, invalid

WEDLM_FIELDS = WeDLMDecodingConfig.keys()
# A context-draft lookup tries every suffix size from n down to 1, each comparing up to 64 earlier occurrences of
# n tokens: its cost grows as n squared on the server's decoding thread, and longer suffixes rarely match anyway.
MAX_CONTEXT_NGRAM = 8
MAX_N = 128  # OpenAI's bound; the server's --max-request-rows bounds prompts x n further
MAX_LOGPROBS = 20  # top log-probabilities per token, as vLLM and OpenAI's chat route allow
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 256
MAX_SALT_CHARS = 256  # cache_salt, prompt_cache_key, safety_identifier
MAX_SCHEMA_CHARS = 32_768  # a response schema, as JSON text: compiled per request (cached by text)
# Nesting of a schema or a call's arguments: chat templates render them recursively (Jinja's tojson), and so does
# the grammar compiler; far deeper than any real tool needs, far shallower than Python's recursion limit.
MAX_JSON_DEPTH = 64
MAX_LOGIT_BIAS = 300  # logit_bias entries: one dense vector per choice, built from them
# A repetition penalty divides a repeated token's positive logits: far below 1, float32 logits overflow to inf.
MIN_REPETITION_PENALTY = 0.01
VERBOSITY = (None, "low", "medium", "high")  # OpenAI's `verbosity`: a hint to reasoning models, no effect here


def known_fields(body: dict, allowed: set[str], off_values: dict) -> None:
    """Every field is known (`wedlm_*` among WeDLM's options); a field of `off_values` only with a value that asks
    for nothing (its allowed values, and optionally the words that refuse the others)."""
    for name, value in body.items():
        if name.startswith("wedlm_"):
            if name not in WEDLM_FIELDS:
                known = ", ".join(WEDLM_FIELDS)
                raise invalid(name, f"Unknown WeDLM option {name!r}; known: {known}.", "unknown_field")
        elif name not in allowed:
            raise invalid(name, f"Unrecognized request argument supplied: {name}.", "unknown_field")
        elif name in off_values:
            allowed_values, why = off_values[name]
            if not any(same(value, off) for off in allowed_values):
                words = why or f"{name} is not supported by this server; leave {name} out."
                raise invalid(name, words, "unsupported_parameter")


def checked_model(body: dict, model_id: str) -> None:
    model = body.get("model")
    if model is not None and model != model_id:
        raise APIError(  # 404, as OpenAI and vLLM answer a model they do not serve
            404,
            f"The model {model!r} is not served here; this server serves {model_id!r} (see GET /v1/models).",
            param="model",
            code="model_not_found",
        )


def identifiers(body: dict) -> None:
    """`user`, `prompt_cache_key` and `safety_identifier`: strings that name a caller or a conversation. None of
    them changes an answer here (docs/serving.md); they are checked and bounded like every field."""
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise invalid("user", "user must be a string.")
    for name in ("prompt_cache_key", "safety_identifier"):
        value = body.get(name)
        if value is not None and (not isinstance(value, str) or len(value) > MAX_SALT_CHARS):
            raise invalid(name, f"{name} must be a string of at most {MAX_SALT_CHARS} characters.")


def verbosity(value, param: str) -> None:
    if value not in VERBOSITY:
        raise invalid(param, f'{param} must be "low", "medium" or "high", got {value!r}.')


def flag(body: dict, name: str) -> bool:
    """A true/false field that defaults to false (null included)."""
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(name, f"{name} must be true or false, got {value!r}.")
    return value


def cache_salt(body: dict) -> str | None:
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not 0 < len(salt) <= MAX_SALT_CHARS):
        raise invalid("cache_salt", f"cache_salt must be a non-empty string of at most {MAX_SALT_CHARS} characters.")
    return salt


def sampling(body: dict, request) -> None:
    """temperature and top_p, OpenAI's penalties and logit_bias, and vLLM's top_k, min_p and repetition_penalty,
    with their ranges, onto `request`."""
    request.temperature = number(body, "temperature", 0.0, 2.0)
    request.top_p = number(body, "top_p", 0.0, 1.0)
    if request.top_p == 0.0:
        raise invalid("top_p", "top_p must be above 0 and at most 1 (1 keeps every token).")
    request.presence_penalty = number(body, "presence_penalty", -2.0, 2.0)
    request.frequency_penalty = number(body, "frequency_penalty", -2.0, 2.0)
    request.min_p = number(body, "min_p", 0.0, 1.0)
    request.repetition_penalty = number(body, "repetition_penalty", MIN_REPETITION_PENALTY, 2.0)
    top_k = body.get("top_k")
    if top_k is not None and (not is_int(top_k) or top_k < -1):
        raise invalid("top_k", f"top_k must be an integer >= 1, or -1 or 0 to consider every token; got {top_k!r}.")
    request.top_k = None if top_k is None else max(top_k, 0)
    request.logit_bias = logit_bias(body.get("logit_bias"))


def logit_bias(value) -> dict[int, float] | None:
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
    for key, number_ in value.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 9):
            raise invalid("logit_bias", f"logit_bias keys are token ids written as decimal strings, got {key!r}.")
        if not is_number(number_) or math.isnan(number_) or not -100 <= number_ <= 100:
            raise invalid("logit_bias", f"logit_bias[{key!r}] must be a number from -100 to 100, got {number_!r}.")
        bias[int(key)] = float(number_)
    return bias


def schema_format(value, param: str) -> dict | None:
    """OpenAI's `{"type": "text" | "json_object" | "json_schema", ...}` (chat's `response_format`, with the schema's
    fields under `json_schema`; the Responses API's `text.format`, with them beside `type`): None for text, else the
    JSON schema the answer follows ({"type": "object"} for json_object; a json_schema without a schema admits any
    JSON value)."""
    kinds = '"text", "json_object" or "json_schema"'
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise invalid(param, f'{param} must be an object with a "type": {kinds}.')
    kind = value["type"]
    if kind not in ("text", "json_object", "json_schema"):
        raise invalid(param, f"{param} type {kind!r} is not one of {kinds}.")
    nested = param == "response_format"
    spec = value.get("json_schema") if nested else {k: v for k, v in value.items() if k != "type"}
    extra = sorted(set(value) - {"type", "json_schema"}) if nested else []
    if kind != "json_schema" and set(value) != {"type"}:
        raise invalid(param, f"{param} {{'type': {kind!r}}} takes no {sorted(set(value) - {'type'})}.")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    where = f"{param}.json_schema" if nested else param
    if extra or not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        shape = '"json_schema": {"name": "...", "schema": {...}}' if nested else '"name": "...", "schema": {...}'
        raise invalid(param, f'{param} {{"type": "json_schema"}} needs {shape}.')
    unknown = sorted(set(spec) - {"name", "description", "schema", "strict"})
    if unknown:
        raise invalid(param, f"{where} takes name, description, schema and strict, not {unknown}.")
    if spec.get("strict") not in (None, True, False):
        raise invalid(param, f"{where}.strict must be true or false.")
    if not isinstance(spec.get("description", ""), str):
        raise invalid(param, f"{where}.description must be a string.")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise invalid(param, f"{where}.schema must be a JSON schema object.")
    if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
        raise invalid(param, f"{param}'s schema is over this server's limit of {MAX_SCHEMA_CHARS} characters.")
    shallow(schema, param, f"{param}'s schema")
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


def json_depth(value) -> int:
    """How deeply `value` (parsed JSON) nests objects and lists; a scalar is 0. Walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in children)
    return deepest


def shallow(value, param: str, what: str) -> None:
    """Refuses JSON nested deeper than `MAX_JSON_DEPTH` (`what` names it in the message)."""
    depth = json_depth(value)
    if depth > MAX_JSON_DEPTH:
        raise invalid(
            param,
            f"{what} nests {depth} levels deep; this server takes at most {MAX_JSON_DEPTH} (the chat template and the "
            "grammar compiler render it level by level).",
        )


def json_object_text(value, param: str, what: str) -> dict:
    """A call's `arguments`: a JSON object as text (an object given as is is taken too), finite numbers only, at
    most `MAX_JSON_DEPTH` deep."""
    try:
        parsed = json.loads(value, parse_constant=_no_constant) if isinstance(value, str) else value
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        raise invalid(param, f"{what} are a JSON object, as text (finite numbers only: no NaN or Infinity).")
    shallow(parsed, param, what)
    return parsed


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def text(value: str, param: str) -> str:
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


def stop(value) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > MAX_STOP_STRINGS or not all(isinstance(s, str) and s for s in stops):
        raise invalid("stop", f"stop must be a non-empty string or a list of up to {MAX_STOP_STRINGS} of them.")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise invalid("stop", f"stop strings must be at most {MAX_STOP_CHARS} characters long.")
    return [text(s, "stop") for s in stops]


def positive_int(body: dict, name: str, hint: str = "") -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not is_int(value) or value < 1:
        raise invalid(name, f"{name} must be an integer >= 1{hint}, got {value!r}.")
    return value


def number(body: dict, name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not is_number(value) or math.isnan(value) or not low <= value <= high:
        raise invalid(name, f"{name} must be a number from {low:g} to {high:g}, got {value!r}.")
    return float(value)


def same(value, off) -> bool:
    """Equal and of the same JSON type (so `logprobs: 0`, which asks for log probabilities, is not `false`)."""
    if isinstance(off, (int, float)) and not isinstance(off, bool):
        return is_number(value) and value == off
    return type(value) is type(off) and value == off


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
