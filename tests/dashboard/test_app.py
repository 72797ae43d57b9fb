"""Routes and partials with every service down: each panel says which address is unreachable."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable
from pathlib import Path

from starlette.testclient import TestClient

from services.common.config import ServiceSettings, build_settings
from services.dashboard.app import HTMX_SCRIPT, PANELS, create_app
from tests.dashboard.conftest import HTMX


def test_page_says_each_service_is_unreachable_and_never_hangs(
    dashboard_settings: Callable[..., ServiceSettings],
) -> None:
    settings = dashboard_settings()
    with TestClient(create_app(settings)) as client:
        started = time.monotonic()
        page = client.get("/")
        assert page.status_code == 200
        for key in ("allocator_address", "nodeagent_address", "gpulane_address"):
            service = key.split("_")[0]
            assert f"{service} unreachable at {settings.get_str(key)}" in page.text
        assert f"bridge unreachable at {settings.get_str('bridge_url')}" in page.text
        for panel in PANELS:
            response = client.get(f"/partials/{panel}")
            assert response.status_code == 200, panel
            assert f'id="{panel}"' in response.text
        assert time.monotonic() - started < 5.0
        assert client.get("/partials/nope").status_code == 404


def test_page_uses_vendored_htmx_and_polling_pauses_when_hidden(
    dashboard_settings: Callable[..., ServiceSettings],
) -> None:
    with TestClient(create_app(dashboard_settings(poll_seconds=3.0))) as client:
        page = client.get("/").text
        assert f'src="/static/{HTMX_SCRIPT}"' in page and "unpkg" not in page and "cdn" not in page
        assert 'hx-trigger="every 3s, visibilitychange from:document" data-poll' in page
        assert '<script src="/static/dashboard.js"></script>' in page  # cancels while hidden
        script = client.get(f"/static/{HTMX_SCRIPT}")
        assert script.status_code == 200 and "htmx" in script.text[:2000]
        assert 'hx-post="/actions/demo/start" hx-trigger="load"' not in page
        own = {"Sec-Fetch-Site": "none"}  # typed or bookmarked: the user's own navigation
        assert 'hx-trigger="load"' in client.get("/?story=guided", headers=own).text


def test_cockpit_partial_updates_the_service_strip_out_of_band(
    dashboard_settings: Callable[..., ServiceSettings],
) -> None:
    with TestClient(create_app(dashboard_settings())) as client:
        body = client.get("/partials/cockpit").text
        assert 'id="service-strip" class="strip" hx-swap-oob="true"' in body
        assert re.search(r'class="svc down" data-service="allocator"', body)


def test_actions_report_failures_instead_of_raising(
    dashboard_settings: Callable[..., ServiceSettings],
) -> None:
    settings = dashboard_settings()
    with TestClient(create_app(settings)) as client:
        body = client.post("/actions/policy?name=baseline", headers=HTMX).text
        assert (
            f"SetPolicy baseline failed: allocator unreachable at {settings.get_str('allocator_address')}"
            in body
        )
        preview = client.get("/partials/preview?cpu=0.5&gpu=0&network=0&rate=1")
        assert preview.status_code == 200 and "allocator unreachable" in preview.text
        bad = client.get("/partials/preview?cpu=2")
        assert bad.status_code == 422 and "cpu: expected a number in [0, 1]" in bad.text
        assert client.get("/partials/preview?rate=abc").status_code == 422


def test_metrics_and_healthz(dashboard_settings: Callable[..., ServiceSettings]) -> None:
    with TestClient(create_app(dashboard_settings())) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        metrics = client.get("/metrics", follow_redirects=False)
        assert metrics.status_code == 200
        assert 'parfusion_dashboard_service_up{service="allocator"} 0.0' in metrics.text
        assert "parfusion_dashboard_poll_seconds_count" in metrics.text


def test_actions_need_the_htmx_header_and_the_token_when_one_is_set(
    home: Path, dashboard_settings: Callable[..., ServiceSettings]
) -> None:
    with TestClient(create_app(dashboard_settings())) as client:
        forged = client.post("/actions/policy?name=baseline")  # e.g. a form on another site
        assert forged.status_code == 403 and forged.headers["HX-Retarget"] == "#flash"
        assert "Buttons are locked" not in client.get("/").text

    settings = build_settings(
        "dashboard",
        overrides=dashboard_settings().section,
        env={"PARFUSION_HOME": str(home), "PARFUSION_API_TOKEN": "s3cret"},
    )
    with TestClient(create_app(settings)) as client:
        assert "Buttons are locked" in client.get("/").text
        assert client.post("/actions/demo/stop", headers=HTMX).status_code == 401
        bearer = {**HTMX, "Authorization": "Bearer s3cret"}
        assert client.post("/actions/demo/stop", headers=bearer).status_code == 200
        assert client.get("/unlock?token=wrong", follow_redirects=False).status_code == 401
        unlocked = client.get("/unlock?token=s3cret", follow_redirects=False)
        assert unlocked.status_code == 303 and "httponly" in unlocked.headers["set-cookie"].lower()
        assert client.post("/actions/demo/stop", headers=HTMX).status_code == 200
        assert "Buttons are locked" not in client.get("/").text


def test_a_service_that_accepts_but_never_answers_costs_one_timeout_not_a_hang(
    dashboard_settings: Callable[..., ServiceSettings],
) -> None:
    with socket.socket() as silent:  # listens, never speaks HTTP/2 or HTTP
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        host, port = silent.getsockname()
        settings = dashboard_settings(
            allocator_address=f"{host}:{port}", bridge_url=f"http://{host}:{port}"
        )
        with TestClient(create_app(settings)) as client:
            started = time.monotonic()
            for panel in ("allocator", "robot", "cockpit"):
                assert client.get(f"/partials/{panel}").status_code == 200
            preview = client.get("/partials/preview?cpu=0.5").text
            assert time.monotonic() - started < 2.0
            assert f"allocator unreachable at {host}:{port}" in preview
            assert (
                f"bridge unreachable at http://{host}:{port}" in client.get("/partials/robot").text
            )
