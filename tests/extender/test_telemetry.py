"""The node view enriched from a real allocator: both services started by the real launcher on
free ports (`parfusion up --only allocator,extender`), the extender polling GetPlan/ListIntents."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from services.extender import samples
from tests.stack import start_stack


@pytest.mark.integration
@pytest.mark.slow
def test_allocator_telemetry_reaches_the_node_view(home: Path) -> None:
    stack = start_stack(
        home, ["allocator", "extender"], {"PARFUSION_EXTENDER_TELEMETRY_INTERVAL_S": "0.3"}
    )
    try:
        url = stack.address("extender")
        deadline = time.monotonic() + 30
        node = None
        while time.monotonic() < deadline:
            state = httpx.get(f"{url}/state", timeout=2).json()
            if state["nodes"]["with_telemetry"] and state["telemetry"]["reachable"]:
                node = state["nodes"]["nodes"][0]
                break
            time.sleep(0.3)
        assert node is not None, "no telemetry from the allocator"
        assert node["name"] == "node-0" and node["source"] == "telemetry"
        assert node["cpu_units"] > 0
        # a NodeNames call for the allocator's node is decided from that telemetry alone
        batch = {
            "workload_class": "BATCH",
            "parallelism": {"min": 1, "max": 2},
            "demand": {"work_units": 10},
        }
        pod = samples.pod_object("train-0", intent=batch)
        reply = httpx.post(
            f"{url}/filter",
            json={"Pod": pod, "Nodes": None, "NodeNames": ["node-0", "elsewhere"]},
            timeout=5,
        ).json()
        assert "node view" in reply["FailedNodes"]["elsewhere"]
        # the allocator's resident intents count: node-0 fits only if D-MUG leaves a unit free
        if node["free_units"] >= 1:
            assert reply["NodeNames"] == ["node-0"], (reply, node)
        else:
            assert node["residents"], node
            assert "insufficient units" in reply["FailedNodes"]["node-0"], reply
    finally:
        stack.close()
