"""How a route answers: the body read within its bound, parsed and tokenised in a worker thread, the job handed to
the scheduler's loop, and its events turned into one JSON body or a stream.

Handlers never touch the model. A streamed response sends one chunk per commit and ends with `data: [DONE]`; when
its client goes away Starlette cancels the generator and the `finally` cancels the job, whose rows the loop drops
before its next step. A non-streamed request watches for the disconnect itself. Answers are rendered off the event
loop: log-probabilities and the JSON of a whole body are built in a worker thread, each choice encoded apart, so a
large answer never holds the loop (and `/health`, and every other stream) for long. Every request is counted in
`/metrics` when it ends, with its outcome (499: the client went away).
"""

import asyncio
import functools
import json
import logging
import time

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from .choice_tally import ChoiceTally, ChunkFrames, echo_event, off_loop
from .engine import ServingEngine
from .loop_mailbox import mailbox_for
from .openai_schema import APIError, invalid
from .responses import ResponseIds, chunk, full_body_json, sse, usage_chunk
from .responses_api import ResponseRender
from .responses_request import ResponsesRequest
from .scheduler import Delta, Failure, Finish, Job, QueueFull, ShuttingDown

RETRY_AFTER_SECONDS = 1
CLIENT_GONE = 499  # nginx's status for a client that closed the connection before the answer: logged, never sent
LOGGER = logging.getLogger("uvicorn.error")
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def respond(engine: ServingEngine, request: Request, parse):
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
    raw = await read_body(request, engine.limits.max_request_bytes)
    tenant = request.scope.get("state", {}).get("api_key") if request.app.state.prefix_cache_per_key else None
    parsed, prompts, choices = await asyncio.to_thread(_prepare, engine, parse, raw, tenant)
    echoes = None
    if parsed.echo:
        async with request.app.state.scoring:
            echoes = await asyncio.to_thread(_echoes, engine, parsed, prompts)
    ids = ResponseIds(parsed.kind, engine.model_id)
    tally = ChoiceTally(prompts, parsed.n, engine.token_texts, parsed.kind, parsed.logprobs is not None, echoes)
    tally.split_tool_calls(parsed.tools, engine.tool_format)
    if not choices:  # echo with max_tokens 0: the scored prompts are the whole answer
        tally.finish = dict.fromkeys(range(tally.count), "length")
        done(None, time.monotonic(), tally)
        if parsed.stream:
            return StreamingResponse(
                _stream_scored(ids, tally, parsed.include_usage),
                media_type="text/event-stream",
                headers=STREAM_HEADERS,
            )
        return await _json_response(ids, tally)
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    job = Job(choices, emit=functools.partial(mailbox_for(loop).post, events))
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
        frames = ChunkFrames(ids, tally, parsed.include_usage) if reply is None else reply.stream(tally)
        stream = _stream(engine, job, events, tally, frames, done, record, arrived)
        return StreamingResponse(stream, media_type="text/event-stream", headers=STREAM_HEADERS)
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


async def read_body(request: Request, limit: int) -> bytes:
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


async def _stream(
    engine: ServingEngine,
    job: Job,
    events: asyncio.Queue,
    tally: ChoiceTally,
    frames,
    done,
    record,
    arrived: float,
):
    """The stream's events, as `frames` (`ChunkFrames`, or responses_api's `ResponseEvents`) renders them;
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


async def _stream_scored(ids: ResponseIds, tally: ChoiceTally, usage_: bool):
    """The stream of an echo request with max_tokens 0: each choice's prompt, then its end."""
    for index in range(tally.count):
        yield await off_loop(functools.partial(echo_event, ids, tally, index))
        yield sse(chunk(ids, index, finish_reason="length"))
    if usage_:
        yield sse(usage_chunk(ids, tally.usage()))
    yield sse("[DONE]")


async def _collect(engine: ServingEngine, request: Request, job: Job, events: asyncio.Queue, tally: ChoiceTally):
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
