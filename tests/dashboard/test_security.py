"""The dashboard against a hostile web page or client (issue items 1, 2 and 5): escaped by
construction, CSP on every response, navigation never changes state, foreign origins and
malformed tokens refused with 4xx."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

from starlette.testclient import TestClient

from services.common.config import ServiceSettings, build_settings
from services.common.http import CONTENT_SECURITY_POLICY
from services.dashboard.app import create_app
from tests.conftest import ROOT
from tests.dashboard.conftest import HTMX

XSS = "<img src=x onerror=alert(1)>"


def test_a_reflected_name_is_escaped_and_every_response_has_the_csp(
    dashboard_settings: Callable[..., ServiceSettings],
) -> None:
    with TestClient(create_app(dashboard_settings())) as client:
        missing = client.get("/partials/%3Cimg%20src=x%20onerror=alert(1)%3E")
        assert missing.status_code == 404
        assert "<img" not in missing.text and "&lt;img src=x onerror=alert(1)&gt;" in missing.text
        for path in (
            "/",
            "/partials/cockpit",
            "/partials/nope",
            "/static/dashboard.css",
            "/healthz",
        ):
            response = client.get(path)
            assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
            assert response.headers["x-content-type-options"] == "nosniff"
        policy = dict(part.strip().split(" ", 1) for part in CONTENT_SECURITY_POLICY.split(";"))
        assert policy["script-src"] == "'self'"  # no inline script, no eval
        page = client.get("/").text
        assert not re.search(r"<script(?![^>]*\bsrc=)", page)  # every script is a file
        assert not re.search(r"\son[a-z]+=", page)  # no inline event handlers
        assert "hx-on" not in page and "js:" not in page


def test_a_cross_site_link_cannot_start_the_guided_demo(
    dashboard_settings: Callable[..., ServiceSettings],
) -> None:
    with TestClient(create_app(dashboard_settings())) as client:
        for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}, {}):
            page = client.get("/?story=guided", headers=headers).text
            assert 'hx-trigger="load"' not in page, headers
            assert "press <b>Guided Demo</b> to start it" in page
            assert 'id="demo-status">idle<' in client.get("/partials/demo").text
        own = client.get("/?story=guided", headers={"Sec-Fetch-Site": "none"}).text
        assert 'id="story-autostart" hx-post="/actions/demo/start" hx-trigger="load"' in own
        # and the action itself refuses a foreign origin, even with htmx's header
        for foreign in (
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site"},  # another port of 127.0.0.1
            {"Origin": "http://evil.example"},
            {"Origin": "null"},
        ):
            refused = client.post("/actions/demo/start", headers={**HTMX, **foreign})
            assert refused.status_code == 403, foreign
            assert "own origin" in refused.text
        assert 'id="demo-status">idle<' in client.get("/partials/demo").text
        same = {**HTMX, "Sec-Fetch-Site": "same-origin", "Origin": "http://testserver"}
        assert client.post("/actions/demo/stop", headers=same).status_code == 200


def test_malformed_tokens_are_401_never_500(
    home: Path, dashboard_settings: Callable[..., ServiceSettings]
) -> None:
    settings = build_settings(
        "dashboard",
        overrides=dashboard_settings().section,
        env={"PARFUSION_HOME": str(home), "PARFUSION_API_TOKEN": "s3cret"},
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        assert client.get("/unlock?token=%C3%A9", follow_redirects=False).status_code == 401
        assert client.get("/unlock?token=%FF%FE", follow_redirects=False).status_code == 401
        for headers in (
            [(b"x-api-token", b"\xff")],
            [(b"authorization", "Bearer é".encode())],
            [(b"authorization", b"Bearer \xc3")],
            [(b"cookie", "parfusion_token=é".encode())],
            [(b"cookie", b"parfusion_token=\xff\xfe")],
        ):
            response = client.post(
                "/actions/demo/stop", headers=[(b"hx-request", b"true"), *headers]
            )
            assert response.status_code == 401, headers
        page = client.get("/", headers=[(b"cookie", b"parfusion_token=\xff")])
        assert page.status_code == 200 and "Buttons are locked" in page.text


HTTP_SERVICES = ("dashboard", "extender", "bridge", "common")
TAG = re.compile(
    r"<(/?)(html|body|div|span|p|a|b|i|li|ul|ol|table|tr|td|th|svg|g|rect|line|"
    r"text|polyline|script|style|img|code|section|button|form|input)[\s>/]"
)


def test_no_html_is_assembled_from_strings_in_the_http_services() -> None:
    """Markup lives in templates: no f-string, %-format or .format call in the HTTP services
    builds a tag (the chart is templates/chart.svg.html, messages templates/message.html)."""
    found = []
    for service in HTTP_SERVICES:
        for path in sorted((ROOT / "services" / service).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                pieces: list[str] = []
                if isinstance(node, ast.JoinedStr):
                    pieces = [v.value for v in node.values if isinstance(v, ast.Constant)]
                elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
                    pieces = [
                        side.value
                        for side in (node.left, node.right)
                        if isinstance(side, ast.Constant) and isinstance(side.value, str)
                    ]
                elif (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("format", "join")
                    and isinstance(node.func.value, ast.Constant)
                    and isinstance(node.func.value.value, str)
                ):
                    pieces = [node.func.value.value]
                if any(TAG.search(str(piece)) for piece in pieces):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
