"""Shared pieces of the HTTP services (extender, bridge, dashboard): /metrics, /healthz, token
middleware, security headers, bounded JSON bodies and the uvicorn runner (graceful shutdown,
header-read and keep-alive timeouts, a connection limit)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from services.common.config import ServiceSettings
from services.common.memory import freeze_startup_objects
from services.common.tokens import bearer, token_matches

log = logging.getLogger(__name__)

MUTATING_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


class HttpError(Exception):
    """An expected HTTP error; handlers raise it and :func:`error_response` renders it."""

    def __init__(
        self, status: int, message: str, *, field: str | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.extra = extra

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.message}
        if self.field:
            out["field"] = self.field
        out.update(self.extra)
        return out


def error_response(exc: HttpError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def metrics_route(registry: CollectorRegistry = REGISTRY) -> Route:
    """A plain Route (a Mount would answer 307 and scrapers would lose it)."""

    async def metrics(_request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Route("/metrics", metrics, methods=["GET"])


def healthz_route() -> Route:
    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return Route("/healthz", healthz, methods=["GET"])


class TokenMiddleware:
    """When an API token is configured, mutating requests without it get 401 with a JSON body.

    Header values are compared as the raw bytes that arrived, so a value that is not UTF-8 or a
    token with any character is just a mismatch (401), never an error."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and token_refused(scope, self.token):
            await send_json(send, 401, orjson.dumps({"error": TOKEN_REFUSED}))
            return
        await self.app(scope, receive, send)


TOKEN_REFUSED = "missing or invalid API token"


def token_refused(scope: Scope, token: str | None) -> bool:
    """True for a mutating request without the configured token (never when none is set)."""
    return bool(
        token
        and scope["method"] in MUTATING_METHODS
        and not token_matches(presented_header_token(scope.get("headers", [])), token)
    )


def presented_header_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """``X-API-Token`` or the ``Authorization: Bearer`` token, as the bytes the client sent."""
    given: bytes | None = None
    authorization: bytes | None = None
    for key, value in headers:
        name = key.lower()
        if name == b"x-api-token":
            given = value
        elif name == b"authorization":
            authorization = value
    if given is None and authorization is not None:
        token = bearer(authorization.decode("latin-1"))
        given = token.encode("latin-1") if token is not None else None
    return given


# The dashboard's pages load only their own script and styles: no inline script, no eval, no
# plugins, not framable. Inline style attributes stay allowed (bar widths in the templates).
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]


class SecurityHeadersMiddleware:
    """Adds the Content-Security-Policy and friends to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in SECURITY_HEADERS if k not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, refusing more than max_bytes with 413 before reading it all."""
    return await bounded_body(request.headers.get("content-length"), request.stream(), max_bytes)


async def bounded_body(declared: str | None, chunks: AsyncIterator[bytes], max_bytes: int) -> bytes:
    """Joins the chunks, with 413 as soon as the declared length or what came exceeds the cap."""
    if declared is not None:
        try:
            if int(declared) > max_bytes:
                raise HttpError(413, f"request body over {max_bytes} bytes")
        except ValueError as exc:
            raise HttpError(400, "invalid Content-Length") from exc
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise HttpError(413, f"request body over {max_bytes} bytes")
        parts.append(chunk)
    return b"".join(parts)


async def _asgi_chunks(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


JSON_HEADERS = [(b"content-type", b"application/json"), *SECURITY_HEADERS]


async def send_json(send: Send, status: int, body: bytes) -> None:
    """A whole JSON response, with the security headers, as two ASGI messages."""
    headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


PostHandler = Callable[[bytes], Awaitable[tuple[int, bytes]]]


class PostEndpoints:
    """JSON POST endpoints served straight from ASGI, ahead of the app: for the paths a peer
    calls per item at a high rate (kube-scheduler calls the extender's verbs three times per
    pod), where Starlette's request, response and middleware layers cost more CPU than the
    answer. The same rules as the app's middleware: the token for every call when one is set,
    the body capped, the security headers; other paths and methods go to the app."""

    def __init__(
        self, app: ASGIApp, handlers: dict[str, PostHandler], token: str | None, max_bytes: int
    ) -> None:
        self.app = app
        self.handlers = handlers
        self.token = token
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.handlers.get(scope["path"]) if scope["type"] == "http" else None
        if handler is None:
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            body = orjson.dumps({"error": f"{scope['method']} not allowed; use POST"})
            await send_json(send, 405, body)
            return
        if token_refused(scope, self.token):
            await send_json(send, 401, orjson.dumps({"error": TOKEN_REFUSED}))
            return
        declared = next(
            (v.decode("latin-1") for k, v in scope["headers"] if k == b"content-length"), None
        )
        try:
            payload = await bounded_body(declared, _asgi_chunks(receive), self.max_bytes)
        except HttpError as exc:
            await send_json(send, exc.status, orjson.dumps(exc.body()))
            return
        status, answer = await handler(payload)
        await send_json(send, status, answer)


async def read_json_object(request: Request, max_bytes: int = 1 << 20) -> dict[str, Any]:
    body = await read_body(request, max_bytes)
    if not body:
        raise HttpError(400, "request body is empty; expected a JSON object")
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise HttpError(400, f"malformed JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise HttpError(400, "expected a JSON object")
    return value


@dataclass(frozen=True)
class ConnectionLimits:
    """What one slow or idle client may hold: every HTTP service serves with these."""

    header_timeout_s: float = 10.0  # connection open (or last response sent) -> request read
    keep_alive_s: float = 5.0  # idle between requests on one connection
    max_connections: int = 512  # open connections; more are closed at once
    max_header_bytes: int = 16 * 1024  # request line + headers; more is 400

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> ConnectionLimits:
        d = cls()
        return cls(
            header_timeout_s=settings.get_float("http_header_timeout_s", d.header_timeout_s),
            keep_alive_s=settings.get_float("http_keep_alive_s", d.keep_alive_s),
            max_connections=settings.get_int("http_max_connections", d.max_connections),
            max_header_bytes=settings.get_int("http_max_header_bytes", d.max_header_bytes),
        )


class HeaderBlockTooLarge(ValueError):
    """Raised inside the parser's callbacks: httptools turns it into a parse error, which the
    guarded protocol answers with 431."""


def guarded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol (C parser: about half the CPU per request of the pure-Python
    h11 one, which counts where kube-scheduler calls the extender three times per pod) with what
    it lacks: a deadline for reading a request (uvicorn's keep-alive timer only starts after a
    first response, so a client that connects and sends nothing, or trickles its headers, was
    held forever), a cap on the header block while it arrives, and a cap on open connections."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _read_timer: asyncio.TimerHandle | None = None
        _header_bytes = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                log.warning("connection limit reached", extra={"limit": limits.max_connections})
                transport.close()
                return
            self._arm_read_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_read_timer()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._header_bytes = 0

        def on_url(self, url: bytes) -> None:
            self._count_header_bytes(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_header_bytes(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_message_complete(self) -> None:
            self._disarm_read_timer()  # the whole request is in
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_read_timer()

        def _count_header_bytes(self, size: int) -> None:
            self._header_bytes += size
            if self._header_bytes > limits.max_header_bytes:
                raise HeaderBlockTooLarge(f"request headers over {limits.max_header_bytes} bytes")

        def send_400_response(self, msg: str) -> None:
            # uvicorn's answer to any parse error; a header block over the cap gets 431
            if self._header_bytes <= limits.max_header_bytes:
                super().send_400_response(msg)
                return
            body = orjson.dumps({"error": f"request headers over {limits.max_header_bytes} bytes"})
            head = [b"HTTP/1.1 431 Request Header Fields Too Large"]
            head += [k + b": " + v for k, v in SECURITY_HEADERS]
            head += [b"content-type: application/json", b"content-length: %d" % len(body)]
            head += [b"connection: close", b"", b""]
            self.transport.write(b"\r\n".join(head) + body)
            self.transport.close()

        def _arm_read_timer(self) -> None:
            self._disarm_read_timer()
            self._read_timer = self.loop.call_later(limits.header_timeout_s, self._read_timeout)

        def _disarm_read_timer(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None

        def _read_timeout(self) -> None:
            # armed at connect and after each response, disarmed once a request is fully read
            self._read_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return GuardedHttpToolsProtocol


def uvicorn_config(app: ASGIApp, settings: ServiceSettings) -> uvicorn.Config:
    limits = ConnectionLimits.from_settings(settings)
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=3,
        http=guarded_protocol(limits),
        timeout_keep_alive=int(max(1, limits.keep_alive_s)),
        # uvicorn answers 503 once connections or requests in flight reach this; the protocol
        # above has already closed connections beyond max_connections
        limit_concurrency=limits.max_connections + 1,
    )


def serve_http(app: ASGIApp, settings: ServiceSettings) -> None:
    """Run under uvicorn until SIGTERM/SIGINT; uvicorn drains connections and runs the lifespan."""
    settings.ensure_dirs()
    config = uvicorn_config(app, settings)
    frozen = freeze_startup_objects()
    log.info(
        "serving",
        extra={"address": f"http://{settings.host}:{settings.port}", "frozen_objects": frozen},
    )
    uvicorn.Server(config).run()
