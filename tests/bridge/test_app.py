"""The HTTP layer: routes, 422 naming the field, 409 naming the state, token, metrics, ticker, restart."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from services.bridge.app import create_app
from services.common.config import build_settings
from tests.bridge.conftest import AllocatorDouble


def settings_for(**overrides: Any) -> Any:
    base = {
        "background_ticker": False,
        "allocator_address": "",
        "allocator_retry_ms": 200,
        "ros2": "off",  # tests/bridge/test_ros2.py covers ROS 2
    }
    base.update(overrides)
    return build_settings("bridge", overrides=base, env={})


@pytest.fixture
def client(home: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for())) as test_client:
        yield test_client


def tick(client: TestClient, ticks: int = 1) -> dict[str, Any]:
    response = client.post("/api/tick", json={"ticks": ticks})
    assert response.status_code == 200, response.text
    return response.json()


def metric(client: TestClient, line_start: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{line_start} not in /metrics")


def test_mission_urgent_and_state_round_trip(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every log call in the loop really formats its record
    started = client.post(
        "/api/mission", json={"steps": 10, "safe_point_interval": 5, "deadline_ms": 60_000}
    )
    assert started.status_code == 201
    assert started.json()["state"] == "RUNNING" and started.json()["mission_id"]
    tick(client, 2)
    queued = client.post(
        "/api/urgent", json={"name": "fall-detected", "deadline_ms": 5_000, "work": 2}
    )
    assert queued.status_code == 202
    assert queued.json()["urgent_queued"] == 1
    seen = [tick(client)["state"] for _ in range(9)]
    assert seen == [
        "RUNNING",
        "RUNNING",
        "CHECKPOINTING",
        "PREEMPTED",
        "URGENT_TASK_RUNNING",
        "URGENT_TASK_RUNNING",
        "PREEMPTED",
        "RESUMING",
        "COMPENSATING",
    ]
    state = client.get("/api/state").json()
    assert state["mode"] == "local-compatible"
    assert state["ros2"]["mode"] == "local-compatible" and "off" in state["ros2"]["detail"]
    assert state["urgent"]["recent"][0]["spec"]["name"] == "fall-detected"
    assert state["urgent"]["recent"][0]["outcome"] == "met"
    assert state["checkpoint_step"] == 5
    tick(client, 6)
    assert client.get("/api/state").json()["state"] == "COMPLETED"
    assert metric(client, 'parfusion_bridge_missions_total{outcome="met"}') == 1
    assert metric(client, 'parfusion_bridge_urgent_completed_total{outcome="met"}') == 1
    assert metric(client, "parfusion_bridge_preemption_latency_seconds_count") == 1


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/mission", {}, "steps"),
        ("/api/mission", {"steps": "ten"}, "steps"),
        ("/api/mission", {"steps": 0}, "steps"),
        ("/api/mission", {"steps": True}, "steps"),
        ("/api/mission", {"steps": 4, "safe_point_interval": 5}, "safe_point_interval"),
        ("/api/mission", {"steps": 4, "deadline_ms": -1}, "deadline_ms"),
        ("/api/mission", {"steps": 4, "deadline_ms": "soon"}, "deadline_ms"),
        ("/api/mission", {"steps": 4, "name": "Not A Label"}, "name"),
        ("/api/mission", {"steps": 4, "safe_point": 2}, "safe_point"),
        ("/api/urgent", {"deadline_ms": 100}, "name"),
        ("/api/urgent", {"name": "a"}, "deadline_ms"),
        ("/api/urgent", {"name": "a", "deadline_ms": 0}, "deadline_ms"),
        ("/api/urgent", {"name": "a", "deadline_ms": 100, "work": 0}, "work"),
        ("/api/urgent", {"name": "a", "deadline_ms": 100, "work": 1.5}, "work"),
        ("/api/tick", {"ticks": 0}, "ticks"),
    ],
)
def test_invalid_bodies_get_422_naming_the_field(
    client: TestClient, path: str, body: dict[str, Any], field: str
) -> None:
    response = client.post(path, json=body)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field
    assert client.get("/api/state").json()["state"] == "IDLE"  # nothing half-applied


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]"])
def test_malformed_bodies_get_400(client: TestClient, raw: bytes) -> None:
    for path in ("/api/mission", "/api/urgent", "/api/tick"):
        response = client.post(path, content=raw, headers={"content-type": "application/json"})
        assert response.status_code == 400, (path, response.text)


def test_requests_that_do_not_fit_the_state_get_409_with_the_state(client: TestClient) -> None:
    cancel = client.delete("/api/mission")
    assert cancel.status_code == 409 and cancel.json()["state"] == "IDLE"
    assert client.post("/api/mission", json={"steps": 10}).status_code == 201
    again = client.post("/api/mission", json={"steps": 10})
    assert again.status_code == 409
    assert again.json()["state"] == "RUNNING" and again.json()["event"] == "start_mission"
    client.post("/api/urgent", json={"name": "stop", "deadline_ms": 9_000, "work": 3})
    for _ in range(3):
        tick(client)
        refused = client.post("/api/mission", json={"steps": 10})
        assert refused.status_code == 409
        assert refused.json()["state"] == client.get("/api/state").json()["state"]
    assert client.delete("/api/mission").status_code == 409  # URGENT_TASK_RUNNING


def test_cancel_a_running_mission(client: TestClient) -> None:
    client.post("/api/mission", json={"steps": 10})
    response = client.delete("/api/mission")
    assert response.status_code == 200 and response.json()["state"] == "IDLE"
    assert response.json()["mission"]["outcome"] == "cancelled"


def test_empty_tick_body_advances_one_step(client: TestClient) -> None:
    client.post("/api/mission", json={"steps": 10})
    assert client.post("/api/tick").json()["mission_step"] == 1
    assert client.post("/api/tick", json={}).json()["mission_step"] == 2


def test_metrics_and_healthz_are_plain_routes(client: TestClient) -> None:
    metrics = client.get("/metrics", follow_redirects=False)
    assert metrics.status_code == 200
    for name in (
        "parfusion_bridge_time_to_safe_point_seconds",
        "parfusion_bridge_preemption_latency_seconds",
        "parfusion_bridge_urgent_completion_deadline_ratio",
        "parfusion_bridge_urgent_deadline_misses_total",
        "parfusion_bridge_resume_latency_seconds",
        "parfusion_bridge_steps_redone_total",
        "parfusion_bridge_replan_seconds",
    ):
        assert name in metrics.text
    assert client.get("/healthz").json() == {"status": "ok"}


def test_urgent_with_the_allocator_up_submits_and_deletes_its_intent(
    home: Path, recording_allocator: AllocatorDouble
) -> None:
    with TestClient(
        create_app(settings_for(allocator_address=recording_allocator.address))
    ) as client:
        client.post("/api/mission", json={"steps": 10, "safe_point_interval": 5})
        client.post("/api/urgent", json={"name": "fall-detected", "deadline_ms": 4_000, "work": 2})
        tick(client, 3)  # preempt at step 0, checkpoint, hand-over
        assert len(recording_allocator.servicer.submitted) == 1
        intent = recording_allocator.servicer.submitted[0].intent
        assert (
            intent.workload_class == 4
            and intent.slo.deadline_ms == 4_000
            and not intent.preemptible
        )
        assert intent.name == "fall-detected"
        assert not recording_allocator.servicer.deleted
        state = tick(client, 2)
        assert recording_allocator.servicer.deleted == [intent.id]
        recent = state["urgent"]["recent"][0]
        # the double answers no GetIntent: submitted, never reported as granted
        assert recent["allocator"] == "submitted" and recent["allocation"] is None
        assert recent["intent_deleted"] is True
        assert state["allocator_reachable"] is True
        assert metric(client, 'parfusion_bridge_urgent_handled_total{mode="allocator"}') == 1


def test_urgent_with_the_allocator_down_is_handled_locally(
    home: Path, unreachable_address: str
) -> None:
    with TestClient(create_app(settings_for(allocator_address=unreachable_address))) as client:
        client.post("/api/urgent", json={"name": "fall-detected", "deadline_ms": 4_000, "work": 1})
        state = tick(client)
        assert state["state"] == "URGENT_TASK_RUNNING"
        assert state["urgent"]["handled_locally"] is True
        assert state["urgent"]["active"]["allocator"] == "unreachable"
        assert (
            state["allocator_reachable"] is False
            and "UNAVAILABLE" in state["allocator"]["last_error"]
        )
        assert tick(client)["state"] == "IDLE"
        assert (
            metric(
                client,
                'parfusion_bridge_allocator_failures_total{operation="submit",reason="unreachable"}',
            )
            == 1
        )
        assert metric(client, 'parfusion_bridge_urgent_handled_total{mode="local"}') == 1
        assert metric(client, 'parfusion_bridge_urgent_completed_total{outcome="met"}') == 1


def test_a_restarted_bridge_resumes_the_mission_from_its_checkpoint(home: Path) -> None:
    with TestClient(create_app(settings_for())) as client:
        mission_id = client.post(
            "/api/mission", json={"steps": 20, "safe_point_interval": 5}
        ).json()["mission_id"]
        tick(client, 8)
    assert (home / "run" / "bridge" / "checkpoint.json").exists()
    with TestClient(create_app(settings_for())) as client:
        state = client.get("/api/state").json()
        assert state["state"] == "RESUMING" and state["mission"]["id"] == mission_id
        assert tick(client, 2)["state"] == "RUNNING"
        state = tick(client)
        assert state["mission_step"] == 6 and state["steps_redone"] == 3


def test_api_token_guards_mutations(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARFUSION_API_TOKEN", "s3cret")
    settings = build_settings(
        "bridge", overrides={"background_ticker": False, "allocator_address": ""}
    )
    with TestClient(create_app(settings)) as client:
        assert client.post("/api/mission", json={"steps": 3}).status_code == 401
        assert client.get("/api/state").status_code == 200
        ok = client.post(
            "/api/mission", json={"steps": 3}, headers={"authorization": "Bearer s3cret"}
        )
        assert ok.status_code == 201


def test_background_ticker_moves_the_robot_without_tick_calls(home: Path) -> None:
    with TestClient(create_app(settings_for(background_ticker=True, tick_ms=10))) as client:
        client.post("/api/mission", json={"steps": 5, "safe_point_interval": 5})
        deadline = time.monotonic() + 10
        state = client.get("/api/state").json()
        while state["state"] != "COMPLETED" and time.monotonic() < deadline:
            time.sleep(0.02)
            state = client.get("/api/state").json()
        assert state["state"] == "COMPLETED" and state["background_ticker"] is True


def test_oversized_bodies_get_413(home: Path) -> None:
    with TestClient(create_app(settings_for(max_body_bytes=64))) as client:
        response = client.post("/api/mission", json={"steps": 3, "name": "x" * 100})
        assert response.status_code == 413
        assert client.get("/api/state").json()["state"] == "IDLE"


def test_a_restored_mission_can_be_dropped_before_it_resumes(home: Path) -> None:
    with TestClient(create_app(settings_for())) as client:
        client.post("/api/mission", json={"steps": 20})
        tick(client, 3)
    with TestClient(create_app(settings_for())) as client:
        assert client.post("/api/mission", json={"steps": 5}).json()["state"] == "RESUMING"
        assert client.delete("/api/mission").json()["state"] == "IDLE"
        assert client.post("/api/mission", json={"steps": 5}).status_code == 201
    with TestClient(create_app(settings_for())) as client:  # the new mission is the one restored
        assert client.get("/api/state").json()["mission"]["spec"]["steps"] == 5
