"""Function calling on `/v1/chat/completions` with the official client: tools rendered by the chat template, calls
held to the tools' schemas at commit, parsed into `tool_calls`, streamed as `delta.tool_calls`, and calls and tool
results in the history. The shipped model's chat template renders tools and calls as Qwen's templates do."""

import json
import uuid

import httpx
import jsonschema
import openai
import pytest
from conftest import WEATHER
from live_server import MODEL_ID, LiveServer, shipped

from wedlm_hf.cli import build_parser
from wedlm_hf.serving.engine import ServingEngine
from wedlm_hf.serving.tool_calls import TOOL_FORMATS, ToolCallText, parse_tools, tool_grammar
from wedlm_hf.structured import compile_grammar

ADD = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99},
        "b": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "the forecast", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "parameters": ADD}},
]
BROKEN = {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}  # no grammar library takes it
BROKEN_TOOL = {"type": "function", "function": {"name": "f", "parameters": BROKEN}}
STYLED = {"type": "object", "x-guidance": {"bogus": 1}}  # refused alone, replaced in the calls' grammar
MESSAGES = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
DEEP = {"name": "add", "arguments": "[" * 100_000}  # nesting json.loads cannot follow
DEEP_CALL = {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": DEEP}]}
PARAMETERS = "tools[0].function.parameters"
NAMED = {"type": "function", "function": {"name": "get_weather"}}
DIGIT = {  # a response schema the shipped model can close
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["n"],
    "additionalProperties": False,
}
NO_OPENING = {"29": -100}  # logit_bias: "<", the first token of "<tool_call>" (the shipped model prefers a call)


def nested(depth: int) -> dict:
    """An object schema (or JSON value) nested `depth` levels deep."""
    value: dict = {"type": "object"}
    for _ in range(depth - 1):
        value = {"type": "object", "properties": {"x": value}}
    return value


def call_message(arguments: str) -> dict:
    call = {"id": "c", "type": "function", "function": {"name": "add", "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


@pytest.fixture(scope="module")
def client():
    with LiveServer() as live:
        yield live.client()


def schema_of(name: str) -> dict:
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}], ids=["required", "named"]
)
def test_a_required_call_has_arguments_that_match_the_schema(client, choice):
    answer = client.chat.completions.create(
        model=MODEL_ID, messages=MESSAGES, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False, max_tokens=48
    )
    result = answer.choices[0]
    assert result.finish_reason == "tool_calls" and result.message.content is None
    (call,) = result.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    if isinstance(choice, dict):
        assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), schema_of(call.function.name))


def test_a_streamed_call_arrives_in_delta_tool_calls(client):
    stream = client.chat.completions.create(
        model=MODEL_ID,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        max_tokens=48,
        stream=True,
    )
    chunks = list(stream)
    texts = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    calls = [call for c in chunks for call in (c.choices[0].delta.tool_calls or [])]
    assert texts == [] and len(calls) == 1 and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert calls[0].index == 0 and calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)


def test_tool_choice_none_and_auto_answer_text(client):
    plain = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=12, temperature=0)
    none = client.chat.completions.create(
        model=MODEL_ID, messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=12, temperature=0
    )
    assert none.choices[0].message.content == plain.choices[0].message.content  # the tools are not shown
    auto = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, tools=TOOLS, max_tokens=12)
    message = auto.choices[0].message  # the shipped model never opens a call: its text, without the tag
    assert message.tool_calls is None and "<tool_call>" not in (message.content or "")


def test_calls_and_results_in_the_history_reach_the_template(client):
    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    answer = client.chat.completions.create(model=MODEL_ID, messages=history, tools=TOOLS, max_tokens=4)
    assert answer.usage.prompt_tokens > 0
    _, tokenizer = shipped()
    text = tokenizer.apply_chat_template(
        [history[0], {**history[1], "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}]}, history[2]],
        tools=TOOLS, add_generation_prompt=True, tokenize=False,
    )  # fmt: skip
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>' in text
    assert answer.usage.prompt_tokens == len(tokenizer(text, add_special_tokens=False).input_ids)


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS * 33}, "tools"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": "get_weather"}}, "tool_choice"),
        ({"tools": TOOLS, "stop": ["\n"]}, "stop"),  # could end the answer inside a call
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
            "tools[0].function.parameters",
        ),
        (  # a schema the grammar library refuses: the tool is named, not the whole list
            {"tools": [*TOOLS, BROKEN_TOOL]},
            "tools[2].function.parameters",
        ),
        (  # a tool's own "x-guidance" is the grammar's in the check too, as in the calls' grammar
            {"tools": [{"type": "function", "function": {"name": "g", "parameters": STYLED}}, BROKEN_TOOL]},
            "tools[1].function.parameters",
        ),
        (
            {"tools": TOOLS, "messages": [*MESSAGES, {"role": "tool", "tool_call_id": "nope", "content": "x"}]},
            "messages[1].tool_call_id",
        ),
        ({"messages": [*MESSAGES, DEEP_CALL]}, "messages[1].tool_calls[0].function.arguments"),  # 400, not 500
        *[  # parameters that are no schema at all were taken as "no parameters"
            ({"tools": [{"type": "function", "function": {"name": "f", "parameters": bad}}]}, PARAMETERS)
            for bad in ([], "", False, 0)
        ],
        ({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}, "tools[0].function.strict"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": nested(70)}}]}, PARAMETERS),
        *[  # json.loads takes NaN and Infinity, which JSON has no spelling for
            ({"messages": [*MESSAGES, call_message(arguments)]}, "messages[1].tool_calls[0].function.arguments")
            for arguments in ('{"a": NaN}', '{"a": Infinity}', '{"a": -Infinity}', json.dumps(nested(70)))
        ],
        ({"messages": [*MESSAGES, {"role": "assistant", "content": "x", "refusal": "no"}]}, "messages[1].refusal"),
    ],
)
def test_bad_tools_are_refused_by_name(client, fields, param):
    fields = {"messages": MESSAGES, **fields}
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL_ID, max_tokens=2, **fields)
    assert error.value.body["param"] == param


def test_auto_holds_an_opened_call_to_the_schemas():
    """With tool_choice auto, text runs free until it opens a call; from there the JSON is the tools' own."""
    _, tokenizer = shipped()
    grammar = compile_grammar(("lark", tool_grammar(parse_tools({"tools": TOOLS}))), tokenizer, len(tokenizer))

    def accepted(text: str) -> tuple[int, int]:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        return grammar.matcher().accepted(ids), len(ids)

    for free in ("Just text.", "a < b and <tool> tags"):
        assert accepted(free)[0] == accepted(free)[1]
    good = 'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    assert accepted(good)[0] == accepted(good)[1]
    bad = 'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}'
    assert accepted(bad)[0] < accepted(bad)[1]


def test_tool_call_text_splits_as_it_streams():
    split = ToolCallText()
    pieces = ["Sure", ", <", "tool", "_call>\n", '{"name": "add", "arguments": {}}', "\n</tool_call>"]
    shown = [split.feed(piece) for piece in pieces]
    assert shown == ["Sure", ", ", "", "", "", ""] and split.content() == "Sure, "
    (call,) = split.calls()
    assert call["function"] == {"name": "add", "arguments": "{}"}
    held = ToolCallText()
    assert held.feed("a <tool") == "a " and held.rest() == "<tool" and held.calls() == []


MISTRAL_TEMPLATE = (  # a chat template that shows tools and writes calls as Mistral's do
    "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS]["
    "{% for c in m.tool_calls %}{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
    "{% if not loop.last %}, {% endif %}{% endfor %}]{% else %}[{{ m.role }}]{{ m.content }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


def test_the_mistral_format_is_another_server_option():
    """`--tool-call-parser mistral`, on a checkpoint whose template writes calls as [TOOL_CALLS] and a JSON list:
    calls held and parsed the same way."""
    import copy

    from live_server import engine

    model, shipped_tokenizer = shipped()
    tokenizer = copy.deepcopy(shipped_tokenizer)
    tokenizer.chat_template = MISTRAL_TEMPLATE
    with LiveServer(ServingEngine(model, tokenizer, MODEL_ID, tool_call_parser="mistral")) as live:
        client = live.client()
        answer = client.chat.completions.create(
            model=MODEL_ID, messages=MESSAGES, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
            max_tokens=64,
        )  # fmt: skip
        calls = answer.choices[0].message.tool_calls
        assert answer.choices[0].finish_reason == "tool_calls" and len(calls) == 1
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), schema_of(call.function.name))
    _, tokenizer = shipped()
    spec = parse_tools({"tools": TOOLS})
    grammar = compile_grammar(("lark", tool_grammar(spec, TOOL_FORMATS["mistral"])), tokenizer, len(tokenizer))
    good = 'Sure.[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]'
    bad = 'Sure.[TOOL_CALLS][{"name": "add", "arguments": {"a": "one"'
    for text, whole in ((good, True), (bad, False), ("no call [TOOL here", True)):
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert (grammar.matcher().accepted(ids) == len(ids)) == whole, text
    split = ToolCallText(TOOL_FORMATS["mistral"])
    assert split.feed(good[:8]) == "Sure." and split.feed(good[8:]) == "" and split.content() == "Sure."
    assert [c["function"]["name"] for c in split.calls()] == ["add"]
    with pytest.raises(ValueError, match="--tool-call-parser 'xml'"):
        engine(tool_call_parser="xml")
    assert set(build_parser().parse_args(["serve", "--tool-call-parser", "mistral"]).__dict__) >= {"tool_call_parser"}
    assert {a.dest: a.choices for a in build_parser()._subparsers._group_actions[0].choices["serve"]._actions}[
        "tool_call_parser"
    ] == tuple(TOOL_FORMATS)


def test_schemas_keep_their_meaning_inside_a_call():
    """A function's parameters are the root of their own schema: `$defs` and `$ref`s resolve as written, a
    recursive `$ref` means the parameters (not the call around them), and no parameters mean `{}`."""
    _, tokenizer = shipped()
    tree = {
        "type": "object",
        "properties": {"v": {"type": "integer"}, "child": {"$ref": "#"}, "at": {"$ref": "#/$defs/Loc"}},
        "required": ["v"],
        "additionalProperties": False,
        "$defs": {"Loc": {"type": "object", "properties": {"c": {"type": "string"}}, "required": ["c"]}},
    }
    tools = [
        {"type": "function", "function": {"name": "tree", "parameters": tree}},
        {"type": "function", "function": {"name": "ping", "parameters": None, "description": None}},
    ]
    grammar = compile_grammar(
        ("lark", tool_grammar(parse_tools({"tools": tools, "tool_choice": "required"}))), tokenizer, len(tokenizer)
    )

    def whole(arguments: str, name: str = "tree") -> bool:
        text = f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'
        ids = tokenizer(text, add_special_tokens=False).input_ids
        return grammar.matcher().accepted(ids) == len(ids)

    assert whole('{"v": 1, "child": {"v": 2}, "at": {"c": "x"}}')
    assert not whole('{"v": 1, "child": {"name": "tree", "arguments": {}}}')  # # is the parameters, not the call
    assert not whole('{"v": 1, "at": {"d": 1}}')
    assert whole("{}", "ping") and not whole('"hello"', "ping") and not whole('{"x": 1}', "ping")


def test_parallel_calls_split_into_several():
    split = ToolCallText()
    one = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert split.feed(one + "\n" + one.replace("1", "5")) == ""
    assert [json.loads(c["function"]["arguments"])["a"] for c in split.calls()] == [1, 5]
    cut = ToolCallText()
    cut.feed(one + '\n<tool_call>\n{"name": "add", "argu')  # cut by max_tokens inside the second call
    assert len(cut.calls()) == 1


def test_a_lone_surrogate_in_a_tool_is_a_400(client):
    """JSON escapes can carry a lone surrogate (the official client cannot send one): refused, not a 500."""
    tool = '{"type": "function", "function": {"name": "f", "description": "x\\ud800"}}'
    head = json.dumps({"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]})
    raw = head[:-1] + ', "tools": [' + tool + "]}"
    answer = httpx.post(f"{client.base_url}chat/completions", content=raw, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "tools"


def test_naming_the_tool_at_fault_keeps_no_compile_in_the_cache(client):
    """Each tool is compiled alone to find the one at fault: those compiles must not displace the grammars that other
    requests use from the compile cache (a request of 64 tools would otherwise push out 64 of them)."""
    from wedlm_hf.structured import grammars

    marker = f"m{uuid.uuid4().hex}"
    tools = [
        {
            "type": "function",
            "function": {"name": "add", "description": marker, "parameters": {**ADD, "title": marker}},
        },
        {"type": "function", "function": {"name": "f", "parameters": {**BROKEN, "title": marker}}},
    ]
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=2, tools=tools)
    assert error.value.body["param"] == "tools[1].function.parameters"
    kept = [key for key in grammars._compiled if marker in key[3]]
    assert len(kept) == 1 and kept[0][2] == "lark"  # the request's own grammar, as before the search


def test_tools_beside_a_response_schema_make_one_grammar():
    """With both (as agent frameworks send them): under auto the answer is the schema's JSON or calls; required and
    a named function, calls only; the free text that auto allows without a schema is not the answer here."""
    _, tokenizer = shipped()

    def grammar(choice: str):
        spec = parse_tools({"tools": TOOLS, "tool_choice": choice})
        return compile_grammar(("lark", tool_grammar(spec, answer=DIGIT)), tokenizer, len(tokenizer))

    def whole(choice: str, text: str) -> bool:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        return grammar(choice).matcher().accepted(ids) == len(ids)

    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert whole("auto", '{"n": 3}') and whole("auto", call)
    assert not whole("auto", "Just text.") and not whole("auto", '{"n": 12}') and not whole("auto", "Sure." + call)
    assert whole("required", call) and not whole("required", '{"n": 3}')


def test_a_response_format_beside_tools_is_answered_on_the_chat_route(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "digit", "schema": DIGIT, "strict": True}}
    both = dict(model=MODEL_ID, messages=MESSAGES, tools=TOOLS, response_format=fmt, max_tokens=48)
    auto = client.chat.completions.create(**both, logit_bias=NO_OPENING)
    assert auto.choices[0].finish_reason == "stop" and auto.choices[0].message.tool_calls is None
    jsonschema.validate(json.loads(auto.choices[0].message.content), DIGIT)
    none = client.chat.completions.create(**both, tool_choice="none")
    jsonschema.validate(json.loads(none.choices[0].message.content), DIGIT)
    called = client.chat.completions.create(**both, tool_choice="required").choices[0]
    assert called.finish_reason == "tool_calls" and called.message.content is None
    for call in called.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), schema_of(call.function.name))


def test_a_named_function_is_called_once_and_a_cut_call_never_hides_a_complete_one(client):
    """Without parallel_tool_calls: a named function means one call (the answer ends after it); under required,
    calls may follow, and where the budget cuts one, the complete calls before it are the answer (tool_calls)."""
    named = client.chat.completions.create(
        model=MODEL_ID, messages=MESSAGES, tools=TOOLS, tool_choice=NAMED, max_tokens=120
    )
    assert named.choices[0].finish_reason == "tool_calls" and len(named.choices[0].message.tool_calls) == 1
    assert named.usage.completion_tokens < 120  # it ended, rather than opening a second call
    required = client.chat.completions.create(
        model=MODEL_ID, messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=48
    )
    assert required.usage.completion_tokens == 48  # the budget cut it (the shipped model opens a second call)
    assert required.choices[0].finish_reason == "tool_calls" and required.choices[0].message.content is None
    for call in required.choices[0].message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), schema_of(call.function.name))
    split = ToolCallText()
    split.feed('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n<tool_call>\n{"na')
    assert [c["function"]["name"] for c in split.calls()] == ["add"]
    listed = ToolCallText(TOOL_FORMATS["mistral"])  # one list of calls, cut inside its second
    listed.feed('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"name": "add", "argu')
    assert [json.loads(c["function"]["arguments"]) for c in listed.calls()] == [{"a": 1}]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_markup_of_a_call_cut_short_never_reaches_content(client, stream):
    """`required` with a budget too small for the tag: no text (the answer is calls), and no calls."""
    answer = client.chat.completions.create(
        model=MODEL_ID, messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=3, stream=stream
    )
    if stream:
        chunks = list(answer)
        texts = "".join(c.choices[0].delta.content or "" for c in chunks)
        calls = [call for c in chunks for call in (c.choices[0].delta.tool_calls or [])]
        reason = chunks[-1].choices[0].finish_reason
    else:
        texts, calls, reason = answer.choices[0].message.content or "", answer.choices[0].message.tool_calls, None
        reason = answer.choices[0].finish_reason
    assert texts == "" and not calls and reason == "length"
    held = ToolCallText()  # under auto, a tag begun as the budget ran out is dropped at the end
    assert held.feed("Sure <tool") == "Sure " and held.rest(cut=True) == "" and held.content(cut=True) == "Sure "
    assert ToolCallText().content() == "" and ToolCallText(calls_only=True).feed("a <b") == ""


def test_a_history_built_from_model_dump_is_taken(client):
    """Clients append `message.model_dump()`: its null refusal, annotations, audio and function_call come back."""
    called = client.chat.completions.create(
        model=MODEL_ID, messages=MESSAGES, tools=TOOLS, tool_choice=NAMED, max_tokens=64
    )
    message = called.choices[0].message.model_dump()
    assert {"refusal", "annotations", "audio", "function_call"} <= set(message)  # as the client hands them back
    result = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "sunny"}
    history = [*MESSAGES, message, result]
    answer = client.chat.completions.create(model=MODEL_ID, messages=history, tools=TOOLS, max_tokens=8)
    text = answer.choices[0].message.model_dump() | {"annotations": [], "refusal": ""}
    follow = [*history, text, {"role": "user", "content": "and Rome?"}]
    again = client.chat.completions.create(
        model=MODEL_ID, messages=follow, tools=TOOLS, max_tokens=4, prompt_cache_key="conv-1",
        safety_identifier="u1", verbosity="low",
    )  # fmt: skip
    assert again.usage.prompt_tokens > answer.usage.prompt_tokens


def test_deep_parameters_name_the_tool_and_the_limit(client):
    tools = [*TOOLS, {"type": "function", "function": {"name": "deep", "parameters": nested(70)}}]
    with pytest.raises(openai.BadRequestError, match="parameters of tool 'deep' nests .* at most 64") as error:
        client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, tools=tools, max_tokens=2)
    assert error.value.body["param"] == "tools[2].function.parameters"


def test_the_parser_must_match_the_chat_templates_calls():
    """`--tool-call-parser mistral` on a checkpoint whose template writes <tool_call> is refused at start-up."""
    from live_server import engine

    with pytest.raises(ValueError, match="writes tool calls with <tool_call> .*--tool-call-parser hermes"):
        engine(tool_call_parser="mistral")
