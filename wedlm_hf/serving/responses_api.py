"""`POST /v1/responses`, OpenAI's Responses API, served statelessly on the chat route's path.

A Responses body is translated into a chat-completions body and parsed by `parse_chat`, so every bound of the chat
route (context, window, rows, schema size) applies unchanged and the answer is the chat route's for the same
conversation; only the rendering differs: one `Response` object, or its stream of typed events. Errors the chat
parser or the engine raise name chat fields (`max_tokens`, `response_format`, `messages[2]`); `responses_error`
renames them to the field this client sent.

The server keeps nothing between requests, so what needs stored state (`store: true`, `previous_response_id`,
`conversation`) is refused with a 400 naming it, as are fields it does not know. Function tools are the chat
route's (`tool_calls`): calls come back as `function_call` output items, and go back in as input items.
"""

import json
import re
import time
import uuid
from dataclasses import dataclass, field, fields

from .openai_schema import WEDLM_FIELDS, APIError, ParsedRequest, invalid, parse_chat

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
_PASSED = {"model", "temperature", "top_p", "stream", "user", "cache_salt"}  # the chat route checks these as they are
_FIELDS = {"input", "instructions", "max_output_tokens", "text", "metadata", "tools", "tool_choice"}
_FIELDS |= {"parallel_tool_calls"} | _PASSED | set(_OFF_VALUES)
_CHAT_NAMES = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens"}
_CHAT_NAMES |= {"response_format": "text.format", "messages": "input"}
_CHAT_WORDS = re.compile(r"\b(max_completion_tokens|max_tokens|response_format)\b")
_MESSAGE_INDEX = re.compile(r"messages\[(\d+)\]")
_TOOL_PARAM = re.compile(r"^(tools\[\d+\])\.function")
MAX_METADATA_KEYS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512  # OpenAI's bounds


class ResponsesError(APIError):
    """An error that already names this route's fields (`responses_error` passes it on unchanged)."""

    @classmethod
    def of(cls, exc: APIError) -> "ResponsesError":
        return cls(exc.status, exc.message, exc.param, exc.code, exc.kind, exc.headers)


@dataclass
class ResponsesRequest(ParsedRequest):
    """A chat request parsed from a Responses body, plus the fields the `Response` object repeats back."""

    echoed: dict = field(default_factory=dict)


def parse_responses(body, model_id: str, defaults, max_window: int | None = None) -> ResponsesRequest:
    """`POST /v1/responses`: `input` (a string or message items) and `instructions` become chat messages;
    `max_output_tokens` and `text.format` become `max_completion_tokens` and `response_format`."""
    try:
        return _parse(body, model_id, defaults, max_window)
    except ResponsesError:
        raise
    except APIError as exc:  # this module's own checks: they name this route's fields already
        raise ResponsesError.of(exc) from None


def _parse(body, model_id: str, defaults, max_window: int | None) -> ResponsesRequest:
    if not isinstance(body, dict):
        raise invalid(None, "The request body must be a JSON object.", code="invalid_json")
    _known_fields(body)
    messages, sources = _conversation(body)
    chat = {name: body[name] for name in body if name in _PASSED or name.startswith("wedlm_")}
    chat["messages"] = messages
    max_output = body.get("max_output_tokens")
    if max_output is not None and (not isinstance(max_output, int) or isinstance(max_output, bool) or max_output < 1):
        raise invalid("max_output_tokens", f"max_output_tokens must be an integer >= 1, got {max_output!r}.")
    chat["max_completion_tokens"] = max_output
    chat |= _tools(body)
    text, chat["response_format"] = _text_config(body.get("text"))
    try:
        parsed = parse_chat(chat, model_id, defaults, max_window)
    except APIError as exc:
        raise responses_error(exc, sources) from None
    echoed = {
        "instructions": body.get("instructions"),
        "max_output_tokens": max_output,
        "metadata": _metadata(body.get("metadata")),
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "temperature": parsed.temperature,
        "text": text,
        "tool_choice": body.get("tool_choice") or ("auto" if body.get("tools") else "none"),
        "tools": body.get("tools") or [],
        "top_p": parsed.top_p,
        "user": body.get("user"),
    }
    return ResponsesRequest(**{f.name: getattr(parsed, f.name) for f in fields(ParsedRequest)}, echoed=echoed)


def responses_error(exc: APIError, sources: list[str] | None = None) -> ResponsesError:
    """`exc` (raised by the chat parser, the engine or the decoding loop) with the chat fields it names renamed to
    this route's; `sources[k]`: the field messages[k] came from."""
    if isinstance(exc, ResponsesError):
        return exc

    def rename(text: str) -> str:
        if sources:
            text = _MESSAGE_INDEX.sub(lambda m: sources[int(m[1])] if int(m[1]) < len(sources) else m[0], text)
        return _CHAT_WORDS.sub(lambda m: _CHAT_NAMES[m[1]], text)

    param = exc.param
    if param is not None:
        param = _TOOL_PARAM.sub(r"\1", param)  # the chat route's tools[i].function.x is this route's tools[i].x
        param = _CHAT_NAMES.get(param) or rename(param)
        param = "input" if param.startswith("messages") else param
    return ResponsesError(exc.status, rename(exc.message), param, exc.code, exc.kind, exc.headers)


def _known_fields(body: dict) -> None:
    for name, value in body.items():
        if name.startswith("wedlm_"):
            if name not in WEDLM_FIELDS:
                known = ", ".join(WEDLM_FIELDS)
                raise invalid(name, f"Unknown WeDLM option {name!r}; known: {known}.", "unknown_field")
        elif name not in _FIELDS:
            raise invalid(name, f"Unrecognized request argument supplied: {name}.", "unknown_field")
        elif name in _OFF_VALUES:
            allowed, why = _OFF_VALUES[name]
            if not any(type(value) is type(off) and value == off for off in allowed):
                raise invalid(name, why or f"{name} must be true or false.", "unsupported_parameter")


def _tools(body: dict) -> dict:
    """The Responses API's function tools (`{"type": "function", "name", "parameters", ...}`, flat) and
    `tool_choice` (`{"type": "function", "name"}` for one) as the chat route takes them; the chat route checks the
    rest (`tool_calls`)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    out = {}
    if "parallel_tool_calls" in body:
        out["parallel_tool_calls"] = body["parallel_tool_calls"]
    if tools is not None:
        if not isinstance(tools, list):
            raise invalid("tools", "tools must be a list of function tools.")
        out["tools"] = []
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or tool.get("type") != "function":
                kind = tool.get("type") if isinstance(tool, dict) else tool
                raise invalid(f"tools[{i}]", f"tools[{i}] is a {kind!r} tool; this server calls functions only.")
            function = {k: v for k, v in tool.items() if k != "type"}
            out["tools"].append({"type": "function", "function": function})
    if isinstance(choice, dict):
        if choice.get("type") != "function" or set(choice) != {"type", "name"}:
            raise invalid("tool_choice", 'tool_choice names a function as {"type": "function", "name": NAME}.')
        choice = {"type": "function", "function": {"name": choice["name"]}}
    if choice is not None:
        out["tool_choice"] = choice
    return out


def _conversation(body: dict) -> tuple[list[dict], list[str]]:
    """Chat messages, and for each the request field it came from (for error messages)."""
    messages, sources = [], []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid("instructions", "instructions must be a string (a system message put first).")
        messages.append({"role": "system", "content": instructions})
        sources.append("instructions")
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
        sources.append("input")
    elif isinstance(given, list) and given:
        for i, item in enumerate(given):
            message = _message(item, f"input[{i}]")
            last = messages[-1] if messages else None
            if "tool_calls" in message and last is not None and last["role"] == "assistant":
                last["tool_calls"] = last.get("tool_calls", []) + message["tool_calls"]  # one turn: text, then calls
                continue
            messages.append(message)
            sources.append(f"input[{i}]")
    else:
        raise invalid("input", "input is required: a string or a non-empty list of messages.", "missing_field")
    return messages, sources


def _message(item, param: str) -> dict:
    """One input item: a message with `role` and `content` (a string, or input_text / output_text parts)."""
    if not isinstance(item, dict):
        raise invalid(param, f"{param} must be a message object with role and content.")
    kind = item.get("type", "message")
    if kind in ("function_call", "function_call_output"):
        return _tool_item(item, kind, param)
    if kind != "message":
        raise invalid(
            f"{param}.type",
            f"{param} is an item of type {kind!r}; this server takes messages, function calls and their outputs.",
        )
    extra = sorted(set(item) - {"type", "role", "content", "id", "status"})
    if extra:
        raise invalid(param, f"{param} has fields this server does not support: {', '.join(extra)}.")
    role = item.get("role")
    if role not in _ROLES:
        raise invalid(f"{param}.role", f"{param}.role must be one of {', '.join(_ROLES)}, got {role!r}.")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
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
        texts.append(part["text"])
    return {"role": role, "content": "".join(texts)}


def _tool_item(item: dict, kind: str, param: str) -> dict:
    """A function call of an earlier answer (an assistant turn) or its output (a tool message), as chat messages."""
    wanted = {"call_id", "name", "arguments"} if kind == "function_call" else {"call_id", "output"}
    extra = sorted(set(item) - wanted - {"type", "id", "status"})
    missing = sorted(k for k in wanted if not isinstance(item.get(k), str))
    if extra or missing:
        raise invalid(
            param,
            f"{param} ({kind}) takes string {', '.join(sorted(wanted))}" + (f", not {extra}" if extra else "") + ".",
        )
    if kind == "function_call_output":
        return {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
    call = {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item["arguments"]},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _text_config(text) -> tuple[dict, dict | None]:
    """`text` as the Response repeats it, and the chat route's `response_format` for its `format`."""
    if text is None:
        return {"format": {"type": "text"}}, None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise invalid(
            "text", 'text must be an object with "format" ({"type": "text" | "json_object" | "json_schema"}).'
        )
    if text.get("verbosity") not in (None, "medium"):
        raise invalid("text.verbosity", "text.verbosity is not supported by this server; leave it out.")
    form = text.get("format") or {"type": "text"}
    kind = form.get("type") if isinstance(form, dict) else None
    if kind in ("text", "json_object"):
        if set(form) != {"type"}:
            raise invalid("text.format", f"text.format {{'type': {kind!r}}} takes no other fields.")
        return {"format": form}, None if kind == "text" else {"type": "json_object"}
    if kind != "json_schema":
        raise invalid("text.format", 'text.format.type must be "text", "json_object" or "json_schema".')
    unknown = sorted(set(form) - {"type", "name", "schema", "strict", "description"})
    if unknown or not isinstance(form.get("name"), str) or not isinstance(form.get("schema", {}), dict):
        raise invalid(
            "text.format",
            'text.format {"type": "json_schema"} takes "name" (a string), "schema" (a JSON schema object), and '
            f'optionally "strict" and "description"{f", not {unknown}" if unknown else ""}.',
        )
    if form.get("strict") not in (None, True, False) or not isinstance(form.get("description", ""), str):
        raise invalid("text.format", "text.format.strict must be true or false, and description a string.")
    spec = {key: form[key] for key in ("name", "schema", "strict", "description") if key in form}
    return {"format": form}, {"type": "json_schema", "json_schema": spec}


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


class ResponseRender:
    """One Response's ids and the request fields it repeats: renders the whole object, and its stream's events."""

    def __init__(self, request: ResponsesRequest, model: str):
        self.id = "resp_" + uuid.uuid4().hex
        self.item_id = "msg_" + uuid.uuid4().hex
        self.created_at = int(time.time())
        self.model = model
        self.echoed = request.echoed

    def message(self, text: str | None, status: str) -> dict:
        content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {"type": "message", "id": self.item_id, "status": status, "role": "assistant", "content": content}

    def response(self, status: str, output: list, usage: dict | None = None, error: dict | None = None) -> dict:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": self.model,
            "output": output,
            **self.echoed,
            "store": False,
            "previous_response_id": None,
            "background": False,
            "reasoning": None,
            "service_tier": "default",
            "truncation": "disabled",
            "usage": None if usage is None else _usage(usage),
        }

    def body(self, text: str, reason: str, usage: dict, calls: list | None = None, keep_message=False) -> dict:
        """The whole Response of a finished request: its text as a message (left out when it only called
        functions, unless `keep_message`), then its calls as `function_call` items; cut by length
        (`max_output_tokens`, or the context), it is `incomplete`."""
        status = "completed" if reason in ("stop", "tool_calls") else "incomplete"
        output = [self.message(text, status)] if text or not calls or keep_message else []
        return self.response(status, output + [self.function_call(call) for call in calls or []], usage)

    @staticmethod
    def function_call(call: dict, status: str = "completed") -> dict:
        """A chat `tool_calls` entry as a Responses `function_call` output item."""
        function = call["function"]
        return {
            "type": "function_call",
            "id": "fc_" + call["id"].removeprefix("call_"),
            "call_id": call["id"],
            "name": function["name"],
            "arguments": function["arguments"],
            "status": status,
        }

    def stream(self, tally) -> "ResponseEvents":
        return ResponseEvents(self, tally)


def _usage(usage: dict) -> dict:
    """The chat `usage` in the Responses API's names; WeDLM's extras (`forwards`, ...) kept beside them."""
    extras = {k: v for k, v in usage.items() if not k.startswith(("prompt_tokens", "completion_tokens", "total"))}
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
        **extras,
    }


class ResponseEvents:
    """The server-sent events of a streamed Response, numbered by `sequence_number`, for app.py's `_stream`:
    created, in_progress, the message and its text part added, one `output_text.delta` per commit that adds text
    (with WeDLM's `wedlm: {forward, tokens}`), then the text, part and message done and `response.completed` (or
    `response.incomplete` when cut by length, as the API ends such a stream). A failure is an `error` event, then
    `response.failed`. `usage()`: the request's chat usage once it has finished."""

    def __init__(self, render: ResponseRender, tally):
        self.render, self.tally, self.usage = render, tally, tally.usage
        self.sequence = 0
        self.pieces: list[str] = []
        self.reason = "length"
        self.calls: list[dict] = []

    def _event(self, kind: str, **body) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **body}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def _where(self) -> dict:
        return {"item_id": self.render.item_id, "output_index": 0, "content_index": 0}

    async def opening(self):
        started = self.render.response("in_progress", [])
        yield self._event("response.created", response=started)
        yield self._event("response.in_progress", response=started)
        yield self._event("response.output_item.added", output_index=0, item=self.render.message(None, "in_progress"))
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        yield self._event("response.content_part.added", **self._where(), part=part)

    async def delta(self, event) -> list[str]:
        text = self.tally.shown(event)  # (with tools, the text before a call)
        if not text:
            return []
        self.pieces.append(text)
        wedlm = {"forward": event.forward, "tokens": event.tokens}
        return [self._event("response.output_text.delta", **self._where(), delta=text, logprobs=[], wedlm=wedlm)]

    def finish(self, event) -> list[str]:
        self.reason = event.reason
        if self.tally.tool_text is None:
            return []
        rest, self.calls, self.reason = self.tally.tool_finish(event.choice, event.reason)
        if not rest:
            return []
        self.pieces.append(rest)
        return [self._event("response.output_text.delta", **self._where(), delta=rest, logprobs=[])]

    def failure(self, event) -> list[str]:
        error = responses_error(APIError(event.status, event.message, event.param, event.code))
        code = error.code or ("server_error" if event.status >= 500 else "invalid_request_error")
        output = [self.render.message("".join(self.pieces), "incomplete")] if self.pieces else []
        failed = self.render.response("failed", output, error={"code": code, "message": error.message})
        return [
            self._event("error", code=code, message=error.message, param=error.param),
            self._event("response.failed", response=failed),
        ]

    def closing(self) -> list[str]:
        text = "".join(self.pieces)
        whole = self.render.body(text, self.reason, self.usage(), self.calls, keep_message=True)
        message = whole["output"][0]
        events = [
            self._event("response.output_text.done", **self._where(), text=text, logprobs=[]),
            self._event("response.content_part.done", **self._where(), part=message["content"][0]),
            self._event("response.output_item.done", output_index=0, item=message),
        ]
        for index, item in enumerate(whole["output"][1:], start=1):  # each call whole, as its events announce it
            where = {"item_id": item["id"], "output_index": index}
            events += [
                self._event(
                    "response.output_item.added",
                    output_index=index,
                    item=item | {"arguments": "", "status": "in_progress"},
                ),
                self._event("response.function_call_arguments.delta", **where, delta=item["arguments"]),
                self._event("response.function_call_arguments.done", **where, arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=index, item=item),
            ]
        return events + [self._event(f"response.{whole['status']}", response=whole)]
