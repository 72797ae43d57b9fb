"""PARFusion on a real Kubernetes control plane: intents reconciled, node state watched, pods
placed by kube-scheduler calling the extender (tests/kube/conftest.py builds the cluster).

The tests run in file order on one cluster: the last one stops a node's allocator.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import httpx
import pytest

from parfusion.v1 import allocator_pb2, allocator_pb2_grpc, intent_pb2
from services.allocator.kubestatus import STATE_RESIDENTS
from tests.kube.conftest import NODES, STALE_S, Cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]
SCHEDULER = "parfusion-scheduler"


def resource_intent(name: str, node: str | None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"workloadClass": "BATCH", **spec}
    if node is not None:
        body["node"] = node
    return {
        "apiVersion": "parfusion.io/v1",
        "kind": "ResourceIntent",
        "metadata": {"name": name, "namespace": "default"},
        "spec": body,
    }


def pod(name: str, intent: dict[str, Any] | None, node: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if intent is not None:
        meta["annotations"] = {"parfusion.io/intent": json.dumps(intent)}
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "containers": [{"name": "main", "image": "registry.invalid/none:0"}],
    }
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


# an online intent that needs at least 4 units to meet its deadline (p99 at 1 unit ~ 4x deadline)
NEEDS_FOUR = {
    "workloadClass": "ONLINE",
    "priority": 700,
    "slo": {"deadlineMs": 30},
    "parallelism": {"min": 4, "max": 6},
    "speedup": {"parallelFraction": 0.95, "baseServiceMs": 80},
}


def status_of(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.plane.get("resourceintent", name).get("status") or {}


def state_of(cluster: Cluster, node: str) -> dict[str, Any]:
    return cluster.plane.get("nodeintentstate", node).get("status") or {}


def test_resource_intents_applied_with_kubectl_get_a_status(cluster: Cluster) -> None:
    cluster.plane.apply(
        resource_intent(
            "web",
            "node-a",
            workloadClass="ONLINE",
            slo={"deadlineMs": 50},
            parallelism={"min": 1, "max": 4},
            speedup={"parallelFraction": 0.9, "baseServiceMs": 20},
        ),
        resource_intent("no-deadline", "node-a", workloadClass="ONLINE"),
        resource_intent("template", None),
    )
    status = wait_for(
        lambda: (s := status_of(cluster, "web")).get("decision") not in (None, "Pending") and s,
        "a decision for ResourceIntent web",
        timeout=15,
    )
    assert status["decision"] in ("Admitted", "Degraded", "Throttled")
    assert status["node"] == "node-a" and status["observedGeneration"] == 1
    assert status["units"] >= 1 and status["slackMs"] > 0 and status["reason"]
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert set(conditions) == {"Admitted", "Degraded", "Throttled", "Preempted"}
    assert conditions["Admitted"] == "True"

    invalid = wait_for(lambda: status_of(cluster, "no-deadline"), "the invalid one's status")
    assert invalid["decision"] == "Invalid" and "slo.deadline_ms" in invalid["reason"]
    # it names no node: no allocator adopts it, nothing writes its status
    assert status_of(cluster, "template") == {}

    # a spec change is a new generation: adopted again, and the status says which it saw
    cluster.plane.kubectl(
        "patch", "resourceintent", "web", "--type=merge", "-p", '{"spec":{"priority":900}}'
    )
    wait_for(
        lambda: status_of(cluster, "web").get("observedGeneration") == 2, "observedGeneration 2"
    )
    printed = cluster.plane.kubectl("get", "resourceintents")
    assert "DECISION" in printed and "Invalid" in printed

    # deleted: the allocator drops it from its store and its NodeIntentState
    uid = cluster.plane.get("resourceintent", "web")["metadata"]["uid"]
    assert wait_for(lambda: uid in {r["id"] for r in state_of(cluster, "node-a")["residents"]},
                    "web resident on node-a")  # fmt: skip
    cluster.plane.kubectl("delete", "resourceintent", "web", "no-deadline", "template")
    wait_for(
        lambda: uid not in {r["id"] for r in state_of(cluster, "node-a")["residents"]},
        "web gone from node-a's state",
    )


def test_every_node_publishes_its_state_and_the_extender_watches_it(cluster: Cluster) -> None:
    for node, cpus in NODES.items():
        state = wait_for(lambda n=node: state_of(cluster, n), f"{node}'s NodeIntentState")
        assert state["nodeName"] == node and state["capacityUnits"] == cpus
        assert state["heartbeat"]
    fresh = wait_for(
        lambda: set(NODES) <= set(cluster.extender_state()["node_states"]["fresh"]) and True,
        "every node fresh in the extender's /state",
    )
    assert fresh
    summary = cluster.extender_state()["node_states"]
    assert summary["stale_after_s"] == STALE_S
    assert all(w["synced"] for w in summary["watches"].values())
    record = cluster.node_record("node-c")
    assert record is not None and record["cpu_units"] == NODES["node-c"]
    assert record["telemetry_age_s"] is not None
    port = cluster.nodes["node-a"].env["PARFUSION_ALLOCATOR_METRICS_PORT"]
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert 'parfusion_allocator_kube_writes_total{kind="state",outcome="ok"}' in metrics


def _bound(cluster: Cluster, name: str) -> str:
    return cluster.plane.get("pod", name)["spec"].get("nodeName", "")


def test_a_pod_that_cannot_meet_its_deadline_on_busy_nodes_goes_where_there_is_slack(
    cluster: Cluster,
) -> None:
    # node-a and node-b (the larger ones) are busy: batch work holding 14 of their 16 units
    busy = {"parallelism": {"min": 14, "max": 16}, "speedup": {"baseServiceMs": 50}}
    cluster.plane.apply(
        resource_intent("busy-a", "node-a", **busy), resource_intent("busy-b", "node-b", **busy)
    )
    for node in ("node-a", "node-b"):
        wait_for(
            lambda n=node: (r := cluster.node_record(n)) and r["free_units"] <= 2,
            f"the extender to see {node} busy",
        )
    cluster.plane.apply(pod("deadline-pod", NEEDS_FOUR))
    node = wait_for(lambda: _bound(cluster, "deadline-pod"), "pod deadline-pod bound")
    assert node == "node-c"
    # the extender bound it (bindVerb) through the API, and it is resident there at once
    state = cluster.extender_state()
    binding = next(b for b in state["bindings"] if b["pod"] == "default/deadline-pod")
    assert binding["mode"] == "api" and binding["node"] == "node-c"
    uid = cluster.plane.get("pod", "deadline-pod")["metadata"]["uid"]
    assert uid in cluster.node_record("node-c")["residents"]
    # and node-c's allocator adopted the bound pod's intent
    wait_for(
        lambda: uid in {r["id"] for r in state_of(cluster, "node-c")["residents"]},
        "node-c's allocator adopting the pod",
    )


def test_pods_bound_by_anyone_become_residents_in_the_extenders_view(cluster: Cluster) -> None:
    # bound by hand (spec.nodeName): no scheduler and no extender /bind saw it
    cluster.plane.apply(pod("by-hand", NEEDS_FOUR, node="node-b"))
    uid = wait_for(lambda: cluster.plane.get("pod", "by-hand")["metadata"]["uid"], "the pod")
    wait_for(lambda: uid in cluster.node_record("node-b")["residents"], "by-hand resident")
    cluster.plane.kubectl("delete", "pod", "by-hand", "--grace-period=0", "--force")
    wait_for(lambda: uid not in cluster.node_record("node-b")["residents"], "by-hand gone")


def test_a_node_with_more_residents_than_its_state_lists(cluster: Cluster) -> None:
    """Past STATE_RESIDENTS the NodeIntentState lists the newest in full and the others by
    id (an API object has a size limit), with the allocator's free units after all of them;
    the extender places with those figures."""
    stack = cluster.nodes["node-b"]
    before = state_of(cluster, "node-b")["residentsTotal"]
    ids = [f"many-{k:04d}" for k in range(STATE_RESIDENTS + 100)]
    with grpc.insecure_channel(stack.address("allocator")) as ch:
        stub = allocator_pb2_grpc.AllocatorServiceStub(ch)
        for intent_id in ids:
            intent = intent_pb2.ResourceIntent(
                id=intent_id, name=intent_id, workload_class=intent_pb2.WORKLOAD_CLASS_BATCH,
                parallelism=intent_pb2.Parallelism(min=1, max=2),
                demand=intent_pb2.Demand(work_units=10),
            )  # fmt: skip
            stub.SubmitIntent(allocator_pb2.SubmitIntentRequest(intent=intent), timeout=10)
        total = before + len(ids)
        state = wait_for(
            lambda: (st := state_of(cluster, "node-b")).get("residentsTotal") == total and st,
            "node-b's state with every resident counted",
            timeout=30,
        )
        listed = [r["id"] for r in state["residents"]]
        assert len(listed) == STATE_RESIDENTS and listed[-1] == ids[-1]  # the newest listed
        assert len(state["omittedResidents"]) == total - STATE_RESIDENTS
        assert set(listed).isdisjoint(state["omittedResidents"])
        assert ids[0] in state["omittedResidents"]
        size = len(json.dumps(cluster.plane.get("nodeintentstate", "node-b")))
        assert size < 1_000_000, size
        wait_for(
            lambda: (
                cluster.node_record("node-b")["free_units"]
                == state_of(cluster, "node-b")["freeUnits"]
            ),
            "the extender's free units to be the allocator's",
        )
        for intent_id in ids:
            stub.DeleteIntent(allocator_pb2.DeleteIntentRequest(id=intent_id), timeout=10)
    wait_for(
        lambda: state_of(cluster, "node-b").get("omittedResidents") == [],
        "node-b listing every resident again",
        timeout=30,
    )


def test_a_node_whose_allocator_stops_goes_stale_and_is_not_preferred(cluster: Cluster) -> None:
    cluster.nodes["node-c"].stop("allocator")
    wait_for(
        lambda: "node-c" in cluster.extender_state()["node_states"]["stale"],
        "node-c stale in /state",
        timeout=STALE_S + 10,
    )
    record = cluster.node_record("node-c")
    assert record is not None and record["telemetry_age_s"] is None  # Node object fallback
    # node-a frees up; node-c (stale) would fit too, but only fresh nodes are preferred
    cluster.plane.kubectl("delete", "resourceintent", "busy-a")
    wait_for(lambda: cluster.node_record("node-a")["free_units"] >= 8, "node-a free again")
    for i in range(3):
        cluster.plane.apply(pod(f"after-{i}", NEEDS_FOUR))
        assert wait_for(lambda i=i: _bound(cluster, f"after-{i}"), f"after-{i} bound") == "node-a"
