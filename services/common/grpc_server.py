"""The one gRPC server bootstrap: health, reflection, metrics endpoint, interceptor, graceful stop.

Every gRPC service's ``server.py`` builds its servicers and calls :func:`start_grpc_server`
(tests, in-process) or :func:`serve_forever` (``main()``, with SIGTERM/SIGINT drain).

The server is grpc.aio's, on an asyncio loop of its own thread, behind the same blocking API
(``RunningServer``) for its callers. A servicer method written ``async def`` runs on that loop
and holds no thread while it waits (SubmitIntent waiting for its commit, WatchPlans waiting for
the next plan); a plain method runs in the server's thread pool, as it would in a threaded
server, so it may block. With threads only, every open stream and every call waiting for a
commit held one of the pool's threads: a few streams could leave no thread for anything else.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable, Coroutine, Iterable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, make_server

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Histogram, generate_latest
from prometheus_client.exposition import ThreadingWSGIServer

from services.common.config import ServiceSettings
from services.common.interceptors import ServiceInterceptor
from services.common.malloc import FlushPoint, active_malloc
from services.common.memory import freeze_startup_objects

log = logging.getLogger(__name__)

# (add_XServicer_to_server, servicer, full service name from the generated DESCRIPTOR)
Registration = tuple[Callable[[Any, Any], None], Any, str]
T = TypeVar("T")
LOOP_CALL_TIMEOUT_S = 30.0  # start, health changes: far longer than any of them takes
LAG_PROBE_S = 0.05  # how often the event loop's lag is sampled

LOOP_LAG_SECONDS = Histogram(
    "parfusion_event_loop_lag_seconds",
    "How late the gRPC server's event loop ran a timer that was due, sampled every 50 ms: a "
    "call served on the loop waits about as long to start (the loop busy, its thread waiting "
    "for the interpreter lock or for a core)",
    buckets=(
        0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
        2.5,
    ),
)  # fmt: skip


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    service_names: list[str]
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    pool: futures.ThreadPoolExecutor
    metrics_port: int | None = None
    metrics_server: Any = None
    _on_stop: list[Callable[[], None]] = field(default_factory=list)
    _on_drain: list[Callable[[], None]] = field(default_factory=list)
    _stopped: threading.Event = field(default_factory=threading.Event)
    _stop_lock: threading.Lock = field(default_factory=threading.Lock)

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

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = LOOP_CALL_TIMEOUT_S) -> T:
        """Run a coroutine on the server's loop from another thread and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def enter_graceful_shutdown(self) -> None:
        """Health NOT_SERVING for every service (new Checks and Watches see it at once)."""
        self.call(self.health.enter_graceful_shutdown())

    def stop(self, grace: float = 2.0) -> None:
        with self._stop_lock:
            if self._stopped.is_set():
                return
            try:
                self.enter_graceful_shutdown()
                for fn in self._on_drain:
                    try:
                        fn()
                    except Exception:
                        log.exception("drain hook failed")
                self.call(self.server.stop(grace), timeout=grace + LOOP_CALL_TIMEOUT_S)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.thread.join(timeout=LOOP_CALL_TIMEOUT_S)
                self.pool.shutdown(wait=False, cancel_futures=True)
                self._stopped.set()
            for fn in reversed(self._on_stop):
                try:
                    fn()
                except Exception:
                    log.exception("shutdown hook failed")
            if self.metrics_server is not None:
                self.metrics_server.shutdown()

    def wait(self) -> None:
        """Block until ``stop`` has stopped the server."""
        self._stopped.wait()


# Exposition text appended to the registry's on /metrics: series a service renders itself
# because there are thousands (the allocator's per-intent gauges; prometheus_client formats
# each sample in Python, about 9 µs a sample, and a scrape holds the interpreter lock)
TEXT_SECTIONS: list[Callable[[], bytes]] = []


def metrics_text() -> bytes:
    """What /metrics answers: the registry's exposition, then every text section."""
    return generate_latest(REGISTRY) + b"".join(section() for section in TEXT_SECTIONS)


def _metrics_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found; metrics are at /metrics\n"]
    body = metrics_text()
    start_response(
        "200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(body)))]
    )
    return [body]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        pass  # a scrape every few seconds is not news


def start_metrics_server(port: int, host: str) -> ThreadingWSGIServer:
    """The Prometheus text endpoint on its own port, served from a daemon thread."""
    httpd = make_server(host, port, _metrics_app, ThreadingWSGIServer, handler_class=_QuietHandler)
    threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True).start()
    return httpd


def start_grpc_server(
    registrations: Iterable[Registration],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    metrics_port: int | None = None,
    api_token: str | None = None,
    max_workers: int = 16,
) -> RunningServer:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=_run_loop, args=(loop,), name="grpc-loop", daemon=True)
    thread.start()
    pool = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc")
    try:
        server, bound, health_servicer, names = asyncio.run_coroutine_threadsafe(
            _start(list(registrations), host, port, api_token, pool), loop
        ).result(LOOP_CALL_TIMEOUT_S)
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=LOOP_CALL_TIMEOUT_S)
        pool.shutdown(wait=False)
        raise
    running = RunningServer(
        server=server,
        port=bound,
        health=health_servicer,
        service_names=names,
        loop=loop,
        thread=thread,
        pool=pool,
    )
    if metrics_port is not None:
        try:
            httpd = start_metrics_server(metrics_port, host)
        except BaseException:
            running.stop(0)
            raise
        running.metrics_server = httpd
        running.metrics_port = httpd.server_address[1]
    return running


def _probe_lag(loop: asyncio.AbstractEventLoop, due: float, flush: FlushPoint) -> None:
    """One lag sample, and the next probe's timer (a plain timer, not a task: nothing is left
    pending when the loop closes); the loop thread's malloc cache emptied when asked."""
    now = loop.time()
    LOOP_LAG_SECONDS.observe(max(now - due, 0.0))
    flush()
    due = now + LAG_PROBE_S
    loop.call_at(due, _probe_lag, loop, due, flush)


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


async def _start(
    registrations: list[Registration],
    host: str,
    port: int,
    api_token: str | None,
    pool: futures.ThreadPoolExecutor,
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer, list[str]]:
    server = grpc.aio.server(
        pool,  # where grpc.aio itself runs any plain handler the interceptor leaves as it is
        interceptors=[ServiceInterceptor(api_token, pool)],
        options=[("grpc.so_reuseport", 0)],
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names: list[str] = []
    for add, servicer, name in registrations:
        add(servicer, server)
        names.append(name)
    reflection.enable_server_reflection(
        [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as exc:  # grpc.aio's way of saying the address is taken or invalid
        raise OSError(f"cannot bind gRPC server to {host}:{port}: {exc}") from None
    if bound == 0:
        raise OSError(f"cannot bind gRPC server to {host}:{port}")
    await server.start()
    loop = asyncio.get_running_loop()
    due = loop.time() + LAG_PROBE_S
    loop.call_at(due, _probe_lag, loop, due, FlushPoint())
    for name in [*names, ""]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, bound, health_servicer, names


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
            "frozen_objects": freeze_startup_objects(),
            "malloc": active_malloc(),  # jemalloc where preloaded (common/malloc.py)
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
