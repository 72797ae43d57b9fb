"""Client side of the services: channels with the API token attached, calls with deadlines, backoff."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 2.0
TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class _TokenAuth(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self._token = token

    def _details(self, details: Any) -> Any:
        metadata = list(details.metadata or []) + [("authorization", f"Bearer {self._token}")]
        return (
            details._replace(metadata=metadata)
            if hasattr(details, "_replace")
            else _Details(details, metadata)
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)


class _Details(grpc.ClientCallDetails):
    def __init__(self, base: Any, metadata: list[tuple[str, str]]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


def channel(
    address: str, token: str | None = None, *, max_reconnect_backoff_s: float | None = None
) -> grpc.Channel:
    """Insecure channel on loopback; the API token (arg or PARFUSION_API_TOKEN) rides every call.
    ``max_reconnect_backoff_s`` caps gRPC's reconnect backoff (default up to 120 s) for a
    client that must notice promptly that its peer is back."""
    options: list[tuple[str, int]] = [("grpc.enable_retries", 0)]
    if max_reconnect_backoff_s is not None:
        backoff_ms = int(max_reconnect_backoff_s * 1000)
        options += [
            ("grpc.max_reconnect_backoff_ms", backoff_ms),
            ("grpc.initial_reconnect_backoff_ms", min(1000, backoff_ms)),
            ("grpc.min_reconnect_backoff_ms", min(1000, backoff_ms)),
        ]
    ch = grpc.insecure_channel(address, options=options)
    token = token if token is not None else os.environ.get("PARFUSION_API_TOKEN") or None
    return grpc.intercept_channel(ch, _TokenAuth(token)) if token else ch


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, grpc.RpcError) and exc.code() in TRANSIENT  # type: ignore[attr-defined]


def call_with_backoff(fn: Callable[[], T], *, total_s: float = 5.0) -> T:
    """Retry a call on UNAVAILABLE / DEADLINE_EXCEEDED with exponential backoff, up to total_s."""
    wrapped = retry(
        retry=retry_if_exception(is_transient),
        wait=wait_exponential(multiplier=0.05, max=1.0),
        stop=stop_after_delay(total_s),
        reraise=True,
    )(fn)
    return wrapped()
