"""The one gRPC server bootstrap: health, reflection, metrics endpoint, interceptor, graceful stop.

Every gRPC service's ``server.py`` builds its servicers and calls :func:`start_grpc_server`
(tests, in-process) or :func:`serve_forever` (``main()``, with SIGTERM/SIGINT drain).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from services.common.config import ServiceSettings
from services.common.interceptors import ServiceInterceptor

log = logging.getLogger(__name__)

# (add_XServicer_to_server, servicer, full service name from the generated DESCRIPTOR)
Registration = tuple[Callable[[Any, grpc.Server], None], Any, str]


@dataclass
class RunningServer:
    server: grpc.Server
    port: int
    health: health.HealthServicer
    service_names: list[str]
    metrics_port: int | None = None
    metrics_server: Any = None
    _on_stop: list[Callable[[], None]] = field(default_factory=list)
    _on_drain: list[Callable[[], None]] = field(default_factory=list)
    _stopped: threading.Event = field(default_factory=threading.Event)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def on_stop(self, fn: Callable[[], None]) -> None:
        """Run after the server stopped (close stores, stop worker pools)."""
        self._on_stop.append(fn)

    def on_drain(self, fn: Callable[[], None]) -> None:
        """Run after health turned NOT_SERVING and before the server stops: end open streams
        cleanly here, so they finish with OK instead of being cancelled by ``server.stop``."""
        self._on_drain.append(fn)

    def stop(self, grace: float = 2.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        for fn in self._on_drain:
            try:
                fn()
            except Exception:
                log.exception("drain hook failed")
        self.server.stop(grace).wait(grace + 1)
        for fn in reversed(self._on_stop):
            try:
                fn()
            except Exception:
                log.exception("shutdown hook failed")
        if self.metrics_server is not None:
            self.metrics_server.shutdown()

    def wait(self) -> None:
        self.server.wait_for_termination()


def start_grpc_server(
    registrations: Iterable[Registration],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    metrics_port: int | None = None,
    api_token: str | None = None,
    max_workers: int = 16,
) -> RunningServer:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        interceptors=[ServiceInterceptor(api_token)],
        options=[("grpc.so_reuseport", 0)],
    )
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names: list[str] = []
    for add, servicer, name in registrations:
        add(servicer, server)
        names.append(name)
    reflection.enable_server_reflection(
        [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind gRPC server to {host}:{port}")
    server.start()
    for name in [*names, ""]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    running = RunningServer(server=server, port=bound, health=health_servicer, service_names=names)
    if metrics_port is not None:
        httpd, _thread = start_http_server(metrics_port, addr=host)
        running.metrics_server = httpd
        running.metrics_port = httpd.server_address[1]
    return running


def serve_forever(
    settings: ServiceSettings,
    build: Callable[[ServiceSettings], tuple[list[Registration], list[Callable[[], None]]]],
) -> None:
    """Run until SIGTERM/SIGINT, then drain: health NOT_SERVING, stop accepting, run stop hooks."""
    settings.ensure_dirs()
    registrations, stop_hooks = build(settings)
    running = start_grpc_server(
        registrations,
        host=settings.host,
        port=settings.port,
        metrics_port=settings.metrics_port,
        api_token=settings.api_token,
    )
    for hook in stop_hooks:
        running.on_stop(hook)
    log.info(
        "serving",
        extra={
            "address": f"{settings.host}:{running.port}",
            "metrics_port": running.metrics_port,
            "services": ",".join(running.service_names),
        },
    )
    wait_for_shutdown_signal()
    running.stop(grace=2.0)
    log.info("stopped")


def wait_for_shutdown_signal() -> None:
    """Block the main thread until SIGTERM or SIGINT."""
    done = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        log.info("shutting down", extra={"signal": signal.Signals(signum).name})
        done.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    done.wait()
