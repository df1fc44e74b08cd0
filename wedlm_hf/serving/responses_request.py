"""`POST /v1/responses` bodies in, a validated request out: the Responses API's own fields, checked in its own names.

The route decodes as chat does (its conversation becomes chat messages, its tools the chat template's), but its body
is read here, field by field as this API writes it, so every error names what the caller sent:
`input[2].arguments`, `input[3].call_id`, `tools[0].parameters`, `text.format`, `max_output_tokens`. The shared
checks (`request_fields`) and the chat route's common fields (`openai_schema.common`) are told these names; what
later checks name (the prompt's length, the grammar) is mapped by the request's `names`.

The server keeps nothing between requests, so what needs stored state (`store: true`, `previous_response_id`,
`conversation`) is refused with a 400 naming it, as are fields it does not know.
"""

from dataclasses import dataclass, field

from . import request_fields as check
from .api_errors import invalid
from .openai_schema import ParsedRequest, common
from .tool_calls import RESPONSES_TOOLS, parse_tools

_ROLES = ("system", "developer", "user", "assistant")
_STATELESS = (
    "This server is stateless and keeps no responses, so {name} cannot be used: send the whole conversation in "
    "input (earlier turns as messages, e.g. the previous response's output items)."
)
# Fields accepted only with the values that ask for nothing this server lacks; (values, why the others are refused).
_OFF_VALUES = {
    "store": ((None, False), "This server stores no responses: leave store out or set it to false."),
    "previous_response_id": ((None,), _STATELESS.format(name="previous_response_id")),
    "conversation": ((None,), _STATELESS.format(name="conversation")),
    "background": ((None, False), "Background responses need stored state; this server answers in the request."),
    "include": ((None, []), "include is not supported by this server; leave it out."),
    "reasoning": ((None, {}), "reasoning is not supported by this server; leave it out."),
    "service_tier": ((None, "auto", "default"), "service_tier is not supported by this server; leave it out."),
    "truncation": ((None, "disabled"), 'truncation "auto" is not supported: a too-long input is refused (400).'),
}
_FIELDS = {"input", "instructions", "max_output_tokens", "text", "metadata", "tools", "tool_choice"}
_FIELDS |= {"parallel_tool_calls", "model", "temperature", "top_p", "stream", "user", "cache_salt"}
_FIELDS |= {"prompt_cache_key", "safety_identifier"} | set(_OFF_VALUES)
# The chat names later checks use -> this API's fields.
NAMES = {"max_tokens": "max_output_tokens", "messages": "input", "response_format": "text.format"}
# Fields of an earlier answer's output items that clients send back as they got them (`item.model_dump()`), taken
# where null: they describe how the item was made, and this server's items never set them.
_ECHOED = {"message": {"phase"}, "function_call": {"async", "async_", "caller", "namespace"}}
MAX_METADATA_KEYS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512  # OpenAI's bounds


@dataclass
class ResponsesRequest(ParsedRequest):
    """A request parsed from a Responses body, plus the fields the `Response` object repeats back."""

    echoed: dict = field(default_factory=dict)


def parse_responses(body, model_id: str, defaults, max_window: int | None = None) -> ResponsesRequest:
    """`input` (a string or items) and `instructions` become chat messages, `max_output_tokens` the token budget,
    `text.format` the answer's schema, `tools` (flat function tools) the tools."""
    if not isinstance(body, dict):
        raise invalid(None, "The request body must be a JSON object.", code="invalid_json")
    check.known_fields(body, _FIELDS, _OFF_VALUES)
    request = ResponsesRequest(kind="chat", names=dict(NAMES))
    request.messages = _conversation(body)
    request.max_tokens = check.positive_int(body, "max_output_tokens")
    common(body, request, model_id, defaults, max_window)
    text = _text_config(body.get("text"))
    request.json_schema = check.schema_format(text["format"], "text.format")
    request.tools = parse_tools(body, RESPONSES_TOOLS)
    request.echoed = {
        "instructions": body.get("instructions"),
        "max_output_tokens": request.max_tokens,
        "metadata": _metadata(body.get("metadata")),
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "temperature": request.temperature,
        "text": text,
        "tool_choice": body.get("tool_choice") or ("auto" if body.get("tools") else "none"),
        "tools": body.get("tools") or [],
        "top_p": request.top_p,
        "user": body.get("user"),
    }
    return request


def _conversation(body: dict) -> list[dict]:
    """Chat messages: `instructions` as a system message first, then the input's items (an answer's text and the
    calls that follow it are one assistant turn)."""
    messages = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid("instructions", "instructions must be a string (a system message put first).")
        messages.append({"role": "system", "content": check.text(instructions, "instructions")})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": check.text(given, "input")})
    elif isinstance(given, list) and given:
        calls: set[str] = set()
        for i, item in enumerate(given):
            message = _item(item, f"input[{i}]", calls)
            last = messages[-1] if messages else None
            if "tool_calls" in message and last is not None and last["role"] == "assistant":
                last["tool_calls"] = last.get("tool_calls", []) + message["tool_calls"]  # one turn: text, then calls
                continue
            messages.append(message)
    else:
        raise invalid("input", "input is required: a string or a non-empty list of messages.", "missing_field")
    return messages


def _item(item, param: str, calls: set[str]) -> dict:
    """One input item: a message (`role`, `content`: a string or input_text / output_text parts), a function call
    of an earlier answer, or a call's output (`calls`: the call ids seen so far)."""
    if not isinstance(item, dict):
        raise invalid(param, f"{param} must be a message object with role and content.")
    kind = item.get("type", "message")
    if kind in ("function_call", "function_call_output"):
        return _tool_item(item, kind, param, calls)
    if kind != "message":
        raise invalid(
            f"{param}.type",
            f"{param} is an item of type {kind!r}; this server takes messages, function calls and their outputs.",
        )
    extra = sorted(set(item) - {"type", "role", "content", "id", "status"} - _null_echoes(item, "message"))
    if extra:
        raise invalid(param, f"{param} has fields this server does not support: {', '.join(extra)}.")
    role = item.get("role")
    if role not in _ROLES:
        raise invalid(f"{param}.role", f"{param}.role must be one of {', '.join(_ROLES)}, got {role!r}.")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": check.text(content, f"{param}.content")}
    if not isinstance(content, list):
        raise invalid(f"{param}.content", f"{param}.content must be a string or a list of text parts.")
    texts = []
    for j, part in enumerate(content):
        where = f"{param}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text") or not isinstance(part.get("text"), str):
            raise invalid(where, f"{where} must be a text part ({{'type': 'input_text', 'text': ...}}); got {kind!r}.")
        extra = sorted(set(part) - {"type", "text"} - ({"annotations", "logprobs"} if kind == "output_text" else set()))
        if extra:
            raise invalid(where, f"{where} has fields this server does not support: {', '.join(extra)}.")
        texts.append(check.text(part["text"], f"{where}.text"))
    return {"role": role, "content": "".join(texts)}


def _tool_item(item: dict, kind: str, param: str, calls: set[str]) -> dict:
    """A function call of an earlier answer (an assistant turn) or its output (a tool message), as chat messages."""
    wanted = {"call_id", "name", "arguments"} if kind == "function_call" else {"call_id", "output"}
    extra = sorted(set(item) - wanted - {"type", "id", "status"} - _null_echoes(item, kind))
    missing = sorted(k for k in wanted if not isinstance(item.get(k), str))
    if extra or missing:
        raise invalid(
            param,
            f"{param} ({kind}) takes string {', '.join(sorted(wanted))}" + (f", not {extra}" if extra else "") + ".",
        )
    if kind == "function_call_output":
        if item["call_id"] not in calls:
            raise invalid(f"{param}.call_id", f"{param}.call_id must name the call_id of an earlier function_call.")
        return {"role": "tool", "tool_call_id": item["call_id"], "content": check.text(item["output"], param)}
    arguments = check.json_object_text(item["arguments"], f"{param}.arguments", f"{param}.arguments")
    calls.add(item["call_id"])
    call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": arguments}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def _null_echoes(item: dict, kind: str) -> set[str]:
    """The fields of `item` that an answer's item of this kind has and that are null here."""
    return {name for name in _ECHOED.get(kind, ()) if name in item and item[name] is None}


def _text_config(text) -> dict:
    """`text` as the Response repeats it: its `format` (checked by `schema_format`) and `verbosity`."""
    if text is None:
        return {"format": {"type": "text"}}
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise invalid(
            "text", 'text must be an object with "format" ({"type": "text" | "json_object" | "json_schema"}).'
        )
    check.verbosity(text.get("verbosity"), "text.verbosity")
    return {**text, "format": text.get("format") or {"type": "text"}}


def _metadata(metadata) -> dict:
    if metadata is None:
        return {}
    ok = isinstance(metadata, dict) and len(metadata) <= MAX_METADATA_KEYS
    ok = ok and all(isinstance(k, str) and len(k) <= MAX_METADATA_KEY_CHARS for k in metadata)
    if not ok or not all(isinstance(v, str) and len(v) <= MAX_METADATA_VALUE_CHARS for v in metadata.values()):
        raise invalid(
            "metadata",
            f"metadata must be an object of at most {MAX_METADATA_KEYS} string values (keys up to "
            f"{MAX_METADATA_KEY_CHARS} characters, values up to {MAX_METADATA_VALUE_CHARS}).",
        )
    return metadata
