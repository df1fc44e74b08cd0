"""`wedlm-hf serve`: uvicorn running the app, with bounded connections and a shutdown that never leaves a client
hanging.

Connections go through `connections.ConnectionGuard` (at most `max_connections`, a deadline for each request to
arrive, one log line per event); the process first raises its soft open-file limit to the hard one where allowed.

On SIGINT / SIGTERM uvicorn stops accepting connections and waits for open responses. Before that wait this server
tells the decoding loop to drain: requests not started yet get a 503 at once, running ones get `shutdown_timeout`
seconds to finish, and whatever is still running then ends with an error event (streams) or a 503 (others). Only
then does uvicorn run the lifespan shutdown, which stops the loop thread, and the process exits. A second Ctrl+C
quits at once. The address is printed once the socket is bound (with `--port 0`, the port the system chose).
"""

import os
import socket

import torch
import uvicorn

from ..data import default_model_path
from .access import default_allowed_hosts
from .app import create_app
from .connections import DEFAULT_READ_TIMEOUT, ConnectionGuard, quiet_repeated_lines, raise_open_file_limit
from .engine import ServingEngine, check_model_folder, compile_config_for, load_model, serving_device
from .limits import ServingLimits
from .scheduler import serving_limits
from .tensor_parallel import RankChannel, check_devices, follow, init_ranks, launch, launched_world

API_KEY_ENV = "WEDLM_HF_API_KEY"


class ServingServer(uvicorn.Server):
    """A uvicorn server whose shutdown drains the engine's decoding loop first. `allowed_hosts` defaults to what
    the bound address implies (`access.default_allowed_hosts`); `announce(url)` is called once it listens."""

    def __init__(
        self,
        engine: ServingEngine,
        host: str = "127.0.0.1",
        port: int = 8000,
        shutdown_timeout: float = 10.0,
        log_level: str = "info",
        allowed_hosts: list[str] | None = None,
        api_key: str | list[str] | None = None,
        announce=None,
        max_connections: int | None = None,
        request_read_timeout: float = DEFAULT_READ_TIMEOUT,
        prefix_cache_per_key: bool = False,
    ):
        self.engine = engine
        self.shutdown_timeout = shutdown_timeout
        self.announce = announce
        self.connections = ConnectionGuard(max_connections, request_read_timeout)
        app = create_app(
            engine,
            allowed_hosts or default_allowed_hosts(host),
            api_key=api_key,
            connections=self.connections,
            prefix_cache_per_key=prefix_cache_per_key,
        )
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            http=self.connections.protocol,
            ws="none",  # no WebSocket routes; an upgraded connection would leave the guard's count
            backlog=self.connections.backlog,
            lifespan="on",
            # a backstop only: the drain above ends every response within shutdown_timeout
            timeout_graceful_shutdown=shutdown_timeout + 5,
        )
        super().__init__(config)
        quiet_repeated_lines("uvicorn.error", "asyncio")

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.announce is not None and self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            self.announce(f"http://{f'[{host}]' if ':' in host else host}:{port}")

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.engine.scheduler.begin_shutdown(self.shutdown_timeout)
        await super().shutdown(sockets=sockets)
        if self.engine.ranks is not None:  # the loop has stopped: the other ranks may stop following
            self.engine.ranks.close()


def limits_from_args(args) -> ServingLimits:
    """The `--max-*` options; one left unset takes its default (`--max-request-rows`: at most `--max-queue`)."""
    given = {name: getattr(args, name) for name in ServingLimits().to_dict()}
    return serving_limits(**{name: value for name, value in given.items() if value is not None})


def serve_command(args) -> None:
    """`wedlm-hf serve`; with `--tensor-parallel-size N`, N ranks (`tensor_parallel`) of which rank 0 serves."""
    if args.shutdown_timeout < 0:
        raise SystemExit(f"--shutdown-timeout must be >= 0 seconds, got {args.shutdown_timeout}.")
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    if args.prefix_cache_per_key and not api_key:
        raise SystemExit("--prefix-cache-per-key keeps API keys apart: give the keys with --api-key KEY [KEY ...].")
    split = args.tensor_parallel_size > 1
    conflict = _batch_invariance_conflict(args)
    if conflict is not None:
        raise SystemExit(f"--batch-invariant does not cover {conflict} yet: leave one of them out.")
    if split and (args.compile or args.quantization):
        given = "--compile" if args.compile else "--quantization"
        raise SystemExit(
            f"--tensor-parallel-size: {given} is not available under tensor parallelism yet; leave it out."
        )
    raise_open_file_limit()
    try:  # all checked before any rank starts or the model loads
        limits = limits_from_args(args)
        ConnectionGuard(args.max_connections, args.request_read_timeout)
        if split:
            check_devices(args.tensor_parallel_size, args.device)
            check_model_folder(args.model)
        device = None if split else serving_device(args.device)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if args.batch_invariant and device.type != "cpu":
        raise SystemExit(
            f"--batch-invariant covers the CPU only (no invariant kernels for {device.type} here): add --device cpu."
        )
    world = launched_world()
    if split and world is None:  # start the ranks, each running this same command
        raise SystemExit(launch(args.tensor_parallel_size, args.argv, args.shutdown_timeout, args.device))
    if world is not None and world != args.tensor_parallel_size:
        raise SystemExit(
            f"--tensor-parallel-size {args.tensor_parallel_size}, but torchrun started {world} ranks: give the same "
            "number to both."
        )
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    ranks = None
    if split:
        device = init_ranks(args.device)
        ranks = RankChannel()
    if ranks is not None and ranks.rank != 0:  # the other ranks run rank 0's forwards on their slices
        try:
            model = load_model(args.model or default_model_path(), str(device), args.dtype, split=True)
        except (ValueError, OSError) as exc:
            raise SystemExit(str(exc)) from None
        follow(model, ranks)
        return
    try:
        _serve(args, api_key, limits, device, ranks)
    finally:
        if ranks is not None:
            ranks.close()


def _batch_invariance_conflict(args) -> str | None:
    """The option given beside --batch-invariant that it does not cover, if any."""
    if not args.batch_invariant:
        return None
    given = {
        "--compile": args.compile,
        "--quantization": args.quantization,
        "--tensor-parallel-size": args.tensor_parallel_size > 1,
    }
    return next((name for name, value in given.items() if value), None)


def _serve(args, api_key, limits, device, ranks) -> None:
    try:
        engine = ServingEngine.load(
            args.model,
            device=str(device),
            served_model_name=args.served_model_name,
            dtype=args.dtype,
            quantization=args.quantization,
            tool_call_parser=args.tool_call_parser,
            limits=limits,
            compile_config=compile_config_for(device) if args.compile else None,
            prefix_cache_tokens=args.prefix_cache_tokens,
            ranks=ranks,
            batch_invariant=args.batch_invariant,
        )
    except ValueError as exc:
        raise SystemExit(str(exc)) from None

    compiled = "; compiled decoding (the first requests wait for compilation)" if engine.scheduler.compiled else ""
    compiled += "; batch-invariant" if engine.scheduler.batch_invariant else ""
    split = f"; tensor parallel over {ranks.size} ranks" if ranks is not None else ""
    quantized = f" ({engine.quantization} weights)" if engine.quantization else ""

    def announce(url: str) -> None:
        if ranks is not None:
            ranks.serving = True  # from now on, losing the ranks stops the server with a signal
        print(
            f"serving {engine.model_id} on {url} (playground: /, API: /v1, health: /health); {engine.dtype}"
            f"{quantized}; "
            "max batch size "
            f"{limits.max_batch_size}, max queue {limits.max_queue} rows"
            + compiled
            + split
            + ("; API key required" if api_key else ""),
            flush=True,
        )

    server = ServingServer(
        engine,
        args.host,
        args.port,
        args.shutdown_timeout,
        allowed_hosts=args.allowed_hosts,
        api_key=api_key,
        announce=announce,
        max_connections=args.max_connections,
        request_read_timeout=args.request_read_timeout,
        prefix_cache_per_key=args.prefix_cache_per_key,
    )
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl+C it handled; the shutdown is already complete
        pass
