"""The one server interceptor: API token check, domain-error mapping and RPC metrics.

Mutating RPCs (by verb) need ``authorization: Bearer <token>`` (or ``x-api-token``) when
PARFUSION_API_TOKEN is set. Domain errors become their status code; anything unexpected is
logged and answered INTERNAL, never a hung call.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from prometheus_client import Counter, Histogram

from services.common.errors import DomainError

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


def is_mutating(method: str) -> bool:
    return method.startswith(MUTATING_VERBS)


def token_from_metadata(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if (
            key == "authorization"
            and isinstance(value, str)
            and value.lower().startswith("bearer ")
        ):
            return value[7:].strip()
        if key == "x-api-token":
            return str(value)
    return None


def _split(full_method: str) -> tuple[str, str]:
    _, service, method = full_method.split("/", 2)
    return service.rsplit(".", 1)[-1], method


class ServiceInterceptor(grpc.ServerInterceptor):
    def __init__(self, api_token: str | None = None) -> None:
        self._token = api_token

    def intercept_service(self, continuation: Callable[..., Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        full = details.method
        if full.startswith("/grpc."):
            return handler
        service, method = _split(full)
        if self._token and is_mutating(method):
            given = token_from_metadata(details.invocation_metadata)
            if given is None or not hmac.compare_digest(given, self._token):
                return _deny(
                    handler, f"{method} needs a valid API token (authorization: Bearer ...)"
                )
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(handler.unary_unary, service, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(handler.unary_stream, service, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    @staticmethod
    def _wrap_unary(fn: Callable[..., Any], service: str, method: str) -> Callable[..., Any]:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            start = time.perf_counter()
            code = "OK"
            try:
                return fn(request, context)
            except DomainError as exc:
                code = exc.code.name
                context.abort(exc.code, exc.message)
            except Exception as exc:
                # abort() raises an Exception subclass too: keep the code it set.
                if context.code() is not None:
                    code = context.code().name
                    raise
                code = "INTERNAL"
                log.exception("unhandled error", extra={"method": method})
                context.abort(
                    grpc.StatusCode.INTERNAL, f"{method}: internal error: {type(exc).__name__}"
                )
            finally:
                RPC_TOTAL.labels(service, method, code).inc()
                RPC_SECONDS.labels(service, method).observe(time.perf_counter() - start)

        return call

    @staticmethod
    def _wrap_stream(fn: Callable[..., Any], service: str, method: str) -> Callable[..., Any]:
        def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            start = time.perf_counter()
            code = "OK"
            try:
                yield from fn(request, context)
            except DomainError as exc:
                code = exc.code.name
                context.abort(exc.code, exc.message)
            except Exception:
                if context.code() is not None:
                    code = context.code().name
                    raise
                code = "INTERNAL"
                log.exception("unhandled stream error", extra={"method": method})
                context.abort(grpc.StatusCode.INTERNAL, f"{method}: internal error")
            finally:
                RPC_TOTAL.labels(service, method, code).inc()
                RPC_SECONDS.labels(service, method).observe(time.perf_counter() - start)

        return call


def _deny(handler: Any, message: str) -> Any:
    def abort(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(
            abort,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return grpc.unary_unary_rpc_method_handler(
        abort,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
