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
from .request_fields import json_object_text, shallow


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
class ToolShape:
    """How a route writes a function tool and a `tool_choice` naming one: chat nests the function's fields under
    `"function"`, the Responses API puts them beside `"type"`. Errors name the fields in the route's own shape."""

    nested: bool

    def prefix(self, i: int) -> str:
        """Where tool i's name, description, parameters and strict are."""
        return f"tools[{i}].function" if self.nested else f"tools[{i}]"

    def function(self, tool: dict) -> dict | None:
        if self.nested:
            return tool.get("function") if isinstance(tool.get("function"), dict) else None
        return {k: v for k, v in tool.items() if k != "type"}

    def named(self, choice) -> str | None:
        """The function a `tool_choice` object names (None where it is not of this shape)."""
        if not isinstance(choice, dict) or choice.get("type") != "function":
            return None
        if self.nested:
            function = choice.get("function")
            ok = set(choice) == {"type", "function"} and isinstance(function, dict) and set(function) == {"name"}
            return function["name"] if ok else None
        return choice["name"] if set(choice) == {"type", "name"} else None

    @property
    def choice_example(self) -> str:
        return (
            '{"type": "function", "function": {"name": NAME}}' if self.nested else '{"type": "function", "name": NAME}'
        )


CHAT_TOOLS, RESPONSES_TOOLS = ToolShape(nested=True), ToolShape(nested=False)


@dataclass(frozen=True)
class ToolSpec:
    """A request's tools (as chat templates take them: OpenAI's `{"type": "function", "function": {...}}` objects,
    `description` and `parameters` normalised), which may be called (`choice`: "none", "auto", "required", or
    "named" for the function `name`) and whether an answer may hold several calls (a named choice: one call)."""

    tools: tuple
    choice: str
    parallel: bool
    name: str | None = None
    shape: ToolShape = CHAT_TOOLS

    @property
    def active(self) -> bool:
        return self.choice != "none"

    @property
    def calls_only(self) -> bool:
        """The whole answer is calls ("required" or a named function): it has no text of its own."""
        return self.choice in ("required", "named")

    def callable(self) -> list[dict]:
        """The functions the answer may call."""
        functions = [tool["function"] for tool in self.tools]
        return [f for f in functions if self.choice != "named" or f["name"] == self.name]

    def template_tools(self) -> list[dict]:
        """The tools as chat templates take them (transformers passes OpenAI's objects through)."""
        return [dict(tool) for tool in self.tools]

    def parameters_param(self, i: int) -> str:
        return f"{self.shape.prefix(i)}.parameters"


def template_tool_format(tokenizer) -> ToolFormat | None:
    """The format a chat template teaches its model to call tools in: which known tag the template writes when it
    renders an earlier call (None where it renders no call, or none of these tags: then nothing can be checked)."""
    tool = {"type": "function", "function": {"name": "probe", "parameters": EMPTY_PARAMETERS}}
    call = {"type": "function", "id": "call_probe", "function": {"name": "probe", "arguments": {}}}
    history = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_probe", "content": "y"},
    ]
    try:
        text = tokenizer.apply_chat_template(history, tools=[tool], tokenize=False)
    except Exception:  # a template that takes no tools or calls (or no template): nothing to read
        return None
    found = [form for form in TOOL_FORMATS.values() if form.tag in text]
    return found[0] if len(found) == 1 else None


def parse_tools(body: dict, shape: ToolShape = CHAT_TOOLS) -> ToolSpec | None:
    """`tools`, `tool_choice` and `parallel_tool_calls` of a body, checked; None without tools."""
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
    checked = [_tool(tool, i, shape) for i, tool in enumerate(tools)]
    names = [tool["function"]["name"] for tool in checked]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise invalid(f"{shape.prefix(i)}.name", f"two tools are named {name!r}.")
    kind, name = _choice(choice, names, shape)
    parallel = kind != "named" and parallel is not False  # a named function is called once, as OpenAI does
    return ToolSpec(tuple(checked), kind, parallel, name, shape)


def _tool(tool, i: int, shape: ToolShape) -> dict:
    """One tool, checked; a null description or parameters is left out, and omitted parameters mean none."""
    param = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else tool
        raise invalid(param, f"{param} is a {kind!r} tool; this server calls functions only.")
    given, prefix = shape.function(tool), shape.prefix(i)
    if given is None:
        raise invalid(param, f'{param} must be {{"type": "function", "function": {{"name": ..., ...}}}}.')
    function = {k: v for k, v in given.items() if v is not None}
    unknown = set(function) - {"name", "description", "parameters", "strict"}
    if unknown:
        where = prefix if shape.nested else param
        raise invalid(where, f"{where} has unknown fields: {', '.join(sorted(unknown))}.")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise invalid(f"{prefix}.name", "a function name is 1 to 64 letters, digits, '_' or '-'.")
    if not isinstance(function.get("description", ""), str):
        raise invalid(f"{prefix}.description", "a function's description must be a string.")
    if not isinstance(function.get("strict", False), bool):
        raise invalid(f"{prefix}.strict", f"{prefix}.strict must be true or false.")
    parameters = function.get("parameters", EMPTY_PARAMETERS)
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise invalid(f"{prefix}.parameters", 'a function\'s parameters are a JSON schema of "type": "object".')
    shallow(parameters, f"{prefix}.parameters", f"the parameters of tool {name!r}")
    function["parameters"] = {"type": "object", **parameters}  # arguments are always an object
    return {"type": "function", "function": function}


def _choice(choice, names: list[str], shape: ToolShape) -> tuple[str, str | None]:
    if choice is None:
        return "auto", None
    if choice in ("none", "auto", "required"):
        return choice, None
    named = shape.named(choice)
    if named in names:
        return "named", named
    raise invalid(
        "tool_choice",
        f'tool_choice must be "none", "auto", "required" or {shape.choice_example} naming one of the tools '
        f"({', '.join(names)}).",
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
            return spec.parameters_param(i), f"the parameters of tool {function['name']!r} cannot be used: {error}"
    return None


def tool_grammar(spec: ToolSpec, form: ToolFormat = TOOL_FORMATS["hermes"], answer: dict | None = None) -> str:
    """The Lark grammar (llguidance's) every answer of the request follows, in `form`. Each function's call is
    written out in the grammar, `{"name": NAME, "arguments": ` then its `parameters` as the root of a `%json`
    schema (so `$ref`s and `$defs` in it mean what they say), then `}`. With a response schema (`answer`, from
    `response_format` or `text.format`) an "auto" answer is either that schema's JSON or calls; without one it is
    free text, or free text up to a tag and then calls. "required" and a named function: calls only."""
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
    if spec.choice == "auto" and answer is not None:
        lines += [f"start: answer | {tag} calls", f"answer: %json {json.dumps(answer_schema(answer))}"]
    elif spec.choice == "auto":  # text without a tag, or text up to a tag and then calls
        escaped = re.escape(form.tag).replace("/", "\\/")
        lines += ["start: PLAIN | OPEN calls", f"PLAIN: /(?s:.*)/ & ~/(?s:.*{escaped}.*)/", f"OPEN: PLAIN {tag}"]
    else:
        lines.append(f"start: {tag} calls")
    return "\n".join(lines) + "\n"


def answer_schema(schema: dict) -> dict:
    """A response schema inside the calls' grammar: written as `response_format` alone writes it (json.dumps'
    spacing), the schema's own `x-guidance` options over that."""
    style = schema.get("x-guidance")
    return {**schema, "x-guidance": {**_JSON_STYLE, **style} if isinstance(style, dict) else style or _JSON_STYLE}


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
        arguments = json_object_text(arguments, f"{where}.function.arguments", "a call's arguments")
        entry = {"type": "function", "function": {"name": name, "arguments": arguments}}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        out.append(entry)
    return out


class ToolCallText:
    """One choice's answer split as it streams: `feed(text)` returns the text to show now (held back while it
    may be the start of the calls' tag); `calls()` at the end gives the calls, OpenAI's `tool_calls` entries. An
    answer that is calls only (`calls_only`: "required" or a named function) shows no text, whatever it holds: the
    calls' markup never reaches `content`."""

    def __init__(self, form: ToolFormat = TOOL_FORMATS["hermes"], calls_only: bool = False):
        self.form = form
        self.calls_only = calls_only
        self.text = ""
        self.shown = 0
        self.opened = False

    def feed(self, piece: str) -> str:
        self.text += piece
        if self.opened or self.calls_only:
            return ""
        at = self.text.find(self.form.tag)
        if at >= 0:
            self.opened = True
            out, self.shown = self.text[self.shown : at], at
            return out
        end = len(self.text) - self._held()
        out, self.shown = self.text[self.shown : max(end, self.shown)], max(end, self.shown)
        return out

    def _held(self) -> int:
        """The length of the text's ending that may begin the tag (held back while the answer goes on)."""
        tag = self.form.tag
        return next((k for k in range(min(len(tag), len(self.text)), 0, -1) if tag.startswith(self.text[-k:])), 0)

    def rest(self, cut: bool = False) -> str:
        """The text not shown yet, at the end: a held-back piece that never became a tag; in an answer `cut` by its
        token budget, a piece that may have begun a tag is dropped instead (it was markup, cut short)."""
        if self.opened or self.calls_only:
            return ""
        end = len(self.text) - (self._held() if cut else 0)
        out, self.shown = self.text[self.shown : max(end, self.shown)], len(self.text)
        return out

    def content(self, cut: bool = False) -> str:
        """The text before the calls (all of it without calls; none where the answer is calls only)."""
        if self.calls_only:
            return ""
        if self.opened:
            return self.text[: self.text.find(self.form.tag)]
        return self.text[: len(self.text) - (self._held() if cut else 0)]

    def calls(self) -> list[dict]:
        """The complete calls, in order (a call cut short by the token budget is left out)."""
        at = self.text.find(self.form.tag)
        if at < 0:
            return []
        form, after = self.form, self.text[at:]
        if form.each:
            pattern = re.escape(form.opening) + "(.*?)" + re.escape(form.closing)
            found = [_json(block) for block in re.findall(pattern, after, flags=re.S)]
        else:
            found = _listed(after[len(form.opening) :])
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


def _listed(text: str) -> list:
    """The whole values of a JSON list, up to where it is cut short (or ends)."""
    decoder, found, at = json.JSONDecoder(), [], 1
    if not text.startswith("["):
        return found
    while True:
        at = len(text) - len(text[at:].lstrip())
        try:
            value, at = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):
            return found
        found.append(value)
        at = len(text) - len(text[at:].lstrip())
        if not text.startswith(",", at):
            return found
        at += 1


def _json(text: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None
