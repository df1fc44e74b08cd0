"""The FastAPI application: OpenAI routes, the playground, health and metrics.

The routes only hand their request to `request_flow.respond` (read, parse and tokenise off the event loop, decode
on the scheduler's thread, answer as one body or a stream); errors become OpenAI-style bodies here. A client that
goes away while sending its request is one log line.
"""

import asyncio
import json
import time
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .access import LOOPBACK_NAMES, AccessGuard
from .engine import ServingEngine
from .metrics import ServerMetrics
from .openai_schema import APIError, error_body, parse_chat, parse_completion
from .request_flow import STREAM_HEADERS, read_body, respond
from .responses_request import parse_responses
from .transformers_chat import LOAD_MODEL_BYTES, load_model_answer

HERE = Path(__file__).resolve().parent


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
    _error_bodies(app)
    _page_and_state_routes(app, engine, connections, prefix_cache_per_key)
    _api_routes(app, engine)
    return app


def _error_bodies(app: FastAPI) -> None:
    """Every error as OpenAI's error body: ours with their status, Starlette's (404, 405) naming the route, and
    anything unexpected as a 500 that says the server keeps running."""

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


def _page_and_state_routes(app: FastAPI, engine: ServingEngine, connections, prefix_cache_per_key: bool) -> None:
    """The playground, `/health`, `/metrics` and the model list."""

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
        metrics = app.state.metrics
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(engine)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != engine.model_id:
            raise APIError(404, f"The model {model_id!r} is not served here.", param="model", code="model_not_found")
        return _model_card(engine)


def _api_routes(app: FastAPI, engine: ServingEngine) -> None:
    """OpenAI's completions, chat and Responses routes, and `transformers chat`'s `/load_model`."""

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await respond(engine, request, parse_completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await respond(engine, request, parse_chat)

    @app.post("/v1/responses")
    async def responses(request: Request):
        return await respond(engine, request, parse_responses)

    @app.post("/load_model")
    async def load_model(request: Request):  # `transformers chat` asks for the model first (transformers_chat)
        raw = await read_body(request, LOAD_MODEL_BYTES)
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            body = None
        status, events = load_model_answer(body, engine.model_id)
        request.app.state.metrics.finished("/load_model", status, time.monotonic(), None, time.monotonic())
        return Response(events, status_code=status, media_type="text/event-stream", headers=STREAM_HEADERS)


def _model_card(engine: ServingEngine) -> dict:
    return {"id": engine.model_id, "object": "model", "created": 0, "owned_by": "wedlm-hf", "dtype": engine.dtype}
