"""`wedlm-hf serve`: uvicorn running the app, with a shutdown that never leaves a client hanging.

On SIGINT / SIGTERM uvicorn stops accepting connections and waits for open responses. Before that wait this server
tells the decoding loop to drain: requests not started yet get a 503 at once, running ones get `shutdown_timeout`
seconds to finish, and whatever is still running then ends with an error event (streams) or a 503 (others). Only
then does uvicorn run the lifespan shutdown, which stops the loop thread, and the process exits. A second Ctrl+C
quits at once.
"""

import socket

import torch
import uvicorn

from .app import create_app
from .engine import ServingEngine


class ServingServer(uvicorn.Server):
    """A uvicorn server whose shutdown drains the engine's decoding loop first."""

    def __init__(
        self,
        engine: ServingEngine,
        host: str = "127.0.0.1",
        port: int = 8000,
        shutdown_timeout: float = 10.0,
        log_level: str = "info",
    ):
        self.engine = engine
        self.shutdown_timeout = shutdown_timeout
        config = uvicorn.Config(
            create_app(engine),
            host=host,
            port=port,
            log_level=log_level,
            lifespan="on",
            # a backstop only: the drain above ends every response within shutdown_timeout
            timeout_graceful_shutdown=shutdown_timeout + 5,
        )
        super().__init__(config)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.engine.scheduler.begin_shutdown(self.shutdown_timeout)
        await super().shutdown(sockets=sockets)


def serve_command(args) -> None:
    """`wedlm-hf serve`."""
    for name in ("max_batch_size", "max_queue"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}.")
    if args.shutdown_timeout < 0:
        raise SystemExit(f"--shutdown-timeout must be >= 0 seconds, got {args.shutdown_timeout}.")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        engine = ServingEngine.load(
            args.model, device=args.device, max_batch_size=args.max_batch_size, max_queue=args.max_queue
        )
    except ValueError as exc:
        raise SystemExit(f"wedlm-hf serve: {exc}") from None
    print(
        f"serving {engine.model_id} on http://{args.host}:{args.port} (playground: /, API: /v1, health: /health); "
        f"max batch size {args.max_batch_size}, max queue {args.max_queue}",
        flush=True,
    )
    try:
        ServingServer(engine, args.host, args.port, args.shutdown_timeout).run()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl+C it handled; the shutdown is already complete
        pass
