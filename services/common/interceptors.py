"""The one server interceptor: API token check, domain-error mapping and RPC metrics.

Mutating RPCs (by verb, or by a request flag such as ``GetNodeTelemetry{drain_samples}``)
need ``authorization: Bearer <token>`` (or ``x-api-token``) when PARFUSION_API_TOKEN is set.
Request bytes that are not a valid message are INVALID_ARGUMENT (logged once per method, at
INFO). Domain errors become their status code; anything unexpected is logged and answered
INTERNAL, never a hung call.

It runs on grpc.aio's loop (services/common/grpc_server.py). A servicer method written
``async def`` (or as an async generator) is awaited there; a plain method is called in the
server's thread pool, so it may block, with a ``ThreadContext`` whose ``abort`` works from that
thread. Either kind reports expected errors by raising DomainError.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

import grpc
from prometheus_client import Counter, Histogram

from services.common.errors import DomainError, InvalidArgument, Unauthenticated
from services.common.malloc import FlushPoint
from services.common.tokens import bearer, token_matches

log = logging.getLogger(__name__)

MUTATING_VERBS = (
    "Submit",
    "Delete",
    "Set",
    "Apply",
    "Inject",
    "Control",
    "Report",
    "Update",
    "Create",
)

RPC_TOTAL = Counter(
    "parfusion_grpc_requests_total",
    "gRPC requests handled, by method and status code",
    ["service", "method", "code"],
)
RPC_SECONDS = Histogram(
    "parfusion_grpc_request_duration_seconds",
    "gRPC request handling time (unary) or stream lifetime",
    ["service", "method"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)

# Reads that mutate when a flag of the request is set: draining the node agent's latency samples
# takes them away from the allocator's predictor.
MUTATING_FLAGS = {"GetNodeTelemetry": "drain_samples"}


def is_mutating(method: str) -> bool:
    return method.startswith(MUTATING_VERBS)


def token_from_metadata(metadata: Any) -> str | bytes | None:
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str) and bearer(value) is not None:
            return bearer(value)
        if key == "x-api-token":
            return value if isinstance(value, str | bytes) else None
    return None


class Malformed:
    """What the request deserializer yields for bytes that are not the method's message: the
    wrapped method answers INVALID_ARGUMENT instead of grpc's UNKNOWN with a traceback."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


_malformed_logged: set[str] = set()


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def decode(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # google.protobuf DecodeError, or anything a parser raises
            return Malformed(exc)

    return decode


def _check_request(method: str, request: Any, context: Any, token: str | None) -> None:
    """Raise the domain error a request earns before the method runs."""
    if isinstance(request, Malformed):
        if method not in _malformed_logged:  # once per method: a flood stays one line
            _malformed_logged.add(method)
            log.info(
                "malformed request bytes", extra={"method": method, "error": str(request.error)}
            )
        raise InvalidArgument(f"{method}: request bytes are not a valid message: {request.error}")
    flag = MUTATING_FLAGS.get(method)
    if token and flag and getattr(request, flag, False):
        given = token_from_metadata(context.invocation_metadata())
        if not token_matches(given, token):
            raise Unauthenticated(
                f"{method} with {flag} needs a valid API token (authorization: Bearer ...)"
            )


def _split(full_method: str) -> tuple[str, str]:
    _, service, method = full_method.split("/", 2)
    return service.rsplit(".", 1)[-1], method


class _AbortRequested(Exception):
    """Raised by ``ThreadContext.abort`` in a pool thread; answered on the loop."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class ThreadContext:
    """The context a plain servicer method gets in the thread pool: ``abort`` ends the method
    and answers the call with that status (the asyncio context's own ``abort`` is a coroutine,
    which a thread cannot await)."""

    __slots__ = ()

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _AbortRequested(code, details)


_THREAD_CONTEXT = ThreadContext()
_POOL_THREAD = threading.local()  # per pool worker: its FlushPoint


def _in_pool(fn: Callable[[Any, Any], Any], request: Any) -> Any:
    """A plain method in a pool worker; the worker's malloc cache emptied after it when asked
    (services/common/malloc.py: a worker may then wait idle for long)."""
    try:
        return fn(request, _THREAD_CONTEXT)
    finally:
        flush = getattr(_POOL_THREAD, "flush", None)
        if flush is None:
            flush = _POOL_THREAD.flush = FlushPoint()
        flush()


class _Outcome:
    """Around one call: maps what the method raised to the call's status (grpc's abort) and
    records the status code and duration in the RPC metrics."""

    __slots__ = ("code", "service", "method", "context", "start")

    def __init__(self, service: str, method: str, context: grpc.aio.ServicerContext) -> None:
        self.code = "OK"
        self.service, self.method, self.context = service, method, context
        self.start = 0.0

    async def __aenter__(self) -> None:
        self.start = time.perf_counter()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            if isinstance(exc, asyncio.CancelledError):
                self.code = "CANCELLED"
            elif isinstance(exc, Exception):
                await self._answer(exc)  # raises grpc's abort
        finally:
            RPC_TOTAL.labels(self.service, self.method, self.code).inc()
            RPC_SECONDS.labels(self.service, self.method).observe(time.perf_counter() - self.start)

    async def _answer(self, exc: Exception) -> None:
        context = self.context
        if isinstance(exc, grpc.aio.AbortError):  # the method aborted: its status stands
            code = context.code()
            self.code = code.name if code is not None else "UNKNOWN"
            return
        if isinstance(exc, _AbortRequested):
            self.code = exc.code.name
            await context.abort(exc.code, exc.details)
        if isinstance(exc, DomainError):
            self.code = exc.code
            await context.abort(grpc.StatusCode[exc.code], exc.message)
        self.code = "INTERNAL"
        log.exception("unhandled error", extra={"method": self.method}, exc_info=exc)
        await context.abort(
            grpc.StatusCode.INTERNAL, f"{self.method}: internal error: {type(exc).__name__}"
        )


class ServiceInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, api_token: str | None, pool: Executor) -> None:
        self._token = api_token
        self._pool = pool
        # per full method name, built once: the wrapped handler and the method's short name
        self._wrapped: dict[str, tuple[Any, str]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        full = details.method
        known = self._wrapped.get(full)
        if known is None:
            handler = await continuation(details)
            if handler is None or full.startswith("/grpc."):
                return handler
            service, method = _split(full)
            known = self._wrapped[full] = (self._wrap(handler, service, method), method)
        wrapped, method = known
        if self._token and is_mutating(method):
            given = token_from_metadata(details.invocation_metadata)
            if not token_matches(given, self._token):
                return _deny(
                    wrapped, f"{method} needs a valid API token (authorization: Bearer ...)"
                )
        return wrapped

    def _wrap(self, handler: grpc.RpcMethodHandler, service: str, method: str) -> Any:
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(handler.unary_unary, service, method),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            if not inspect.isasyncgenfunction(handler.unary_stream):
                raise TypeError(f"{method}: a streaming method must be an async generator")
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream, service, method, self._token),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        return handler

    def _wrap_unary(self, fn: Callable[..., Any], service: str, method: str) -> Any:
        pool = self._pool
        if inspect.iscoroutinefunction(fn):
            run: Callable[[Any, Any], Awaitable[Any]] = fn
        else:

            def run(request: Any, context: Any) -> Awaitable[Any]:
                return asyncio.get_running_loop().run_in_executor(pool, _in_pool, fn, request)

        token = self._token

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with _Outcome(service, method, context):
                _check_request(method, request, context, token)
                return await run(request, context)

        return call


def _wrap_stream(
    fn: Callable[..., AsyncIterator[Any]], service: str, method: str, token: str | None
) -> Any:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async with _Outcome(service, method, context):
            _check_request(method, request, context, token)
            async for reply in fn(request, context):
                yield reply

    return call


def _deny(handler: grpc.RpcMethodHandler, message: str) -> Any:
    async def abort(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def abort_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # an async generator, as the method it stands for

    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(
            abort_stream,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return grpc.unary_unary_rpc_method_handler(
        abort,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
