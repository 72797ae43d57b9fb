"""Dashboard wiring: create_app(settings) builds the Starlette app; resources live in the lifespan.

The lifespan opens the service clients, starts the observer's poll and owns the guided demo task.
Routes: the page (``/``, ``?story=guided`` auto-plays the demo when the navigation was the
user's own), one partial per panel (each a block of the page's own template), the what-if
preview, the policy and demo buttons, /metrics and /healthz. Partials render from the observer's
last snapshot, so none of them waits on a service. Every HTML answer is a template with
autoescape, and every response carries the Content-Security-Policy (no inline script, no eval).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from services.common.config import ServiceSettings, parse_service_args, resolve_input
from services.common.http import (
    SecurityHeadersMiddleware,
    healthz_route,
    metrics_route,
    serve_http,
)
from services.common.latency import format_ms
from services.common.logs import configure_logging
from services.dashboard import metrics, views
from services.dashboard.access import (
    ActionGuard,
    navigation_is_users_own,
    token_ok,
    unlock_endpoint,
)
from services.dashboard.clients import ActionError, Endpoints, ServiceClients
from services.dashboard.demo import DemoConfig, GuidedDemo
from services.dashboard.observer import SERVICES, Observer
from services.dashboard.timeline import Timeline

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
HTMX_SCRIPT = "htmx-2.0.11.min.js"
PANELS = (
    "cockpit",
    "latency",
    "allocator",
    "policies",
    "demo",
    "gpu",
    "intents",
    "node",
    "robot",
    "events",
)


@dataclass
class Dashboard:
    """Everything the routes share; built in the lifespan, stored on app.state."""

    settings: ServiceSettings
    clients: ServiceClients
    timeline: Timeline
    observer: Observer
    demo: GuidedDemo
    window_s: float
    poll_s: float
    last_action: str = ""
    last_action_policy: str = ""  # the policy the last action made active ("" = none)

    def action_note(self, snapshot_active: str | None) -> str:
        """The last action's note, dropped once the allocator reports another policy."""
        if self.last_action_policy and snapshot_active not in (None, self.last_action_policy):
            return ""
        return self.last_action


def demo_config(settings: ServiceSettings) -> DemoConfig:
    intents = settings.document.get("demo_intents")
    return DemoConfig(
        stage_seconds=settings.get_float("demo_stage_seconds", 14.0),
        tick_seconds=settings.get_float("demo_tick_ms", 500.0) / 1000.0,
        disturbance_cpu=settings.get_float("demo_disturbance_cpu", 0.6),
        disturbance_gpu=settings.get_float("demo_disturbance_gpu", 0.5),
        disturbance_network=settings.get_float("demo_disturbance_network", 0.4),
        urgent_deadline_ms=settings.get_float("demo_urgent_deadline_ms", 300.0),
        urgent_work=settings.get_int("demo_urgent_work", 6),
        intents_path=resolve_input(str(intents)) if intents else None,
    )


def endpoints(settings: ServiceSettings) -> Endpoints:
    return Endpoints(
        allocator=settings.get_str("allocator_address", "127.0.0.1:50051"),
        nodeagent=settings.get_str("nodeagent_address", "127.0.0.1:50052"),
        gpulane=settings.get_str("gpulane_address", "127.0.0.1:50053"),
        bridge_url=settings.get_str("bridge_url", "http://127.0.0.1:18083").rstrip("/"),
        extender_url=settings.get_str("extender_url", "http://127.0.0.1:18082").rstrip("/"),
    )


def render_block(env: Environment, block: str, context: dict[str, Any]) -> str:
    template = env.get_template("index.html")
    return "".join(template.blocks[block](template.new_context(context)))


def create_app(settings: ServiceSettings) -> Starlette:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    env = templates.env
    env.autoescape = True  # every template, whatever its file name
    env.filters["ms"] = format_ms
    env.filters["pct"] = lambda v, digits=0: "-" if v is None else f"{v * 100:.{digits}f}%"
    env.filters["clock"] = lambda t: time.strftime("%H:%M:%S", time.localtime(t))
    env.filters["count"] = lambda n: f"{int(n):,}"
    env.globals["htmx_script"] = HTMX_SCRIPT

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        clients = ServiceClients(
            endpoints(settings),
            timeout_s=settings.get_float("call_timeout_ms", 800.0) / 1000.0,
            token=settings.api_token,
        )
        timeline = Timeline()
        observer = Observer(
            clients, timeline, refresh_s=settings.get_float("refresh_ms", 1000.0) / 1000.0
        )
        demo = GuidedDemo(
            clients,
            timeline,
            demo_config(settings),
            on_change=observer.nudge,
            observed=lambda: views.summary(observer.snapshot, timeline, time.time()),
        )
        app.state.dashboard = Dashboard(
            settings=settings,
            clients=clients,
            timeline=timeline,
            observer=observer,
            demo=demo,
            window_s=settings.get_float("chart_window_s", 120.0),
            poll_s=settings.get_float("poll_seconds", 2.0),
        )
        await observer.poll()
        poller = asyncio.create_task(observer.run(), name="dashboard-poll")
        try:
            yield
        finally:
            await demo.stop()
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            await clients.close()

    def dash(request: Request) -> Dashboard:
        return request.app.state.dashboard  # type: ignore[no-any-return]

    def context(request: Request, d: Dashboard, panels: tuple[str, ...]) -> dict[str, Any]:
        snapshot = d.observer.snapshot
        now = time.time()
        builders = {
            "cockpit": lambda: views.cockpit(snapshot, d.timeline, now),
            "latency": lambda: views.latency(d.timeline, now, d.window_s),
            "allocator": lambda: views.allocator(snapshot),
            "policies": lambda: views.policies(snapshot),
            "demo": lambda: d.demo.view(),
            "gpu": lambda: views.gpu(snapshot),
            "intents": lambda: views.intents(snapshot),
            "node": lambda: views.node(snapshot),
            "robot": lambda: views.robot(snapshot, d.timeline, now, d.window_s),
            "events": lambda: d.timeline.recent_events(),
        }
        ctx: dict[str, Any] = {name: builders[name]() for name in panels}
        ctx.update(
            request=request,
            poll_s=d.poll_s,
            # static/dashboard.js cancels these while the tab is hidden (no eval'd filters)
            poll_trigger=f"every {d.poll_s:g}s, visibilitychange from:document",
            snapshot_age_s=max(0.0, now - snapshot.taken_at) if snapshot.taken_at else None,
            services=views.services(snapshot, {s: d.clients.address(s) for s in SERVICES}),
            event_count=len(d.timeline.events),
            last_action=d.action_note(views.policies(snapshot)["active"]),
            oob=False,
        )
        return ctx

    async def page(request: Request) -> Response:
        d = dash(request)
        ctx = context(request, d, PANELS)
        # ?story=guided auto-plays only after a navigation the user made (typed, bookmarked,
        # from this page): a link from another site only offers the button.
        story = request.query_params.get("story") == "guided" and not d.demo.running
        ctx["autostart"] = story and navigation_is_users_own(request)
        ctx["story_offered"] = story and not ctx["autostart"]
        ctx["locked"] = not token_ok(request, settings.api_token)
        ctx["preview_block"] = {"idle": True}
        return templates.TemplateResponse(request, "index.html", ctx)

    async def partial(request: Request) -> Response:
        panel = request.path_params["panel"]
        if panel not in PANELS:
            message = f"no panel named {panel!r}"
            return templates.TemplateResponse(
                request,
                "message.html",
                {"css_class": "down-msg", "message": message},
                status_code=404,
            )
        d = dash(request)
        ctx = context(request, d, (panel,))
        body = render_block(env, panel, ctx)
        if panel == "cockpit":
            ctx["oob"] = True
            body += render_block(env, "strip", ctx)
        return HTMLResponse(body)

    async def preview(request: Request) -> Response:
        d = dash(request)
        try:
            knobs = {
                k: _unit(request.query_params.get(k, "0"), k) for k in ("cpu", "gpu", "network")
            }
            rate = _unit(request.query_params.get("rate", "1"), "rate", upper=10.0)
        except ValueError as exc:
            ctx = {"preview_block": {"error": str(exc)}, "request": request}
            return HTMLResponse(render_block(env, "preview", ctx), status_code=422)
        reading = await d.clients.preview_plan(
            cpu=knobs["cpu"], gpu=knobs["gpu"], network=knobs["network"], arrival_rate_scale=rate
        )
        metrics.PREVIEWS.labels(outcome="ok" if reading.ok else "error").inc()
        block: dict[str, Any] = {"knobs": knobs, "rate": rate}
        if reading.ok and reading.value is not None:
            block.update(views.preview(reading.value, d.observer.snapshot))
        else:
            block["error"] = reading.error
        return HTMLResponse(
            render_block(env, "preview", {"preview_block": block, "request": request})
        )

    async def set_policy(request: Request) -> Response:
        d = dash(request)
        name = request.query_params.get("name", "").strip()
        try:
            if not name:
                raise ActionError("name: choose a policy")
            result = await d.clients.set_policy(name)
            d.last_action = f"policy {result.active} active (was {result.previous or 'none'})"
            d.last_action_policy = result.active
            d.timeline.note(time.time(), "action", f"set policy {result.active}")
            metrics.ACTIONS.labels(action="set-policy", outcome="ok").inc()
        except ActionError as exc:
            d.last_action = f"SetPolicy {name or '?'} failed: {exc}"
            d.last_action_policy = ""
            metrics.ACTIONS.labels(action="set-policy", outcome="error").inc()
        await d.observer.poll()
        return HTMLResponse(render_block(env, "policies", context(request, d, ("policies",))))

    async def demo_start(request: Request) -> Response:
        d = dash(request)
        started = d.demo.start()
        metrics.ACTIONS.labels(
            action="demo-start", outcome="ok" if started else "already-running"
        ).inc()
        await asyncio.sleep(0)  # let the first stage begin before rendering it
        return HTMLResponse(render_block(env, "demo", context(request, d, ("demo",))))

    async def demo_stop(request: Request) -> Response:
        d = dash(request)
        await d.demo.stop()
        metrics.ACTIONS.labels(action="demo-stop", outcome="ok").inc()
        return HTMLResponse(render_block(env, "demo", context(request, d, ("demo",))))

    routes = [
        Route("/", page, methods=["GET"]),
        Route("/partials/preview", preview, methods=["GET"]),
        Route("/partials/{panel}", partial, methods=["GET"]),
        Route("/actions/policy", set_policy, methods=["POST"]),
        Route("/actions/demo/start", demo_start, methods=["POST"]),
        Route("/actions/demo/stop", demo_stop, methods=["POST"]),
        Route("/unlock", unlock_endpoint(settings.api_token, templates), methods=["GET"]),
        metrics_route(),
        healthz_route(),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(ActionGuard, token=settings.api_token, templates=templates)
    app.add_middleware(SecurityHeadersMiddleware)
    return app


def _unit(raw: str, name: str, upper: float = 1.0) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}: expected a number in [0, {upper:g}], got {raw!r}") from None
    if not math.isfinite(value) or not 0.0 <= value <= upper:
        raise ValueError(f"{name}: expected a number in [0, {upper:g}], got {raw!r}")
    return value


def main() -> None:
    settings, _ = parse_service_args("dashboard")
    configure_logging(settings.log_level, settings.log_format, "dashboard")
    log.info("dashboard", extra={"url": f"http://{settings.host}:{settings.port}/"})
    serve_http(create_app(settings), settings)
