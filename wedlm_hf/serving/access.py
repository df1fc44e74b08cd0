"""Who may talk to the server: the Host check, the API key and the JSON-only bodies, as one ASGI middleware.

A web page the user visits can make the browser send requests to 127.0.0.1. Two things stop it here: a POST must
say `Content-Type: application/json`, which a page cannot send to another origin without a CORS preflight (that
this server never answers), and the `Host` header must name this server (by default the loopback names when
bound to a loopback address, the address itself when bound to another one), which a DNS-rebinding page cannot
fake. `--api-key` additionally requires `Authorization: Bearer KEY` on the API routes, as OpenAI clients send it;
with several keys (one per tenant), the request's scope records which one it carried (`scope["state"]["api_key"]`,
its index), so the prefix cache can keep tenants apart.
"""

import hmac
import ipaddress
import json

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
# The page itself, the liveness probe, the metrics scrape and `transformers chat`'s load_model (which sends no key
# and learns only whether the model it names is served) need no key: they carry no request's data.
OPEN_PATHS = ("/", "/playground.js", "/health", "/metrics", "/load_model")


def default_allowed_hosts(host: str) -> list[str]:
    """Host names a client may use for a server bound to `host`: any, for a wildcard bind."""
    if host in ("", "0.0.0.0", "::"):
        return ["*"]
    try:
        if ipaddress.ip_address(host).is_loopback:
            return [*LOOPBACK_NAMES, host]
    except ValueError:  # a name, e.g. localhost or the machine's
        if host == "localhost":
            return list(LOOPBACK_NAMES)
    return [host]


def host_name(header: str) -> str:
    """The name part of a Host header: `[::1]:8000` -> `::1`, `Example.com:80` -> `example.com`."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class AccessGuard:
    """ASGI middleware: refuses a request whose Host is not allowed (400), that lacks the API key (401), or whose
    POST body is not declared as JSON (415), before the app sees it."""

    def __init__(self, app, allowed_hosts: list[str], api_key: str | list[str] | None = None):
        self.app = app
        self.any_host = "*" in allowed_hosts
        self.allowed = {name.lower().strip("[]") for name in allowed_hosts}
        keys = [api_key] if isinstance(api_key, str) else list(api_key or [])
        self.api_keys = [key.encode() for key in keys]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is None:
            return await self.app(scope, receive, send)
        status, message, code, extra = refusal
        body = json.dumps({"error": {"message": message, "type": _TYPES[status], "param": None, "code": code}})
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), *extra],
            }
        )
        await send({"type": "http.response.body", "body": body.encode()})

    def _refusal(self, scope, headers: dict):
        host = host_name(headers.get("host", ""))
        if not self.any_host and host not in self.allowed:
            return (
                400,
                f"Host {headers.get('host', '')!r} is not served here (allowed: {', '.join(sorted(self.allowed))}); "
                "start the server with --allowed-hosts to allow it.",
                "invalid_host",
                [],
            )
        if self.api_keys and scope["path"] not in OPEN_PATHS:
            given = headers.get("authorization", "")
            scheme, _, key = given.partition(" ")
            # every key compared, in constant time each, so the time taken does not tell which one was close
            matches = [hmac.compare_digest(key.strip().encode(), known) for known in self.api_keys]
            if scheme.lower() == "bearer" and any(matches):
                scope.setdefault("state", {})["api_key"] = matches.index(True)
            else:
                return (
                    401,
                    "Missing or wrong API key: send the header 'Authorization: Bearer <key>' with the key the "
                    "server was started with (--api-key).",
                    "invalid_api_key",
                    [(b"www-authenticate", b"Bearer")],
                )
        if scope["method"] == "POST":
            kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if kind != "application/json":
                return (
                    415,
                    "The request body must be JSON sent with 'Content-Type: application/json' "
                    f"(got {kind or 'none'!r}).",
                    "unsupported_media_type",
                    [],
                )
        return None


_TYPES = {400: "invalid_request_error", 401: "authentication_error", 415: "invalid_request_error"}
