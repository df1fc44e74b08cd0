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


@dataclass(frozen=True)
class ToolSpec:
    """A request's tools (OpenAI's `{"type": "function", "function": {...}}` objects), which of them may be called
    ("none", "auto", "required", or one function's name) and whether an answer may hold several calls."""

    tools: tuple
    choice: str
    parallel: bool

    @property
    def active(self) -> bool:
        return self.choice != "none"

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
    names = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise invalid(param, f'{param} must be {{"type": "function", "function": {{"name": ..., ...}}}}.')
        function = tool["function"]
        unknown = set(function) - {"name", "description", "parameters", "strict"}
        if unknown:
            raise invalid(f"{param}.function", f"{param}.function has unknown fields: {', '.join(sorted(unknown))}.")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise invalid(f"{param}.function.name", "a function name is 1 to 64 letters, digits, '_' or '-'.")
        if name in names:
            raise invalid(f"{param}.function.name", f"two tools are named {name!r}.")
        names.append(name)
        if not isinstance(function.get("description", ""), str):
            raise invalid(f"{param}.function.description", "a function's description must be a string.")
        if not isinstance(function.get("parameters", {}), dict):
            raise invalid(f"{param}.function.parameters", "a function's parameters must be a JSON schema object.")
    return ToolSpec(tuple(tools), _choice(choice, names), True if parallel is None else parallel)


def _choice(choice, names: list[str]) -> str:
    if choice is None:
        return "auto"
    if choice in ("none", "auto", "required"):
        return choice
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if isinstance(choice, dict) and choice.get("type") == "function" and named in names:
        return named
    raise invalid(
        "tool_choice",
        'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": NAME}} naming '
        f"one of the tools ({', '.join(names)}).",
    )


def tool_grammar(spec: ToolSpec, form: ToolFormat = TOOL_FORMATS["hermes"]) -> str:
    """The Lark grammar (llguidance's, with `%json` schemas) every answer of the request follows, in `form`."""
    callable_ = [t["function"] for t in spec.tools if spec.choice in ("auto", "required", t["function"]["name"])]
    calls = []
    for function in callable_:
        schema = {
            "type": "object",
            "properties": {"name": {"const": function["name"]}, "arguments": function.get("parameters") or {}},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        calls.append({**schema, "x-guidance": _JSON_STYLE})
    one = calls[0] if len(calls) == 1 else {"anyOf": calls, "x-guidance": _JSON_STYLE}
    tag = json.dumps(form.opening)
    if form.each:
        lines = [
            "calls: call" + (f' ("\\n" {tag} call)*' if spec.parallel else ""),
            f"call: %json {json.dumps(one)} {json.dumps(form.closing)}",
        ]
    else:
        listed = {"type": "array", "items": one, "minItems": 1, "x-guidance": _JSON_STYLE}
        lines = [f"calls: %json {json.dumps(listed | ({} if spec.parallel else {'maxItems': 1}))}"]
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
        except ValueError:
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
            arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False)
            function = {"name": call.get("name"), "arguments": arguments}
            out.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function", "function": function})
        return out


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None
