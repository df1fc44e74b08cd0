"""The server driven by the agent frameworks people build with, unchanged: openai-agents (its Responses and Chat
Completions models), pydantic-ai, instructor and langchain-openai. Each sends what it sends to OpenAI (tools beside
a response schema, histories of earlier answers, a named call), and the run must end with the typed answer.

The shipped model is 5.8M parameters: asked under `tool_choice: "auto"` after a tool's result, it calls the tool
again rather than answer. So that the protocol is what these tests test, the client's transport (`Steered`) sends
requests whose conversation ends with a tool's result with `tool_choice: "none"`, as a capable model would choose
itself; everything else reaches the server as the framework wrote it. instructor pins an older openai client than
the others, so it runs in an environment of its own (`build/agent-envs/`, made on first use with pip).
"""

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from enum import Enum
from pathlib import Path

import httpx
import pytest
from live_server import MODEL_ID, LiveServer
from pydantic import BaseModel, ConfigDict

INSTRUCTOR = "instructor==1.17.0"
ENVS = Path(__file__).resolve().parents[2] / "build" / "agent-envs"


class City(str, Enum):
    paris = "Paris"
    rome = "Rome"


class Forecast(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a closed object, which the shipped model can finish

    city: City
    sunny: bool


def get_weather(city: City) -> str:
    """The forecast for a city."""
    CALLED.append(City(city))
    return f"sunny in {City(city).value}"


CALLED: list[City] = []


@pytest.fixture(scope="module")
def server():
    with LiveServer() as live:
        yield live


@pytest.fixture(autouse=True)
def fresh_calls():
    CALLED.clear()


def after_a_result(body: dict) -> bool:
    """The conversation ends with a tool's result (chat's `tool` message, the Responses API's output item)."""
    last = (body.get("messages") or body.get("input") or [None])[-1]
    return isinstance(last, dict) and (last.get("role") == "tool" or last.get("type") == "function_call_output")


def steer(request: httpx.Request) -> httpx.Request:
    """The request, with `tool_choice: "none"` once a tool has answered (see the module docstring)."""
    body = json.loads(request.content or b"{}")
    if not after_a_result(body) or "tools" not in body:
        return request
    body["tool_choice"] = "none"
    headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
    return httpx.Request(request.method, request.url, headers=headers, json=body)


class Steered(httpx.AsyncBaseTransport):
    def __init__(self):
        self.inner, self.bodies = httpx.AsyncHTTPTransport(), []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request = steer(request)
        self.bodies.append(json.loads(request.content or b"{}"))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:  # the client's `close` ends here: the connections are the inner transport's
        await self.inner.aclose()


def async_openai(server, transport):
    from openai import AsyncOpenAI

    client = httpx.AsyncClient(transport=transport, timeout=120)
    return AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, http_client=client)


def run_then_close(client, run):
    """`run` (a coroutine using `client`) to its end in a new event loop, the client's connections closed in it."""

    async def both():
        try:
            return await run
        finally:
            await client.close()

    return asyncio.run(both())


@pytest.mark.parametrize("route", ["responses", "chat"])
def test_openai_agents_runs_a_tool_and_returns_its_output_type(server, route):
    """`Agent(tools=[...], output_type=...)` sends tools beside the output's schema on every turn; the first turn
    must call (`tool_choice="required"`, reset to auto after it), the second answers with the schema's JSON."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    transport = Steered()
    client = async_openai(server, transport)
    kind = OpenAIResponsesModel if route == "responses" else OpenAIChatCompletionsModel
    agent = Agent(
        name="weather",
        instructions="Answer with the forecast.",
        tools=[function_tool(get_weather)],
        output_type=Forecast,
        model=kind(MODEL_ID, client),
        model_settings=ModelSettings(tool_choice="required", max_tokens=64),
    )
    result = run_then_close(client, Runner.run(agent, "Weather in Paris?", max_turns=3))
    assert isinstance(result.final_output, Forecast) and CALLED  # the tool ran, then the typed answer came
    first = transport.bodies[0]
    schema = first["text"]["format"] if route == "responses" else first["response_format"]
    assert first["tools"] and schema["type"] == "json_schema"  # both in one request
    assert [type(item).__name__ for item in result.new_items][:2] == ["ToolCallItem", "ToolCallOutputItem"]


def test_pydantic_ai_runs_a_tool_and_returns_native_output(server):
    """`NativeOutput` with tools: tools beside `response_format`; under auto the model calls, then answers."""
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    transport = Steered()
    client = async_openai(server, transport)
    model = OpenAIChatModel(MODEL_ID, provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, output_type=NativeOutput(Forecast), model_settings={"max_tokens": 64})
    agent.tool_plain(get_weather)
    result = run_then_close(client, agent.run("Weather in Paris?"))
    assert isinstance(result.output, Forecast) and CALLED  # the tool ran, then the typed answer came
    assert transport.bodies[0]["tools"] and transport.bodies[0]["response_format"]["type"] == "json_schema"
    assert transport.bodies[0].get("tool_choice", "auto") == "auto"  # the call was the model's own choice


def test_langchain_openai_binds_a_named_tool_and_parses_structured_output(server):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL_ID, base_url=f"{server.url}/v1", api_key="unused", max_tokens=64, max_retries=0)
    weather = tool(get_weather)
    called = llm.bind_tools([weather], tool_choice="get_weather").invoke([HumanMessage("Weather in Paris?")])
    assert called.response_metadata["finish_reason"] == "tool_calls" and len(called.tool_calls) == 1
    (call,) = called.tool_calls
    history = [
        HumanMessage("Weather in Paris?"),
        called,
        ToolMessage(weather.invoke(call["args"]), tool_call_id=call["id"]),
    ]
    answer = llm.with_structured_output(Forecast, method="json_schema").invoke(history)
    assert isinstance(answer, Forecast)
    both = llm.bind_tools([weather], tool_choice="none", response_format=Forecast).invoke(history)
    assert isinstance(both.additional_kwargs["parsed"], Forecast)


INSTRUCTOR_SCRIPT = """
    import json, sys
    from enum import Enum

    import instructor, openai
    from pydantic import BaseModel, ConfigDict

    class City(str, Enum):
        paris = "Paris"
        rome = "Rome"

    class Forecast(BaseModel):
        model_config = ConfigDict(extra="forbid")
        city: City
        sunny: bool

    client = instructor.from_openai(openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0))
    answer = client.chat.completions.create(
        model=sys.argv[2], response_model=Forecast, max_tokens=64,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    print("RESULT " + json.dumps({"mode": client.mode.name, "answer": answer.model_dump(mode="json")}))
"""


def instructor_python() -> str:
    """A Python with instructor (and the openai client it pins), in its own environment, made once."""
    env = ENVS / INSTRUCTOR.replace("==", "-")
    python = env / "bin" / "python"
    if not (env / "ready").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True, timeout=120)
        pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", INSTRUCTOR]
        done = subprocess.run(pip, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"pip install {INSTRUCTOR} failed:\n{done.stderr[-2000:]}"
        (env / "ready").write_text(INSTRUCTOR)
    return str(python)


def test_instructor_default_tools_mode_gets_one_complete_call(server):
    """instructor's default mode sends the response model as the one tool and names it in tool_choice: one call of
    it comes back, ending `tool_calls` (a second call cut by the budget raised IncompleteOutputException)."""
    script = textwrap.dedent(INSTRUCTOR_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [instructor_python(), "-c", script, f"{server.url}/v1", MODEL_ID],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert result["mode"] == "TOOLS" and Forecast(**result["answer"])
