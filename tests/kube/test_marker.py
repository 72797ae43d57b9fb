"""The ``parfusion.io/intent`` marker (docs/kubernetes.md): deploy/'s admission policy adds it to
exactly the pods of the ``parfusion-scheduler`` profile that carry an intent, the shipped
KubeSchedulerConfiguration calls the extender only for marked pods, and the marker (advertised by
no node) keeps no pod from being placed."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from parfusion.deploy_scheduler import SCHEDULER_NAME
from services.core.podintent import ANNOTATION, MARKER, pod_intent
from tests.kube.conftest import Cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]
INTENT_LABELS = {"parfusion.io/class": "BATCH", "parfusion.io/priority": "300"}
SMALL_INTENT = {"workloadClass": "BATCH", "priority": 200, "parallelism": {"min": 1, "max": 2}}
MARKED = {MARKER: "1"}


def container(name: str = "main", marker: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": "registry.invalid/none:0"}
    if marker is not None:  # an extended resource's request must equal its limit
        out["resources"] = {"requests": {MARKER: marker}, "limits": {MARKER: marker}}
    return out


def pod(
    name: str,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    scheduler: str | None = SCHEDULER_NAME,
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"containers": containers or [container()]}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def resources(stored: dict[str, Any]) -> list[dict[str, Any]]:
    """Each container's requests and limits as stored (init containers after the others)."""
    spec = stored["spec"]
    return [
        {k: dict(v) for k, v in (c.get("resources") or {}).items() if k in ("requests", "limits")}
        for c in spec["containers"] + spec.get("initContainers", [])
    ]


def test_the_policy_marks_exactly_the_pods_of_the_profile_that_carry_an_intent(
    cluster: Cluster,
) -> None:
    plain, marked = {}, {"requests": MARKED, "limits": MARKED}
    cases = {
        # (the pod, each container's resources as stored)
        "with-annotation": (
            pod(
                "with-annotation",
                annotations={ANNOTATION: json.dumps(SMALL_INTENT)},
                containers=[container("first"), container("second")],
            ),
            [marked, plain],
        ),
        "with-labels": (pod("with-labels", labels=INTENT_LABELS), [marked]),
        # an invalid intent is still an intent: the extender must see it to say why it refuses
        "with-invalid-labels": (pod("with-invalid-labels", {"parfusion.io/owner": "x"}), [marked]),
        "without-intent": (pod("without-intent", labels={"app": "plain"}), [plain]),
        "other-scheduler": (pod("other-scheduler", INTENT_LABELS, scheduler=None), [plain]),
        "marked-by-hand": (
            pod("marked-by-hand", INTENT_LABELS, containers=[container(), container("b", "2")]),
            [plain, {"requests": {MARKER: "2"}, "limits": {MARKER: "2"}}],
        ),
        "init-marked": (
            pod("init-marked", INTENT_LABELS, init=[container("init", "1")]),
            [plain, marked],
        ),
    }
    with cluster.plane.api() as api:
        for name, (body, _) in cases.items():
            # server-side dry run: admission runs, nothing is stored or scheduled
            reply = api.post("/api/v1/namespaces/default/pods", params={"dryRun": "All"}, json=body)
            assert reply.status_code == 201, (name, reply.text)
            assert resources(reply.json()) == cases[name][1], name
    # and a pod really created keeps its other requests next to the marker
    body = pod("stored", INTENT_LABELS)
    body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
    cluster.plane.apply(body)
    try:
        stored = cluster.plane.get("pod", "stored")
        assert resources(stored) == [{"requests": {"cpu": "100m", **MARKED}, "limits": MARKED}]
    finally:
        cluster.plane.kubectl("delete", "pod", "stored", "--wait=false", check=False)


LABEL_KEYS = st.sampled_from(
    [
        "parfusion.io/class",
        "parfusion.io/priority",
        "parfusion.io/intent",
        "parfusion.io/owner",
        "parfusion.iox/class",
        "xparfusion.io/class",
        "example.com/parfusion.io",
        "app",
    ]
)
ANNOTATION_KEYS = st.sampled_from(
    [ANNOTATION, "parfusion.io/other", "example.com/intent", "intent", "parfusion.io"]
)
LABEL_VALUES = st.sampled_from(["", "BATCH", "online", "300", "x"])
ANNOTATION_VALUES = st.text(st.characters(exclude_categories=("Cs",)), max_size=24)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    labels=st.dictionaries(LABEL_KEYS, LABEL_VALUES, max_size=3),
    annotations=st.dictionaries(ANNOTATION_KEYS, ANNOTATION_VALUES, max_size=2),
    scheduler=st.sampled_from([SCHEDULER_NAME, "default-scheduler", None]),
    containers=st.integers(1, 3),
    marked_by_hand=st.sampled_from([None, "container", "init"]),
)
def test_fuzz_the_policy_agrees_with_the_extenders_reading_of_a_pod(
    cluster: Cluster,
    labels: dict[str, str],
    annotations: dict[str, str],
    scheduler: str | None,
    containers: int,
    marked_by_hand: str | None,
) -> None:
    """Marked by the API server exactly when podintent.py finds an intent (the extender would
    act on it), the pod is for the PARFusion profile and no container marks it already."""
    body = pod(
        "fuzz",
        labels,
        annotations,
        scheduler,
        containers=[
            container(
                f"c{i}", "1" if marked_by_hand == "container" and i == containers - 1 else None
            )
            for i in range(containers)
        ],
        init=[container("init", "1")] if marked_by_hand == "init" else None,
    )
    with cluster.plane.api() as api:
        reply = api.post("/api/v1/namespaces/default/pods", params={"dryRun": "All"}, json=body)
    assert reply.status_code == 201, reply.text
    meta = SimpleNamespace(
        name="fuzz", namespace="default", uid="", labels=labels, annotations=annotations
    )
    expect_marked = (
        pod_intent(meta).present and scheduler == SCHEDULER_NAME and marked_by_hand is None
    )
    marked, plain = {"requests": MARKED, "limits": MARKED}, {}
    expected = [
        marked
        if (marked_by_hand == "container" and i == containers - 1) or (expect_marked and i == 0)
        else plain
        for i in range(containers)
    ]
    if marked_by_hand == "init":
        expected.append(marked)
    assert resources(reply.json()) == expected


def filtered_pods(cluster: Cluster) -> dict[str, float]:
    """The extender's count of pods seen by /filter, by where their intent came from."""
    text = httpx.get(f"{cluster.extender_url}/metrics", timeout=5).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "parfusion_extender_pods":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels["verb"] == "filter":
                    out[sample.labels["intent"]] = sample.value
    return out


def test_the_shipped_scheduler_sends_only_pods_with_intents_to_the_extender_and_places_all(
    cluster: Cluster,
) -> None:
    before = filtered_pods(cluster)
    pods = {
        "routed-annotation": pod(
            "routed-annotation", annotations={ANNOTATION: json.dumps(SMALL_INTENT)}
        ),
        "routed-labels": pod("routed-labels", labels=INTENT_LABELS),
        "routed-plain": pod("routed-plain"),
    }
    # created without the marker, as a user would: the policy adds it
    cluster.plane.apply(*pods.values())
    try:
        for name in pods:
            wait_for(
                lambda name=name: cluster.plane.get("pod", name)["spec"].get("nodeName"),
                f"{name} to be bound",
                timeout=60,
            )
        after = filtered_pods(cluster)
        # the two with an intent reached /filter with it; the plain one never did
        assert after.get("annotation", 0) - before.get("annotation", 0) == 1
        assert after.get("labels", 0) - before.get("labels", 0) == 1
        assert after.get("none", 0) - before.get("none", 0) == 0
        # the extender bound the two (bindVerb); kube-scheduler bound the plain one itself
        bound_by_extender = {b["pod"] for b in cluster.extender_state()["bindings"]}
        assert {"default/routed-annotation", "default/routed-labels"} <= bound_by_extender
        assert "default/routed-plain" not in bound_by_extender
    finally:
        cluster.plane.kubectl("delete", "pod", *pods, "--wait=false", check=False)
