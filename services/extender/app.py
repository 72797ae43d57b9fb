"""The extender's HTTP app: kube-scheduler's /filter /prioritize /bind /preempt plus /state,
/metrics and /healthz. Wiring only; the decisions live in verbs.py and scoring.py.

Bad bodies (malformed JSON, wrong shape, missing Pod) get 400 with ``{"error", "field"}``;
bodies over ``max_body_bytes`` get 413. kube-scheduler treats any non-200 as an error for the
pod, which is what a malformed call deserves. Filter and prioritize run on the event loop
(they are CPU-only and take milliseconds); bind with API access waits on the API server, so it
runs in a thread of its own pool (standalone, it only updates the view, on the loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio.to_thread
import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from services.common.config import ConfigError, ServiceSettings, parse_service_args
from services.common.http import (
    HttpError,
    PostEndpoints,
    PostHandler,
    SecurityHeadersMiddleware,
    TokenMiddleware,
    healthz_route,
    metrics_route,
    serve_http,
)
from services.common.logs import configure_logging
from services.core.model import DmugConfig

from . import protocol
from .kubeapi import connect
from .metrics import ExtenderMetrics
from .nodestates import NodeStateCache
from .nodeview import ClusterView
from .protocol import ProtocolError
from .samples import sample_node_objects
from .scoring import DEFAULT_SHORTLIST, ScoringConfig
from .telemetry import TelemetryPoller, TelemetrySource
from .verbs import Extender

log = logging.getLogger(__name__)

MAX_SHORTLIST = 100_000  # kube-scheduler sends at most every node; more would mean every one


def build_extender(settings: ServiceSettings) -> Extender:
    shortlist = settings.get_int("shortlist_nodes", DEFAULT_SHORTLIST)
    if not 0 <= shortlist <= MAX_SHORTLIST:
        raise ConfigError(f"extender.shortlist_nodes: expected 0..{MAX_SHORTLIST}, got {shortlist}")
    config = ScoringConfig(
        dmug=DmugConfig(risk_threshold=settings.get_float("risk_threshold", 0.5)),
        shortlist=shortlist,
    )
    view = ClusterView(dmug=config.dmug)
    if settings.get_bool("sample_nodes", False):
        view.learn(
            [protocol.NodeHead(**_head_fields(n)) for n in sample_node_objects()], source="sample"
        )
    api = connect(
        settings.get_str("kube_api", "standalone"),
        settings.get_str("kubeconfig", ""),
        settings.get_float("api_timeout_s", 5.0),
    )
    return Extender(view, config, api, ExtenderMetrics())


def _head_fields(node: dict[str, Any]) -> dict[str, Any]:
    import msgspec

    head = msgspec.json.decode(msgspec.json.encode(node), type=protocol.NodeHead)
    return {"metadata": head.metadata, "spec": head.spec, "status": head.status}


def create_app(settings: ServiceSettings, extender: Extender | None = None) -> PostEndpoints:
    ext = extender or build_extender(settings)
    max_bytes = settings.get_int("max_body_bytes", 16 << 20)
    metrics = ext.metrics
    # read at scrape time, so /metrics is current without any verb touching the gauges
    metrics.nodes.set_function(lambda: len(ext.view))
    metrics.telemetry_nodes.set_function(
        lambda: sum(1 for r in ext.view.snapshot().values() if r.telemetry_at is not None)
    )
    background: dict[str, Any] = {}
    # binds wait on the API server: threads of their own, as many as the API client's
    # connection pool holds (more would only queue for a connection)
    pool = ext.api.api_client.configuration.connection_pool_maxsize if ext.api else 1
    binder = ThreadPoolExecutor(max(1, pool), thread_name_prefix="extender-bind")

    def verb(
        name: str, decode: Callable[[bytes], Any], answer: Callable[[Any], Awaitable[bytes]]
    ) -> PostHandler:
        histogram = metrics.request_seconds.labels(name)
        counted = {code: metrics.requests.labels(name, str(code)) for code in (200, 400, 500)}

        async def handle(body: bytes) -> tuple[int, bytes]:
            started = time.perf_counter()
            try:
                code, payload = 200, await answer(decode(body))
            except ProtocolError as exc:
                code, payload = 400, orjson.dumps(HttpError(400, str(exc), field=exc.field).body())
            except HttpError as exc:
                code, payload = exc.status, orjson.dumps(exc.body())
            except Exception:
                log.exception("extender verb failed", extra={"verb": name})
                code, payload = 500, orjson.dumps({"error": f"internal error in /{name}"})
            histogram.observe(time.perf_counter() - started)
            (counted.get(code) or metrics.requests.labels(name, str(code))).inc()
            return code, payload

        return handle

    async def on_loop(result: bytes) -> bytes:
        return result

    async def filter_answer(args: protocol.ExtenderArgs) -> bytes:
        return ext.filter(args)

    async def prioritize_answer(args: protocol.ExtenderArgs) -> bytes:
        return ext.prioritize(args)

    async def bind_answer(args: protocol.ExtenderBindingArgs) -> bytes:
        if ext.api is None:  # standalone: the view only, nothing that blocks
            return ext.bind(args)
        return await asyncio.get_running_loop().run_in_executor(binder, ext.bind, args)

    async def preempt_answer(args: protocol.ExtenderPreemptionArgs) -> bytes:
        return ext.preempt(args)

    async def state(_request: Request) -> Response:
        body = ext.state()
        poller = background.get("poller")
        body["telemetry"] = (
            None
            if poller is None
            else {
                "sources": [s.allocator_address for s in poller.sources],
                "reachable": poller.reachable,
                "last_poll_at": poller.last_poll_at,
            }
        )
        cache = background.get("node_states")
        body["node_states"] = None if cache is None else cache.summary()
        return JSONResponse(body)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        if settings.get_bool("telemetry", True) and settings.get_str("allocator_address", ""):
            source = TelemetrySource(
                settings.get_str("allocator_address"),
                settings.get_str("gpulane_address", ""),
                timeout_s=settings.get_float("telemetry_timeout_s", 0.5),
                token=settings.api_token,
            )
            poller = TelemetryPoller(
                ext.view,
                [source],
                interval_s=settings.get_float("telemetry_interval_s", 2.0),
                stale_s=settings.get_float("telemetry_stale_s", 10.0),
            )
            poller.start()
            background["poller"] = poller
        cache = None
        if ext.api is not None:
            cache = NodeStateCache(
                ext,
                ext.api.api_client,
                stale_s=settings.get_float("node_state_stale_s", 30.0),
                timeout_s=settings.get_float("api_timeout_s", 5.0),
            )
            cache.start()
            background["node_states"] = cache
        try:
            yield
        finally:
            if cache is not None:
                await anyio.to_thread.run_sync(cache.stop)
            poller = background.pop("poller", None)
            if poller is not None:
                await anyio.to_thread.run_sync(poller.stop)
            binder.shutdown(wait=False)

    routes = [
        Route("/state", state, methods=["GET"]),
        metrics_route(metrics.registry),
        healthz_route(),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[
            Middleware(SecurityHeadersMiddleware),
            Middleware(TokenMiddleware, token=settings.api_token),
        ],
    )
    app.state.extender = ext
    app.state.background = background
    # the verbs skip Starlette's layers: kube-scheduler calls them three times per pod
    verbs = {
        "/filter": verb("filter", protocol.decode_extender_args, filter_answer),
        "/prioritize": verb("prioritize", protocol.decode_extender_args, prioritize_answer),
        "/bind": verb("bind", protocol.decode_binding_args, bind_answer),
        "/preempt": verb("preempt", protocol.decode_preemption_args, preempt_answer),
    }
    return PostEndpoints(app, verbs, settings.api_token, max_bytes)


def main(argv: list[str] | None = None) -> None:
    def extra(parser: Any) -> None:
        parser.add_argument(
            "--sample-nodes",
            action="store_true",
            help="add the packaged sample nodes to the node view (standalone demos only)",
        )

    settings, ns = parse_service_args("extender", argv, extra)
    if ns.sample_nodes:
        from dataclasses import replace

        settings = replace(settings, section={**settings.section, "sample_nodes": True})
    configure_logging(settings.log_level, settings.log_format, "extender")
    try:
        app = create_app(settings)
    except Exception as exc:  # bad kube_api / kubeconfig: say why and stop, no traceback
        log.error("extender cannot start", extra={"error": f"{type(exc).__name__}: {exc}"})
        raise SystemExit(2) from exc
    serve_http(app, settings)
