"""The FastAPI application: OpenAI routes, server-sent events, the playground, health.

Handlers never touch the model: they read the body (at most --max-request-bytes), then parse, validate and
tokenise it in a worker thread (never on the event loop, so a large request cannot stall the others), hand its
choices to the scheduler's loop thread as a `Job`, and read the job's events from an asyncio queue that the loop
thread feeds. A streamed response sends one chunk per commit and ends with `data: [DONE]`; when its client goes
away Starlette cancels the generator and the `finally` cancels the job, whose rows the loop drops before its next
step. A non-streamed request watches for the disconnect itself.

Answers are rendered off the event loop: log-probabilities (each choice's, and an echoed prompt's for every choice)
and the JSON of a whole body are built in a worker thread, each choice encoded apart, so a large answer never holds
the loop (and `/health`, and every other stream) for long. A client that goes away while sending its request is
one log line. Every request is counted in `/metrics` when it ends, with its outcome (499: the client went away).
"""

import asyncio
import functools
import json
import logging
import time
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .access import LOOPBACK_NAMES, AccessGuard
from .engine import ServingEngine
from .metrics import ServerMetrics
from .openai_schema import APIError, error_body, invalid, parse_chat, parse_completion
from .responses import ResponseIds, chunk, full_body_json, sse, token_logprobs, usage, usage_chunk
from .responses_api import ResponseRender
from .responses_request import ResponsesRequest, parse_responses
from .scheduler import Delta, Failure, Finish, Job, QueueFull, ShuttingDown
from .tool_calls import ToolCallText
from .transformers_chat import LOAD_MODEL_BYTES, load_model_answer

HERE = Path(__file__).resolve().parent
RETRY_AFTER_SECONDS = 1
CLIENT_GONE = 499  # nginx's status for a client that closed the connection before the answer: logged, never sent
LOGGER = logging.getLogger("uvicorn.error")
_STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def create_app(
    engine: ServingEngine,
    allowed_hosts: list[str] | None = None,
    api_key: str | list[str] | None = None,
    connections=None,
    prefix_cache_per_key: bool = False,
) -> FastAPI:
    """The app serving `engine`; its lifespan starts the decoding loop and stops it after the last response.
    Requests must name an allowed host (by default the loopback names) and, with `api_key` (one key or several),
    carry a key; with `prefix_cache_per_key`, requests under different keys share no prefix-cache blocks.
    `connections` (a `ConnectionGuard`) adds its counters to `/health`."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.scheduler.start()
        yield
        await asyncio.to_thread(engine.scheduler.stop)

    # No /docs: FastAPI's docs page loads its scripts from a CDN, and the server promises to need none.
    app = FastAPI(title="wedlm-hf serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = engine
    app.state.prefix_cache_per_key = prefix_cache_per_key
    app.state.scoring = asyncio.Semaphore(1)  # echo: one prompt-scoring forward at a time, beside the decoding loop
    app.state.metrics = metrics = ServerMetrics(engine.scheduler)
    engine.grammar_observers.append(metrics.grammar_compile.observe)
    app.add_middleware(AccessGuard, allowed_hosts=list(allowed_hosts or LOOPBACK_NAMES), api_key=api_key)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return JSONResponse(error_body(message, "invalid_request_error"), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception):
        body = error_body(f"Internal error ({type(exc).__name__}: {exc}); the server keeps running.", "server_error")
        return JSONResponse(body, status_code=500)

    @app.get("/", response_class=HTMLResponse)
    async def playground():
        return HTMLResponse((HERE / "playground.html").read_text(encoding="utf-8"))

    @app.get("/playground.js")
    async def playground_script():
        return Response((HERE / "playground.js").read_text(encoding="utf-8"), media_type="text/javascript")

    @app.get("/health")
    async def health():
        scheduler = engine.scheduler
        status = "ok" if scheduler.alive else "stopped"
        body = {
            "status": status,
            "model": engine.model_id,
            "dtype": engine.dtype,
            "quantization": engine.quantization,
            "tensor_parallel_size": 1 if engine.ranks is None else engine.ranks.size,
            "compiled": scheduler.compiled is not None,  # `--compile`: decoding steps run compiled on fixed slots
            **engine.limits.to_dict(),
            **(connections.snapshot() if connections is not None else {}),
            "prefix_cache_per_key": prefix_cache_per_key,
            **scheduler.snapshot(),
        }
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(engine)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != engine.model_id:
            raise APIError(404, f"The model {model_id!r} is not served here.", param="model", code="model_not_found")
        return _model_card(engine)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _respond(engine, request, parse_completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _respond(engine, request, parse_chat)

    @app.post("/v1/responses")
    async def responses(request: Request):
        return await _respond(engine, request, parse_responses)

    @app.post("/load_model")
    async def load_model(request: Request):  # `transformers chat` asks for the model first (transformers_chat)
        raw = await _read_body(request, LOAD_MODEL_BYTES)
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            body = None
        status, events = load_model_answer(body, engine.model_id)
        request.app.state.metrics.finished("/load_model", status, time.monotonic(), None, time.monotonic())
        return Response(events, status_code=status, media_type="text/event-stream", headers=_STREAM_HEADERS)

    return app


def _model_card(engine: ServingEngine) -> dict:
    return {"id": engine.model_id, "object": "model", "created": 0, "owned_by": "wedlm-hf", "dtype": engine.dtype}


async def _respond(engine: ServingEngine, request: Request, parse):
    """The route's answer; the request is counted in the metrics when it ends (errors when they are raised)."""
    arrived = time.monotonic()
    try:
        return await _answer(engine, request, parse, arrived)
    except APIError as exc:
        request.app.state.metrics.finished(request.url.path, exc.status, arrived, None, time.monotonic())
        raise


async def _answer(engine: ServingEngine, request: Request, parse, arrived: float):
    record = functools.partial(request.app.state.metrics.finished, request.url.path)
    done = functools.partial(record, 200, arrived)
    raw = await _read_body(request, engine.limits.max_request_bytes)
    tenant = request.scope.get("state", {}).get("api_key") if request.app.state.prefix_cache_per_key else None
    parsed, prompts, choices = await asyncio.to_thread(_prepare, engine, parse, raw, tenant)
    echoes = None
    if parsed.echo:
        async with request.app.state.scoring:
            echoes = await asyncio.to_thread(_echoes, engine, parsed, prompts)
    ids = ResponseIds(parsed.kind, engine.model_id)
    tally = _Tally(prompts, parsed.n, engine.token_texts, parsed.kind, parsed.logprobs is not None, echoes)
    tally.split_tool_calls(parsed.tools, engine.tool_format)
    if not choices:  # echo with max_tokens 0: the scored prompts are the whole answer
        tally.finish = dict.fromkeys(range(tally.count), "length")
        done(None, time.monotonic(), tally)
        if parsed.stream:
            return StreamingResponse(
                _stream_scored(ids, tally, parsed.include_usage),
                media_type="text/event-stream",
                headers=_STREAM_HEADERS,
            )
        return await _json_response(ids, tally)
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    job = Job(choices, emit=lambda event: loop.call_soon_threadsafe(events.put_nowait, event))
    try:
        engine.scheduler.submit(job)
    except QueueFull:
        raise APIError(
            429,
            f"The server is at capacity (at most {engine.scheduler.max_queue} rows may wait to join the batch): "
            f"retry after {RETRY_AFTER_SECONDS} s.",
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        ) from None
    except ShuttingDown:
        raise APIError(503, "The server is shutting down.", code="shutting_down") from None
    # /v1/responses decodes as chat and renders a Response object (responses_api.py)
    reply = ResponseRender(parsed, engine.model_id) if isinstance(parsed, ResponsesRequest) else None
    if parsed.stream:
        frames = _ChunkFrames(ids, tally, parsed.include_usage) if reply is None else reply.stream(tally)
        stream = _stream(engine, job, events, tally, frames, done, record, arrived)
        return StreamingResponse(stream, media_type="text/event-stream", headers=_STREAM_HEADERS)
    response = await _collect(engine, request, job, events, tally)
    if response is None and reply is not None:
        answer = tally.choices()[0]  # (its text and tool calls split)
        response = JSONResponse(
            reply.body(answer["text"], answer["finish_reason"], tally.usage(), answer.get("tool_calls"))
        )
    elif response is None:
        response = await _json_response(ids, tally)
    if response.status_code == 200:
        done(tally.first_token, time.monotonic(), tally)
    else:
        record(response.status_code, arrived, None, time.monotonic())
    return response


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused with a 413 as soon as it is known to exceed `limit` bytes (declared or received)."""
    declared = request.headers.get("content-length", "")
    too_large = APIError(
        413,
        f"The request body is larger than this server's limit of {limit} bytes (--max-request-bytes).",
        code="request_too_large",
    )
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    try:
        async for piece in request.stream():
            size += len(piece)
            if size > limit:
                raise too_large
            chunks.append(piece)
    except ClientDisconnect:
        if request.scope.get("state", {}).get("read_timed_out"):  # closed by the read deadline, logged there
            raise APIError(408, "The request did not arrive in time.", code="request_timeout") from None
        client = request.client.host if request.client else "unknown"
        LOGGER.info("A client from %s went away before its request arrived whole.", client)
        raise APIError(CLIENT_GONE, "The client went away before its request arrived whole.") from None
    return b"".join(chunks)


def _prepare(engine: ServingEngine, parse, raw: bytes, tenant=None):
    """Body bytes to (request, token ids, choices): the slow part of a request, run in a worker thread."""
    parsed = parse(_json_body(raw), engine.model_id, engine.defaults, engine.limits.max_window_size)
    prompts = engine.encode(parsed)
    return parsed, prompts, engine.choices(parsed, prompts, tenant)


async def _json_response(ids: ResponseIds, tally) -> Response:
    """The whole body, its choices' log-probabilities and JSON made in a worker thread."""
    body = await asyncio.to_thread(lambda: full_body_json(ids, tally.choices(), tally.usage()))
    return Response(body, media_type="application/json")


def _echoes(engine: ServingEngine, parsed, prompts: list[list[int]]) -> list[tuple[str, list]]:
    """Per prompt: its text as the client sent it (token ids decoded) and its tokens' (token, log-probability,
    alternatives), the first without any. Runs in a worker thread."""
    top = parsed.logprobs or 0
    out = []
    for given, ids in zip(parsed.prompts, prompts):
        text = given if isinstance(given, str) else engine.tokenizer.decode(ids, clean_up_tokenization_spaces=False)
        out.append((text, engine.score_prompt(ids, top) if parsed.logprobs is not None else []))
    return out


def _json_body(raw: bytes):
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(None, f"The request body is not valid JSON ({exc}).", code="invalid_json") from None
    except RecursionError:
        raise invalid(None, "The request body is nested too deeply to be a request.", code="invalid_json") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


class _Tally:
    """Per-choice text and finish reasons, and the request's usage."""

    def __init__(self, prompts, n: int, texts=None, kind: str = "completion", logprobs=False, echoes=None):
        self.count = len(prompts) * n
        self.texts_of, self.kind, self.logprobs = texts, kind, logprobs  # texts_of(id): a token's text
        # echo: each choice starts with its prompt's text and scored tokens (`echo_chunk` streams them)
        self.echoes = [echoes[i // n] for i in range(self.count)] if echoes else None
        starts = self.echoes or [("", [])] * self.count
        self.texts = [[text] if text else [] for text, _ in starts]
        self.entries = [list(scored) for _, scored in starts]  # (token, log-probability, alternatives) per choice
        self.offsets = [0] * self.count  # streamed completions: text offset of each choice's next token
        self.prompt_tokens = sum(len(p) for p in prompts)
        self.finish: dict[int, str] = {}
        self.completion_tokens = 0
        self.forwards = 0
        self.accepted_drafts: dict | None = None  # {"model", "context"} once a lossless row finished
        self.n = n
        self.cached: dict[int, int] = {}  # per prompt: the prompt tokens every one of its choices found cached
        self.first_token: float | None = None  # when the first completion token arrived (time.monotonic)
        self.tool_text: list | None = None  # with tools: each choice's `ToolCallText` (split_tool_calls)
        self.tool_form = None
        self.calls_only = False

    def split_tool_calls(self, tools, form) -> None:
        """With tools a choice may call (`tool_calls`): each choice's text is split into its text and its calls,
        written in `form` (a `ToolFormat`)."""
        self.tool_form = form
        self.calls_only = tools is not None and tools.calls_only
        active = tools is not None and tools.active
        self.tool_text = [ToolCallText(form, self.calls_only) for _ in range(self.count)] if active else None

    def shown(self, event: Delta) -> str:
        """A streamed delta's text: all of it, or with tools the part before a call (each delta read once)."""
        return event.text if self.tool_text is None else self.tool_text[event.choice].feed(event.text)

    def tool_finish(self, index: int, reason: str) -> tuple[str, list[dict], str]:
        """A streamed choice's end with tools: the text held back, its calls and its finish reason."""
        split = self.tool_text[index]
        calls = split.calls()
        return split.rest(cut=reason == "length"), calls, _tool_reason(calls, reason)

    @property
    def done(self) -> bool:
        return len(self.finish) == self.count

    def add(self, event) -> None:
        if isinstance(event, Delta):
            if self.first_token is None and event.tokens:
                self.first_token = time.monotonic()
            self.texts[event.choice].append(event.text)
            if event.logprobs:
                self.entries[event.choice] += event.logprobs
        elif isinstance(event, Finish):
            self.finish[event.choice] = event.reason
            self.completion_tokens += event.completion_tokens
            self.forwards += event.forwards
            prompt = event.choice // self.n
            self.cached[prompt] = min(self.cached.get(prompt, event.cached_tokens), event.cached_tokens)
            if event.accepted_drafts is not None:
                split = self.accepted_drafts or {"model": 0, "context": 0}
                split["model"] += event.accepted_drafts - event.accepted_context_drafts
                split["context"] += event.accepted_context_drafts
                self.accepted_drafts = split

    def usage(self) -> dict:
        return usage(
            self.prompt_tokens, self.completion_tokens, self.forwards, self.accepted_drafts, sum(self.cached.values())
        )

    def echo_chunk(self, ids: ResponseIds, index: int) -> dict:
        """A stream's first chunk of an echoed choice: the prompt's text and, when asked, its tokens' logprobs."""
        text, entries = self.echoes[index]
        body = token_logprobs(self.kind, entries, self.texts_of) if self.logprobs else None
        if body is not None:
            self.offsets[index] = sum(len(piece) for piece in body["tokens"])
        return chunk(ids, index, text, logprobs=body)

    def delta_logprobs(self, event: Delta) -> dict | None:
        """The `logprobs` of one stream chunk: its tokens', text offsets counted from the choice's earlier tokens."""
        if not self.logprobs:
            return None
        body = token_logprobs(self.kind, event.logprobs or [], self.texts_of, self.offsets[event.choice])
        if self.kind != "chat":
            self.offsets[event.choice] += sum(len(piece) for piece in body["tokens"])
        return body

    def choices(self) -> list[dict]:
        out = [
            {
                "index": i,
                "text": "".join(self.texts[i]),
                "finish_reason": self.finish[i],
                "logprobs": token_logprobs(self.kind, self.entries[i], self.texts_of) if self.logprobs else None,
            }
            for i in range(self.count)
        ]
        for choice in out if self.tool_text is not None else []:
            split = ToolCallText(self.tool_form, self.calls_only)
            split.feed(choice["text"])
            content = split.content(cut=choice["finish_reason"] == "length")
            choice["tool_calls"] = split.calls()
            choice["text"] = content if content.strip() or not choice["tool_calls"] else ""
            choice["finish_reason"] = _tool_reason(choice["tool_calls"], choice["finish_reason"])
        return out


def _tool_reason(calls: list, reason: str) -> str:
    """A choice that made complete calls ends `tool_calls`, also where a later call was cut by its token budget
    (the complete ones are kept, the cut one left out): a call that completed is never reported as cut."""
    return "tool_calls" if calls and reason in ("stop", "length") else reason


class _ChunkFrames:
    """What a completions or chat stream sends, for `_stream`: OpenAI's chunks, ending with `data: [DONE]`.
    Chunks with log-probabilities (and echoed prompts) are rendered in a worker thread."""

    def __init__(self, ids: ResponseIds, tally: _Tally, usage_: bool):
        self.ids, self.tally, self.usage_ = ids, tally, usage_
        self.render = _off_loop if tally.logprobs else _on_loop

    async def opening(self):
        ids, tally = self.ids, self.tally
        if ids.kind == "chat":
            for index in range(tally.count):
                yield sse(chunk(ids, index, role=True))
        for index in range(tally.count if tally.echoes else 0):
            yield await self.render(functools.partial(_echo_event, ids, tally, index))

    async def delta(self, event: Delta) -> list[str]:
        frame = await self.render(functools.partial(_delta_event, self.ids, self.tally, event))
        return [frame] if frame else []

    def finish(self, event: Finish) -> list[str]:
        if self.tally.tool_text is None:
            return [sse(chunk(self.ids, event.choice, finish_reason=event.reason))]
        rest, calls, reason = self.tally.tool_finish(event.choice, event.reason)
        frames = [sse(chunk(self.ids, event.choice, rest))] if rest else []
        if calls:  # each call whole, in one delta (OpenAI's clients join the pieces of a call by its index)
            entries = [{"index": k, **call} for k, call in enumerate(calls)]
            frames.append(sse(chunk(self.ids, event.choice, tool_calls=entries)))
        return frames + [sse(chunk(self.ids, event.choice, finish_reason=reason))]

    def failure(self, event: Failure) -> list[str]:
        kind = "server_error" if event.status >= 500 else "invalid_request_error"
        return [sse(error_body(event.message, kind, event.param, event.code)), sse("[DONE]")]

    def closing(self) -> list[str]:
        return ([sse(usage_chunk(self.ids, self.tally.usage()))] if self.usage_ else []) + [sse("[DONE]")]


async def _stream(
    engine: ServingEngine,
    job: Job,
    events: asyncio.Queue,
    tally: _Tally,
    frames,
    done,
    record,
    arrived: float,
):
    """The stream's events, as `frames` (`_ChunkFrames`, or responses_api's `ResponseEvents`) renders them;
    `done(first, ended, tally)` records a stream that ran to its end, `record(status, ...)` one that failed or whose
    client went away."""
    status = CLIENT_GONE  # unless it ends otherwise
    try:
        async for frame in frames.opening():
            yield frame
        while not tally.done:
            event = await events.get()
            if isinstance(event, Failure):
                status = event.status
                for frame in frames.failure(event):
                    yield frame
                return
            tally.add(event)
            if isinstance(event, Delta):
                for frame in await frames.delta(event):
                    yield frame
            elif isinstance(event, Finish):
                for frame in frames.finish(event):
                    yield frame
        for frame in frames.closing():
            yield frame
        status = 200
        done(tally.first_token, time.monotonic(), tally)
    except Exception:
        status = 500
        raise
    finally:  # also when the client went away (Starlette cancels this generator)
        engine.scheduler.cancel(job)
        if status != 200:
            record(status, arrived, None, time.monotonic())


def _delta_event(ids: ResponseIds, tally: _Tally, event: Delta) -> str:
    """A delta's chunk; "" where tools hold its whole text back (part of a call, sent at the choice's end) and it
    carries no log-probabilities."""
    forward = {"forward": event.forward, "tokens": event.tokens}
    text, logprobs = tally.shown(event), tally.delta_logprobs(event)
    if not text and tally.tool_text is not None and logprobs is None:
        return ""
    return sse(chunk(ids, event.choice, text, wedlm=forward, logprobs=logprobs))


def _echo_event(ids: ResponseIds, tally: _Tally, index: int) -> str:
    return sse(tally.echo_chunk(ids, index))


async def _off_loop(make):
    return await asyncio.to_thread(make)


async def _on_loop(make):
    return make()


async def _stream_scored(ids: ResponseIds, tally: _Tally, usage_: bool):
    """The stream of an echo request with max_tokens 0: each choice's prompt, then its end."""
    for index in range(tally.count):
        yield await _off_loop(functools.partial(_echo_event, ids, tally, index))
        yield sse(chunk(ids, index, finish_reason="length"))
    if usage_:
        yield sse(usage_chunk(ids, tally.usage()))
    yield sse("[DONE]")


async def _collect(engine: ServingEngine, request: Request, job: Job, events: asyncio.Queue, tally: _Tally):
    """Feeds the job's events to `tally` until it is done (None), or the client went away (a 499 response)."""
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        while not tally.done:
            get = asyncio.ensure_future(events.get())
            await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                return Response(status_code=499)  # nobody is listening; the job is cancelled below
            event = get.result()
            if isinstance(event, Failure):
                raise APIError(event.status, event.message, param=event.param, code=event.code)
            tally.add(event)
    finally:
        gone.cancel()
        engine.scheduler.cancel(job)
    return None


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
