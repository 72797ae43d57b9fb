"""The bridge under fuzzed requests: mission, urgent-event and tick bodies mutated from valid
ones. No answer may be a 5xx; afterwards the bridge is healthy and a mission still runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient

from services.bridge.app import create_app
from services.common.config import build_settings
from tests.fuzzing import fuzz_settings, json_bodies

EXAMPLES = {
    ("POST", "/api/mission"): {"steps": 10, "safe_point_interval": 5, "deadline_ms": 60_000},
    ("POST", "/api/urgent"): {"name": "fall-detected", "deadline_ms": 3000, "work": 2},
    ("POST", "/api/tick"): {"ticks": 3},
}


@pytest.fixture
def client(home: Path) -> Iterator[TestClient]:
    settings = build_settings(
        "bridge",
        overrides={"background_ticker": False, "allocator_address": "", "ros2": "off"},
        env={},
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


def test_no_request_gets_a_5xx(client: TestClient) -> None:
    @fuzz_settings()
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        method, path = data.draw(st.sampled_from(sorted(EXAMPLES)), label="route")
        body = data.draw(json_bodies(EXAMPLES[(method, path)]), label="body")
        reply = client.request(
            method, path, content=body, headers={"Content-Type": "application/json"}
        )
        assert reply.status_code < 500, (path, reply.status_code, reply.text[:300])
        assert reply.headers["x-content-type-options"] == "nosniff"  # security headers
        if data.draw(st.integers(0, 20), label="cancel") == 0:
            assert client.delete("/api/mission").status_code < 500

    fuzz()
    assert client.get("/healthz").status_code == 200
    client.delete("/api/mission")
    before = client.get("/api/state").json()
    after = client.post("/api/tick", json={"ticks": 50}).json()
    assert after["ticks"] == before["ticks"] + 50  # the control loop still runs
    if not after["accepts_mission"]:
        # accepted urgent events (up to 100,000 units of work each) are still being worked
        # off: that is the bridge doing its job, and it must be visibly progressing
        assert after["urgent"]["active"] is not None, after["state"]
        return
    started = client.post("/api/mission", json={"steps": 3, "safe_point_interval": 1})
    assert started.status_code == 201, started.text
    state = client.post("/api/tick", json={"ticks": 100}).json()
    assert state["state"] == "COMPLETED"
