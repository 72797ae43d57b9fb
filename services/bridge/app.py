"""HTTP face of the robot bridge (Starlette): wiring only; the loop lives in controller.py.

Routes: POST /api/mission (DELETE to cancel), POST /api/urgent, POST /api/tick, GET /api/state,
GET /metrics, GET /healthz. The lifespan restores a mission from its checkpoint, starts the ROS 2
adapter and, when ``bridge.background_ticker`` is true, a ticker that runs one control tick every
``bridge.tick_ms``. Without the ticker the robot moves only on POST /api/tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from services.bridge.allocator_client import AllocatorClient, UrgentIntentTemplate
from services.bridge.checkpoint import CheckpointStore
from services.bridge.controller import RobotBridge
from services.bridge.metrics import BridgeMetrics
from services.bridge.ros2 import BridgeCommands, Ros2Adapter
from services.bridge.statemachine import IllegalTransition
from services.bridge.validation import parse_mission, parse_tick, parse_urgent
from services.common.config import ServiceSettings, parse_service_args, resolve_path
from services.common.errors import DomainError
from services.common.http import (
    HttpError,
    SecurityHeadersMiddleware,
    TokenMiddleware,
    error_response,
    healthz_route,
    metrics_route,
    read_json_object,
    serve_http,
)
from services.common.logs import configure_logging

log = logging.getLogger(__name__)


def build_bridge(settings: ServiceSettings, clock: Callable[[], float] = time.time) -> RobotBridge:
    """The controller and its ports from settings; nothing is read or started yet."""
    checkpoint = settings.get_str("checkpoint_path", "")
    path = (
        resolve_path(checkpoint) if checkpoint else settings.run_dir / "bridge" / "checkpoint.json"
    )
    address = settings.get_str("allocator_address", "")
    allocator = None
    if address:
        allocator = AllocatorClient(
            address,
            token=settings.api_token,
            timeout_s=settings.get_float("allocator_timeout_ms", 500.0) / 1000.0,
            retry_s=settings.get_float("allocator_retry_ms", 1000.0) / 1000.0,
            template=UrgentIntentTemplate(
                priority=settings.get_int("urgent_priority", 1000),
                preferred_workers=settings.get_int("urgent_workers", 2),
                gpu_lane=settings.get_str("urgent_gpu_lane", "urgent"),
                gpu_share=settings.get_float("urgent_gpu_share", 0.5),
            ),
        )
    return RobotBridge(
        store=CheckpointStore(path),
        metrics=BridgeMetrics(CollectorRegistry()),
        allocator=allocator,
        tick_s=settings.get_float("tick_ms", 200.0) / 1000.0,
        queue_limit=settings.get_int("urgent_queue_limit", 64),
        clock=clock,
    )


def create_app(settings: ServiceSettings, *, clock: Callable[[], float] = time.time) -> Starlette:
    bridge = build_bridge(settings, clock)
    background = settings.get_bool("background_ticker", False)
    max_body = settings.get_int("max_body_bytes", 65536)
    safe_point_default = settings.get_int("safe_point_interval", 5)
    mission_count = 0

    def state_view() -> dict[str, Any]:
        view = bridge.snapshot()
        mission = view["mission"] or {}
        summary = {
            "mode": ros2.mode,
            "mission_step": mission.get("step"),
            "mission_steps": (mission.get("spec") or {}).get("steps"),
            "checkpoint_step": mission.get("checkpoint_step"),
            "steps_redone": mission.get("steps_redone"),
            "urgent_queued": len(view["urgent"]["queue"]),
            "urgent_active": (view["urgent"]["active"] or {}).get("spec", {}).get("name"),
            "allocator_reachable": view["allocator"]["reachable"],
            "background_ticker": background,
        }
        return {
            "state": view["state"],
            **summary,
            **{k: v for k, v in view.items() if k != "state"},
            "ros2": ros2.status(),
        }

    # One body per request, whether it came over HTTP or as a ROS 2 service call.
    def start_mission(body: dict[str, Any]) -> dict[str, Any]:
        nonlocal mission_count
        spec = parse_mission(
            body,
            default_safe_point_interval=safe_point_default,
            default_name=f"mission-{mission_count + 1}",
        )
        started = bridge.start_mission(spec)
        mission_count += 1
        return {"mission_id": started.id, **state_view()}

    def cancel_mission() -> dict[str, Any]:
        return {"cancelled": bridge.cancel_mission().id, **state_view()}

    def tick_once() -> dict[str, Any]:
        bridge.tick()
        return state_view()

    def submit_urgent(body: dict[str, Any], source: str = "http") -> dict[str, Any]:
        event = bridge.submit_urgent(parse_urgent(body), source=source)
        return {"urgent_id": event.id, **state_view()}

    ros2 = Ros2Adapter(
        settings.get_str("ros2", "auto"),
        BridgeCommands(
            submit_urgent=lambda body: submit_urgent(body, "ros2"),
            start_mission=lambda body: _reply(lambda: start_mission(body)),
            cancel_mission=lambda: _reply(cancel_mission),
            tick=lambda: _reply(tick_once),
            state_view=state_view,
        ),
        discovery_range=settings.get_str("ros2_discovery_range", "LOCALHOST"),
        mission_defaults={"safe_point_interval": safe_point_default},
    )
    bridge.subscribe(ros2.publish)

    async def mission(request: Request) -> JSONResponse:
        if request.method == "DELETE":
            return JSONResponse(await run_in_threadpool(cancel_mission))
        body = await read_json_object(request, max_body)
        return JSONResponse(await run_in_threadpool(start_mission, body), status_code=201)

    async def urgent(request: Request) -> JSONResponse:
        body = await read_json_object(request, max_body)
        return JSONResponse(await run_in_threadpool(submit_urgent, body), status_code=202)

    async def tick(request: Request) -> JSONResponse:
        # an empty POST (curl -X POST, the dashboard's guided demo) is one tick
        has_body = (
            request.headers.get("content-length", "0") != "0"
            or "transfer-encoding" in request.headers
        )
        count = parse_tick(await read_json_object(request, max_body)) if has_body else 1
        await run_in_threadpool(bridge.tick, count)
        return JSONResponse(await run_in_threadpool(state_view))

    async def state(_request: Request) -> JSONResponse:
        return JSONResponse(await run_in_threadpool(state_view))

    async def ticker() -> None:
        period = bridge.tick_s
        while True:
            started = time.monotonic()
            try:
                await run_in_threadpool(bridge.tick)
            except Exception:
                log.exception("background tick failed")
            await asyncio.sleep(max(0.0, period - (time.monotonic() - started)))

    cleanup_s = settings.get_float("allocator_cleanup_ms", 500.0) / 1000.0

    async def cleaner() -> None:
        """URGENT intents left at the allocator by a failed delete go as soon as it answers
        again, ticker or not (a manual-tick bridge may not tick for a long time)."""
        while True:
            await asyncio.sleep(cleanup_s)
            if bridge.undeleted:
                try:
                    await run_in_threadpool(bridge.clean_up_leftovers)
                except Exception:
                    log.exception("left-over intent clean-up failed")

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        restored = await run_in_threadpool(bridge.restore)
        if restored:
            log.info("checkpoint restored", extra={"state": bridge.machine.state.value})
        ros2.start()
        tasks = [asyncio.create_task(cleaner())]
        if background:
            tasks.append(asyncio.create_task(ticker()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            ros2.stop()
            if bridge.allocator is not None and hasattr(bridge.allocator, "close"):
                bridge.allocator.close()

    app = Starlette(
        routes=[
            Route("/api/mission", mission, methods=["POST", "DELETE"]),
            Route("/api/urgent", urgent, methods=["POST"]),
            Route("/api/tick", tick, methods=["POST"]),
            Route("/api/state", state, methods=["GET"]),
            metrics_route(bridge.metrics.registry),
            healthz_route(),
        ],
        middleware=[
            Middleware(SecurityHeadersMiddleware),
            Middleware(TokenMiddleware, token=settings.api_token),
        ],
        exception_handlers={HttpError: _http_error, DomainError: _domain_error},  # type: ignore[dict-item]
        lifespan=lifespan,
    )
    app.state.bridge = bridge
    app.state.ros2 = ros2
    return app


async def _http_error(_request: Request, exc: HttpError) -> JSONResponse:
    return error_response(exc)


def _reply(action: Callable[[], dict[str, Any]]) -> tuple[bool, dict[str, Any]]:
    """A ROS 2 Trigger answer: the HTTP route's document, or its error body."""
    try:
        return True, action()
    except DomainError as exc:
        return False, _as_http_error(exc).body()


def _as_http_error(exc: DomainError) -> HttpError:
    if isinstance(exc, IllegalTransition):
        return HttpError(409, str(exc), state=exc.state.value, event=exc.event.value)
    field = exc.field
    message = str(exc).removeprefix(f"{field}: ") if field else str(exc)
    return HttpError(exc.http_status, message, field=field)


async def _domain_error(_request: Request, exc: DomainError) -> JSONResponse:
    return error_response(_as_http_error(exc))


def main(argv: list[str] | None = None) -> None:
    settings, _ = parse_service_args("bridge", argv)
    configure_logging(settings.log_level, settings.log_format, "bridge")
    serve_http(create_app(settings), settings)
