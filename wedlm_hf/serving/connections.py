"""Connections: how many the server holds, how long a request may take to arrive, and what the log says of them.

uvicorn accepts every connection the kernel hands it and waits as long as a client likes for a request's headers
and body. A client that opens connections and sends half a request (slowloris) holds a file descriptor each; past
the process's open-file limit `accept()` fails, nobody else can connect, and asyncio logs a traceback per attempt.
`ConnectionGuard` makes uvicorn's HTTP/1.1 protocol (h11) refuse that:

- at most `max_connections` are open at once (by default 1024, or half the open-file limit when that is lower, so
  the process's own files always have room), and one client address holds at most three quarters of them; a
  connection beyond either is answered 503 at once and closed, before anything is read from it. The listening
  socket's backlog (what asyncio accepts in one burst, before any of it can be refused) fits in the files left;
- a request's headers and body must arrive within `read_timeout` seconds of its first byte (for a connection's
  first request, of the connection itself); one that has not is answered 408 and its connection closed (a new
  connection that sent nothing at all is closed without an answer, as an idle one). Idle keep-alive connections
  between requests stay uvicorn's business (`timeout_keep_alive`, 5 s);
- at shutdown, a connection still receiving its request is closed at once instead of holding the exit;
- each event is one log line, and `RepeatedLines` keeps identical lines from flooding the log.
"""

import json
import logging
import resource
import time
from collections import OrderedDict, defaultdict

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_READ_TIMEOUT = 15.0  # seconds; a request body of --max-request-bytes arrives in far less on any real link
RESERVED_FILES = 64  # descriptors kept for the process itself (model files, pipes, worker threads' files)
LOGGER = logging.getLogger("uvicorn.error")


def open_file_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def raise_open_file_limit() -> int:
    """Raises the soft open-file limit to the hard one where the system allows it; returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
    return open_file_limit()


class ConnectionGuard:
    """The connection limits of one server and the protocol class that enforces them (`protocol`, for uvicorn's
    `http=`). `max_connections` None: the default above, from the open-file limit at this point."""

    def __init__(self, max_connections: int | None = None, read_timeout: float = DEFAULT_READ_TIMEOUT):
        files = open_file_limit()
        if max_connections is None:
            max_connections = max(1, min(DEFAULT_MAX_CONNECTIONS, files // 2))
        elif max_connections > files - RESERVED_FILES:
            raise ValueError(
                f"--max-connections {max_connections} cannot be held under this process's open-file limit of {files} "
                f"(ulimit -n): give at most {max(1, files - RESERVED_FILES)} or raise the limit."
            )
        if not 0 < read_timeout < float("inf"):
            raise ValueError(f"--request-read-timeout must be a number of seconds > 0, got {read_timeout!r}.")
        self.max_connections = max_connections
        self.per_client = max(1, max_connections - max_connections // 4)
        self.read_timeout = read_timeout
        self.open = 0
        self.by_client: dict[str, int] = defaultdict(int)
        self.refused = 0
        self.timed_out = 0
        # asyncio accepts up to `backlog` connections at once before any reaches `connection_made` (where one over
        # the limit is closed): a burst that size must fit in the files the limit leaves over.
        self.backlog = max(16, min(2048, (files - max_connections - RESERVED_FILES) // 2))
        self.protocol = _protocol_for(self)

    def admit(self, client: str) -> str | None:
        """Counts a new connection from `client` in, or says why it is refused."""
        if self.open >= self.max_connections:
            return f"the server holds its limit of {self.max_connections} connections (--max-connections)"
        if self.by_client[client] >= self.per_client:
            return f"this address holds {self.per_client} connections, its share of --max-connections"
        self.open += 1
        self.by_client[client] += 1
        return None

    def release(self, client: str) -> None:
        self.open -= 1
        self.by_client[client] -= 1
        if not self.by_client[client]:
            del self.by_client[client]

    def snapshot(self) -> dict:
        return {
            "open_connections": self.open,
            "max_connections": self.max_connections,
            "request_read_timeout": self.read_timeout,
            "refused_connections": self.refused,
            "timed_out_requests": self.timed_out,
        }


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol under `guard`'s limits (see the module docstring); `_protocol_for` makes the subclass
    of one server's guard, the class uvicorn instantiates per connection."""

    guard: ConnectionGuard

    _client = None  # the peer's address, once admitted
    _deadline = None  # the timer of the request being received

    def connection_made(self, transport) -> None:
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        refusal = self.guard.admit(client)
        if refusal is not None:
            self.guard.refused += 1
            LOGGER.warning("Refused a connection from %s: %s.", client, refusal)
            transport.write(_response(503, f"Connection refused: {refusal}; retry later.", "too_many_connections"))
            transport.close()
            return
        self._client = client
        super().connection_made(transport)
        self._watch()

    def connection_lost(self, exc) -> None:
        if self._client is None:  # refused: uvicorn never saw it
            return
        self.guard.release(self._client)
        self._client = None
        self._stop_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def shutdown(self) -> None:
        if self._receiving():  # a half-sent request would hold the exit until uvicorn's backstop
            self.transport.close()
            return
        super().shutdown()

    def _receiving(self) -> bool:
        """A request has begun to arrive (or, on a new connection, is awaited) and has not arrived whole."""
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            return True
        if state is h11.IDLE:  # between requests: only once the next one's first bytes are here
            return self.cycle is None or bool(self.conn.trailing_data[0])
        return False

    def _watch(self) -> None:
        if self._receiving() and not self.transport.is_closing():
            if self._deadline is None:
                self._deadline = self.loop.call_later(self.guard.read_timeout, self._timed_out)
        else:
            self._stop_deadline()

    def _stop_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or not self._receiving():
            return
        self.guard.timed_out += 1
        LOGGER.warning(
            "Closed a connection from %s: its request did not arrive within %g s (--request-read-timeout).",
            self._client,
            self.guard.read_timeout,
        )
        if self.cycle is not None:  # the app, waiting for the body, answers nothing more (request_flow.read_body)
            self.cycle.scope.setdefault("state", {})["read_timed_out"] = True
        sent = self.cycle is not None or bool(self.conn.trailing_data[0])  # a connection that sent nothing
        if sent and self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # ... is closed as an idle one
            message = f"The request did not arrive within {self.guard.read_timeout:g} s (--request-read-timeout)."
            self.transport.write(_response(408, message, "request_timeout"))
        self.transport.close()


def _protocol_for(guard: ConnectionGuard) -> type:
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guard": guard})


def _response(status: int, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response with an OpenAI-style error body, written before (or instead of) reading a
    request, so outside h11's state machine."""
    kind = "invalid_request_error" if status < 500 else "server_unavailable"  # as APIError's types
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
    reason = {408: "Request Timeout", 503: "Service Unavailable"}[status]
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n" + ("retry-after: 1\r\n" if status == 503 else "") + "\r\n"
    )
    return head.encode("latin-1") + body.encode()


class RepeatedLines(logging.Filter):
    """Passes a log line; the same line again within `window` seconds is counted instead, and the next one written
    after that says how many were left out. A flood of one event (refused connections, a client retrying a bad
    request, `accept()` failing) costs the log a line per window, not a line (or a traceback) per event."""

    def __init__(self, window: float = 10.0, remembered: int = 1024):
        super().__init__()
        self.window = window
        self._seen: OrderedDict = OrderedDict()  # (logger, level, text) -> [when written, left out since]
        self._remembered = remembered

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a line that cannot be formatted is logging's to report
            return True
        error = repr(record.exc_info[1]) if record.exc_info else None  # different failures are different lines
        key, now = (record.name, record.levelno, text, error), time.monotonic()
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.window:
            seen[1] += 1
            return False
        if seen is not None and seen[1]:
            record.msg, record.args = f"{text} ({seen[1]} more like it were left out of the log)", ()
        self._seen[key] = [now, 0]
        self._seen.move_to_end(key)
        while len(self._seen) > self._remembered:
            self._seen.popitem(last=False)
        return True


REPEATED_LINES = RepeatedLines()


def quiet_repeated_lines(*loggers: str) -> None:
    """Puts the one `RepeatedLines` filter on these loggers (once each)."""
    for name in loggers:
        logger = logging.getLogger(name)
        if REPEATED_LINES not in logger.filters:
            logger.addFilter(REPEATED_LINES)
