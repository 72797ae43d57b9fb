"""Shared pieces of the HTTP services (extender, bridge, dashboard): /metrics, /healthz, token
middleware, security headers, bounded JSON bodies and the uvicorn runner (graceful shutdown,
header-read and keep-alive timeouts, a connection limit)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import h11
import orjson
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from services.common.config import ServiceSettings
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
        if (
            self.token
            and scope["type"] == "http"
            and scope["method"] in MUTATING_METHODS
            and not token_matches(presented_header_token(scope.get("headers", [])), self.token)
        ):
            response = JSONResponse({"error": "missing or invalid API token"}, status_code=401)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


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
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > max_bytes:
                raise HttpError(413, f"request body over {max_bytes} bytes")
        except ValueError as exc:
            raise HttpError(400, "invalid Content-Length") from exc
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise HttpError(413, f"request body over {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


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


def guarded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with what it lacks: a deadline for reading a request (uvicorn's
    keep-alive timer only starts after a first response, so a client that connects and sends
    nothing, or trickles its headers, was held forever) and a cap on open connections."""

    class GuardedH11Protocol(H11Protocol):
        _read_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                log.warning("connection limit reached", extra={"limit": limits.max_connections})
                transport.close()
                return
            self._arm_read_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_read_timer()

        def _arm_read_timer(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
            self._read_timer = self.loop.call_later(limits.header_timeout_s, self._read_timeout)

        def _read_timeout(self) -> None:
            self._read_timer = None
            if self.transport.is_closing():
                return
            # the request is still being read (no full request since the timer was armed)
            if self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
                self.transport.close()

    return GuardedH11Protocol


class HeaderLimitMiddleware:
    """431 for a request whose headers total more than the limit. h11's own limit only bounds
    headers still being received, not a block that arrived whole."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = len(scope.get("raw_path", b"")) + len(scope.get("query_string", b""))
            size += sum(len(k) + len(v) + 4 for k, v in scope.get("headers", []))
            if size > self.max_bytes:
                response = JSONResponse(
                    {"error": f"request headers over {self.max_bytes} bytes"}, status_code=431
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def uvicorn_config(app: ASGIApp, settings: ServiceSettings) -> uvicorn.Config:
    limits = ConnectionLimits.from_settings(settings)
    return uvicorn.Config(
        HeaderLimitMiddleware(app, limits.max_header_bytes),
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
        h11_max_incomplete_event_size=limits.max_header_bytes,
    )


def serve_http(app: ASGIApp, settings: ServiceSettings) -> None:
    """Run under uvicorn until SIGTERM/SIGINT; uvicorn drains connections and runs the lifespan."""
    settings.ensure_dirs()
    log.info("serving", extra={"address": f"http://{settings.host}:{settings.port}"})
    uvicorn.Server(uvicorn_config(app, settings)).run()
