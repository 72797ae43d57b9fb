"""Shared pieces of the HTTP services (extender, bridge, dashboard): /metrics, /healthz, token
middleware, bounded JSON bodies and the uvicorn runner with graceful shutdown."""

from __future__ import annotations

import hmac
import logging
from typing import Any

import orjson
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from services.common.config import ServiceSettings

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
    """When an API token is configured, mutating requests without it get 401 with a JSON body."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token and scope["type"] == "http" and scope["method"] in MUTATING_METHODS:
            headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
            given = headers.get("x-api-token")
            auth = headers.get("authorization", "")
            if given is None and auth.lower().startswith("bearer "):
                given = auth[7:].strip()
            if given is None or not hmac.compare_digest(given, self.token):
                response = JSONResponse({"error": "missing or invalid API token"}, status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


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


def serve_http(app: ASGIApp, settings: ServiceSettings) -> None:
    """Run under uvicorn until SIGTERM/SIGINT; uvicorn drains connections and runs the lifespan."""
    settings.ensure_dirs()
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=3,
    )
    log.info("serving", extra={"address": f"http://{settings.host}:{settings.port}"})
    uvicorn.Server(config).run()
