"""Function calling on the chat route: `tools`, `tool_choice`, `parallel_tool_calls`, and calls in the history.

The model sees the tools through its chat template (its `tools` argument) and calls one the way the template
teaches it. Two formats are known (`--tool-call-parser`, vLLM's names): `hermes`, Qwen's, which the released WeDLM
checkpoints use, a JSON object per call between tags,

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

and `mistral`, one tag and a JSON list of the calls: `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`.

The calls are checked at commit by a grammar (`tool_grammar`), as `response_format` is: with `tool_choice`
"required" or a named function the whole answer is calls; with "auto" free text may come first, and once the text
opens a call, the calls' JSON is held to the tools' schemas. So a call's `arguments` always parse and match its
function's `parameters`. `ToolCallText` splits an answer into its text and its calls, while it streams.
"""

import json
import re
import uuid
from dataclasses import dataclass

from .api_errors import invalid


@dataclass(frozen=True)
class ToolFormat:
    """How a model writes its calls: `tag` opens them; `each` (hermes) wraps every call in `opening` ... `closing`,
    calls one per line; otherwise (mistral) one JSON list of every call follows the tag."""

    name: str
    tag: str
    opening: str
    closing: str = ""
    each: bool = True


TOOL_FORMATS = {
    "hermes": ToolFormat("hermes", "<tool_call>", "<tool_call>\n", "\n</tool_call>"),
    "mistral": ToolFormat("mistral", "[TOOL_CALLS]", "[TOOL_CALLS]", each=False),
}
MAX_TOOLS = 64
MAX_TOOLS_CHARS = 65_536  # every tool's JSON together: all of them are compiled into the request's grammar
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# JSON as json.dumps writes it, so forced separators fill without the model (as for response_format).
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


EMPTY_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}  # OpenAI's omitted ones


@dataclass(frozen=True)
class ToolSpec:
    """A request's tools (OpenAI's `{"type": "function", "function": {...}}` objects, `description` and
    `parameters` normalised), which may be called (`choice`: "none", "auto", "required", or "named" for the function
    `name`) and whether an answer may hold several calls."""

    tools: tuple
    choice: str
    parallel: bool
    name: str | None = None

    @property
    def active(self) -> bool:
        return self.choice != "none"

    def callable(self) -> list[dict]:
        """The functions the answer may call."""
        functions = [tool["function"] for tool in self.tools]
        return [f for f in functions if self.choice != "named" or f["name"] == self.name]

    def template_tools(self) -> list[dict]:
        """The tools as chat templates take them (transformers passes OpenAI's objects through)."""
        return [dict(tool) for tool in self.tools]


def parse_tools(body: dict) -> ToolSpec | None:
    """`tools`, `tool_choice` and `parallel_tool_calls` of a chat body, checked; None without tools."""
    tools, choice, parallel = body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid("parallel_tool_calls", f"parallel_tool_calls must be true or false, got {parallel!r}.")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise invalid("tool_choice", "tool_choice needs tools: give the functions in tools.")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise invalid("tools", f"tools must be a list of at most {MAX_TOOLS} function tools.")
    if len(json.dumps(tools)) > MAX_TOOLS_CHARS:
        raise invalid("tools", f"tools, as JSON, must be at most {MAX_TOOLS_CHARS} characters.")
    checked = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    names = [tool["function"]["name"] for tool in checked]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise invalid(f"tools[{i}].function.name", f"two tools are named {name!r}.")
    kind, name = _choice(choice, names)
    return ToolSpec(tuple(checked), kind, True if parallel is None else parallel, name)


def _tool(tool, param: str) -> dict:
    """One tool, checked; a null description or parameters is left out, and omitted parameters mean none."""
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise invalid(param, f'{param} must be {{"type": "function", "function": {{"name": ..., ...}}}}.')
    function = {k: v for k, v in tool["function"].items() if v is not None}
    unknown = set(function) - {"name", "description", "parameters", "strict"}
    if unknown:
        raise invalid(f"{param}.function", f"{param}.function has unknown fields: {', '.join(sorted(unknown))}.")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise invalid(f"{param}.function.name", "a function name is 1 to 64 letters, digits, '_' or '-'.")
    if not isinstance(function.get("description", ""), str):
        raise invalid(f"{param}.function.description", "a function's description must be a string.")
    parameters = function.get("parameters") or EMPTY_PARAMETERS
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise invalid(f"{param}.function.parameters", 'a function\'s parameters are a JSON schema of "type": "object".')
    function["parameters"] = {"type": "object", **parameters}  # arguments are always an object
    return {"type": "function", "function": function}


def _choice(choice, names: list[str]) -> tuple[str, str | None]:
    if choice is None:
        return "auto", None
    if choice in ("none", "auto", "required"):
        return choice, None
    function = choice.get("function") if isinstance(choice, dict) else None
    named = function.get("name") if isinstance(function, dict) else None
    if isinstance(choice, dict) and choice.get("type") == "function" and named in names:
        return "named", named
    raise invalid(
        "tool_choice",
        'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": NAME}} naming '
        f"one of the tools ({', '.join(names)}).",
    )


def call_arguments_schema(function: dict) -> dict:
    """The schema a call's `arguments` follow in the calls' grammar: the function's parameters, written compactly."""
    return {**function["parameters"], "x-guidance": _JSON_STYLE}


def tool_at_fault(spec: ToolSpec, check) -> tuple[str, str] | None:
    """Where the calls' grammar cannot be compiled: the first callable tool whose arguments' schema `check` (a JSON
    schema -> raises ValueError) refuses, as (its field, the words); None where each compiles alone."""
    callable_names = {function["name"] for function in spec.callable()}
    for i, tool in enumerate(spec.tools):
        function = tool["function"]
        if function["name"] not in callable_names:
            continue
        try:
            check(call_arguments_schema(function))
        except ValueError as error:
            return (
                f"tools[{i}].function.parameters",
                f"the parameters of tool {function['name']!r} cannot be used: {error}",
            )
    return None


def tool_grammar(spec: ToolSpec, form: ToolFormat = TOOL_FORMATS["hermes"]) -> str:
    """The Lark grammar (llguidance's) every answer of the request follows, in `form`. Each function's call is
    written out in the grammar, `{"name": NAME, "arguments": ` then its `parameters` as the root of a `%json`
    schema (so `$ref`s and `$defs` in it mean what they say), then `}`."""
    lines = []
    for k, function in enumerate(spec.callable()):
        head = json.dumps('{"name": ' + json.dumps(function["name"]) + ', "arguments": ')
        schema = call_arguments_schema(function)
        lines.append(f'fn{k}: {head} %json {json.dumps(schema)} "}}"')
    lines.append("one: " + " | ".join(f"fn{k}" for k in range(len(lines))))
    tag = json.dumps(form.opening)
    if form.each:
        lines += [
            "calls: call" + (f' ("\\n" {tag} call)*' if spec.parallel else ""),
            f"call: one {json.dumps(form.closing)}",
        ]
    else:
        lines.append('calls: "[" one' + (' (", " one)*' if spec.parallel else "") + ' "]"')
    if spec.choice == "auto":  # text without a tag, or text up to a tag and then calls
        escaped = re.escape(form.tag).replace("/", "\\/")
        lines += ["start: PLAIN | OPEN calls", f"PLAIN: /(?s:.*)/ & ~/(?s:.*{escaped}.*)/", f"OPEN: PLAIN {tag}"]
    else:
        lines.append(f"start: {tag} calls")
    return "\n".join(lines) + "\n"


def history_calls(calls, param: str) -> list[dict]:
    """An assistant message's `tool_calls` checked, as chat templates take them (arguments as an object)."""
    if not isinstance(calls, list) or not calls or len(calls) > MAX_TOOLS:
        raise invalid(param, f"{param} must be a non-empty list of at most {MAX_TOOLS} calls.")
    out = []
    for i, call in enumerate(calls):
        where = f"{param}[{i}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise invalid(where, f'{where} must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}.')
        name, arguments = function.get("name"), function.get("arguments", "{}")
        if not isinstance(name, str) or not name:
            raise invalid(f"{where}.function.name", "a call names its function.")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except (ValueError, RecursionError):
            raise invalid(f"{where}.function.arguments", "a call's arguments are a JSON object, as text.") from None
        if not isinstance(arguments, dict):
            raise invalid(f"{where}.function.arguments", "a call's arguments are a JSON object, as text.")
        entry = {"type": "function", "function": {"name": name, "arguments": arguments}}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        out.append(entry)
    return out


class ToolCallText:
    """One choice's answer split as it streams: `feed(text)` returns the text to show now (held back while it
    may be the start of the calls' tag); `calls()` at the end gives the calls, OpenAI's `tool_calls` entries."""

    def __init__(self, form: ToolFormat = TOOL_FORMATS["hermes"]):
        self.form = form
        self.text = ""
        self.shown = 0
        self.opened = False

    def feed(self, piece: str) -> str:
        self.text += piece
        if self.opened:
            return ""
        tag = self.form.tag
        at = self.text.find(tag)
        if at >= 0:
            self.opened = True
            out, self.shown = self.text[self.shown : at], at
            return out
        end = len(self.text)  # hold back a suffix that may begin the tag
        for k in range(min(len(tag), len(self.text)), 0, -1):
            if tag.startswith(self.text[-k:]):
                end = len(self.text) - k
                break
        out, self.shown = self.text[self.shown : max(end, self.shown)], max(end, self.shown)
        return out

    def rest(self) -> str:
        """The text not shown yet, at the end (a held-back piece that never became a tag)."""
        if self.opened:
            return ""
        out, self.shown = self.text[self.shown :], len(self.text)
        return out

    def content(self) -> str:
        """The text before the calls (all of it without calls)."""
        return self.text[: self.text.find(self.form.tag)] if self.opened else self.text

    def calls(self) -> list[dict]:
        if not self.opened:
            return []
        form, after = self.form, self.text[self.text.find(self.form.tag) :]
        if form.each:
            pattern = re.escape(form.opening) + "(.*?)" + re.escape(form.closing)
            found = [_json(block) for block in re.findall(pattern, after, flags=re.S)]
        else:
            listed = _json(after[len(form.opening) :])
            found = listed if isinstance(listed, list) else []
        out = []
        for call in found:
            if not isinstance(call, dict):  # (an answer cut by max_tokens ends inside a call)
                continue
            try:  # (a number the grammar allows, such as 1e999, has no JSON spelling once parsed)
                arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False, allow_nan=False)
            except ValueError:
                continue
            function = {"name": call.get("name"), "arguments": arguments}
            out.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function", "function": function})
        return out


def _json(text: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None
