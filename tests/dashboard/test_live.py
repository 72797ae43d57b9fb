"""Routes against a real in-process allocator (gRPC, seeded demo intents, control loop running).

The node agent and GPU-lane addresses point at free ports, so the plan is built from the
allocator's own view (stale node) and their panels show the service-down rendering.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from starlette.testclient import TestClient

from parfusion.v1 import (
    allocator_pb2,
    allocator_pb2_grpc,
    intent_pb2,
    nodeagent_pb2,
    nodeagent_pb2_grpc,
)
from services.allocator.server import RunningAllocator, start_allocator
from services.common.clients import channel
from services.common.config import ServiceSettings, build_settings
from services.dashboard.app import create_app
from services.dashboard.observer import CHART_SERIES, LARGE_NODE_EVERY, LARGE_NODE_POOLS
from services.dashboard.views import TABLE_ROWS
from services.nodeagent.server import start_nodeagent
from tests.allocator.conftest import batch_intent, online_intent
from tests.conftest import free_port
from tests.dashboard.conftest import HTMX

pytestmark = pytest.mark.integration


@pytest.fixture
def allocator(home: Path) -> Iterator[RunningAllocator]:
    settings = build_settings(
        "allocator",
        overrides={
            "port": 0,
            "tick_ms": 100.0,
            "nodeagent_address": f"127.0.0.1:{free_port()}",
            "gpulane_address": f"127.0.0.1:{free_port()}",
            "seed_intents": True,
        },
        env={"PARFUSION_HOME": str(home)},
    )
    running = start_allocator(settings, port=0)
    yield running
    running.stop()


def _active(allocator: RunningAllocator) -> str:
    """The allocator's active policy, asked over its public API."""
    with channel(allocator.address) as ch:
        reply = allocator_pb2_grpc.AllocatorServiceStub(ch).ListPolicies(
            allocator_pb2.ListPoliciesRequest(), timeout=5
        )
    return str(reply.active)


def _rows(html: str, table_id: str) -> dict[str, str]:
    table = html.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0]
    return dict(re.findall(r'<tr data-intent="([^"]+)"[^>]*>(.*?)</tr>', table, re.S))


def _wait(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.1)


def test_allocator_table_policies_and_preview_from_the_real_allocator(
    allocator: RunningAllocator, dashboard_settings: Callable[..., ServiceSettings]
) -> None:
    settings = dashboard_settings(allocator_address=allocator.address)
    with TestClient(create_app(settings)) as client:
        _wait(lambda: len(_rows(client.get("/partials/allocator").text, "allocation-table")) >= 3)
        page = client.get("/").text
        rows = _rows(page, "allocation-table")
        with channel(allocator.address) as ch:
            listed = allocator_pb2_grpc.AllocatorServiceStub(ch).ListIntents(
                allocator_pb2.ListIntentsRequest(), timeout=5
            )
        intents = {i.name for i in listed.intents}
        assert set(rows) == intents
        assert "allocator unreachable" not in page
        assert f"nodeagent unreachable at {settings.get_str('nodeagent_address')}" in page

        # every reference policy and ablation the allocator lists gets a button
        policies = client.get("/partials/policies").text
        for name in ("baseline", "parfusion", "static", "edf-only", "no-degrade", "no-preemption"):
            assert f'data-policy="{name}"' in policies

        done = client.post("/actions/policy?name=baseline", headers=HTMX).text
        assert "policy baseline active" in done
        assert _active(allocator) == "baseline"
        _wait(lambda: 'id="active-policy">baseline<' in client.get("/partials/cockpit").text)
        events = client.get("/partials/events").text
        assert "set policy baseline" in events
        refused = client.post("/actions/policy?name=nope", headers=HTMX).text
        assert "SetPolicy nope failed" in refused and "INVALID_ARGUMENT" in refused

        client.post("/actions/policy?name=parfusion", headers=HTMX)
        calm = client.get("/partials/preview?cpu=0&gpu=0&network=0&rate=1").text
        storm = client.get("/partials/preview?cpu=0.9&gpu=0.8&network=0.5&rate=3").text
        assert 'id="preview-table"' in storm
        assert _rows(calm, "preview-table") != _rows(storm, "preview-table")
        assert _active(allocator) == "parfusion"  # nothing applied


def test_guided_demo_drives_the_allocator_and_reports_what_failed(
    allocator: RunningAllocator, dashboard_settings: Callable[..., ServiceSettings]
) -> None:
    settings = dashboard_settings(allocator_address=allocator.address, demo_stage_seconds=0.6)
    with TestClient(create_app(settings)) as client:
        own = {"Sec-Fetch-Site": "none"}  # typed or bookmarked: the user's own navigation
        assert 'hx-trigger="load"' in client.get("/?story=guided", headers=own).text
        client.post("/actions/demo/start", headers=HTMX)
        seen: list[str] = []
        policies: list[str] = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            page = client.get("/?story=guided").text  # a reload shows the current stage
            stage = re.search(r'id="demo-caption" class="caption" data-stage="(\w+)"', page)
            if stage and (not seen or seen[-1] != stage.group(1)):
                seen.append(stage.group(1))
            if not policies or policies[-1] != _active(allocator):
                policies.append(_active(allocator))
            if 'id="demo-status">done<' in page:
                break
            assert 'hx-trigger="load"' not in page or not seen  # never restarted while running
            time.sleep(0.1)
        assert seen == ["baseline", "parfusion", "urgent", "disturbance", "recovery"]
        assert policies[-2:] == ["baseline", "parfusion"]
        demo = client.get("/partials/demo").text
        assert "SetPolicy baseline (was parfusion)" in demo
        ends = re.findall(r'class="outcome">at the end: ([^<]*)<', demo)
        assert len(ends) == 5 and all("contention" in e and " p99 " in e for e in ends), ends
        assert (
            f"robot mission not started: bridge unreachable at {settings.get_str('bridge_url')}"
            in demo
        )
        assert (
            f"InjectDisturbance failed: nodeagent unreachable at {settings.get_str('nodeagent_address')}"
            in demo
        )
        chart = client.get("/partials/latency").text
        for label in ("1 Baseline", "2 PARFusion", "5 Recovery", "guided demo done"):
            assert f'data-label="{label}"' in chart


def test_a_node_with_more_intents_than_a_table_shows(
    allocator: RunningAllocator, dashboard_settings: Callable[..., ServiceSettings]
) -> None:
    """With more intents than TABLE_ROWS the tables show TABLE_ROWS rows and say how many
    there are, the chart draws at most CHART_SERIES online intents and says so, and a
    throttled intent is among the allocation rows shown whatever its name."""
    jobs, online = TABLE_ROWS + 50, CHART_SERIES + 3
    with channel(allocator.address) as ch:
        stub = allocator_pb2_grpc.AllocatorServiceStub(ch)
        batch = [batch_intent(f"job-{k:03d}", f"job-{k:03d}") for k in range(jobs)]
        web = [online_intent(f"web-{k}", f"web-{k}", deadline_ms=500.0) for k in range(online)]
        # a deadline no allocation can meet: the plan throttles or degrades it
        hopeless = online_intent("zz-hopeless", "zz-hopeless", deadline_ms=1.0)
        for intent in (*batch, *web, hopeless):
            stub.SubmitIntent(allocator_pb2.SubmitIntentRequest(intent=intent), timeout=5)
    total = jobs + online + 1 + 3  # and the three demo intents
    settings = dashboard_settings(allocator_address=allocator.address)
    with TestClient(create_app(settings)) as client:
        _wait(lambda: f"of {total:,} allocations" in client.get("/partials/allocator").text)
        table = client.get("/partials/allocator").text
        rows = _rows(table, "allocation-table")
        assert len(rows) == TABLE_ROWS
        assert "zz-hopeless" in rows  # last by name, first by attention
        intents = client.get("/partials/intents").text
        assert len(re.findall(r'<tr data-intent="', intents)) == TABLE_ROWS
        assert f"of {total:,} intents" in intents
        _wait(lambda: "charting" in client.get("/partials/latency").text)
        latency = client.get("/partials/latency").text
        assert f"charting {CHART_SERIES} of" in latency
        page = client.get("/").text
        assert len(page) < 400_000  # the page grows with TABLE_ROWS, not with the intents


def _telemetry_reads() -> float:
    labels = {"service": "NodeAgentService", "method": "GetNodeTelemetry", "code": "OK"}
    return REGISTRY.get_sample_value("parfusion_grpc_requests_total", labels) or 0.0


def test_a_node_with_thousands_of_pools_is_read_every_fifth_poll(
    home: Path, dashboard_settings: Callable[..., ServiceSettings]
) -> None:
    """A real node agent (modeled) given a plan of LARGE_NODE_POOLS + 1 intents: the dashboard
    reads its whole telemetry (about 0.1 s of the agent at 10,000) once every LARGE_NODE_EVERY
    polls instead of every poll."""
    settings = build_settings(
        "nodeagent", overrides={"port": 0, "backend": "modeled"}, env={"PARFUSION_HOME": str(home)}
    )
    agent = start_nodeagent(settings)
    try:
        address = f"127.0.0.1:{agent.server.port}"
        plan = intent_pb2.NodePlan(node="node-0", generation=1, policy="parfusion")
        for k in range(LARGE_NODE_POOLS + 1):
            plan.allocations.add(
                intent_id=f"job-{k}", intent_name=f"job-{k}",
                workload_class=intent_pb2.WORKLOAD_CLASS_BATCH, base_service_ms=10.0,
            )  # fmt: skip
        with channel(address) as ch:
            nodeagent_pb2_grpc.NodeAgentServiceStub(ch).ApplyNodePlan(
                nodeagent_pb2.ApplyNodePlanRequest(plan=plan), timeout=30
            )
        dashboard = create_app(dashboard_settings(nodeagent_address=address, refresh_ms=60_000.0))
        with TestClient(dashboard) as client:
            _wait(lambda: "pools (most workers" in client.get("/partials/node").text)
            before = _telemetry_reads()
            observer = client.app.state.dashboard.observer  # type: ignore[attr-defined]
            for _ in range(LARGE_NODE_EVERY * 3):
                client.portal.call(observer.poll)
            assert _telemetry_reads() - before == 3
            assert f"read every {LARGE_NODE_EVERY} refreshes" in client.get("/partials/node").text
    finally:
        agent.stop(grace=1.0)
