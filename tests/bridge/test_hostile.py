"""The bridge against malformed tokens (issue item 5): 401, never 500, and the right token works."""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

from services.bridge.app import create_app
from services.common.config import build_settings


def test_malformed_tokens_are_401(home: Path) -> None:
    settings = build_settings(
        "bridge",
        overrides={"background_ticker": False, "allocator_address": "", "ros2": "off"},
        env={"PARFUSION_API_TOKEN": "s3cret"},
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        body = b'{"name": "fall-detected", "deadline_ms": 500, "work": 1}'
        for headers in (
            [(b"x-api-token", b"\xff\xfe")],
            [(b"authorization", "Bearer é".encode())],
            [(b"authorization", b"Bearer \xc3")],
            [(b"x-api-token", b"")],
            [],
        ):
            reply = client.post("/api/urgent", content=body, headers=headers)
            assert reply.status_code == 401, headers
            assert reply.json() == {"error": "missing or invalid API token"}
        assert client.get("/api/state").status_code == 200  # reads stay open
        ok = client.post("/api/urgent", content=body, headers={"X-API-Token": "s3cret"})
        assert ok.status_code == 202
