"""The extender against hostile requests (issue items 3, 4, 5 and 7), reproduced as filed:
cache poisoning through NodeNames, numbers that size memory, bodies and annotations that broke
the decoder, and malformed tokens. Each is a 400 (or 401) with the reason, never a 500, and
kube-scheduler's own payloads keep working afterwards."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from starlette.testclient import TestClient

from services.common.config import build_settings
from services.extender import samples
from services.extender.app import create_app
from services.extender.nodeview import MAX_CPU_UNITS, MAX_GPUS_PER_NODE, cpu_quantity


@pytest.fixture
def client(home: Path) -> Iterator[TestClient]:
    settings = build_settings("extender", overrides={"telemetry": False, "max_body_bytes": 1 << 20})
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


def _post(client: TestClient, verb: str, body: object | bytes) -> tuple[int, object]:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    r = client.post(f"/{verb}", content=content, headers={"Content-Type": "application/json"})
    return r.status_code, r.json()


def _pod() -> dict:
    return samples.pod_object("detector-0", intent=samples.ONLINE_INTENT)


def _node(name: str = "gpu-node-a", **labels: str) -> dict:
    node = copy.deepcopy(samples.sample_node_objects()[0])
    node["metadata"]["name"] = name
    node["metadata"].pop("resourceVersion", None)
    node["metadata"]["labels"].update(labels)
    return node


def test_nodes_and_nodenames_must_agree_and_never_poison_the_view(client: TestClient) -> None:
    pod = _pod()
    for names in (["ghost-q"], ["gpu-node-a", "ghost-q"], []):
        status, body = _post(
            client, "filter", {"Pod": pod, "Nodes": {"items": [_node()]}, "NodeNames": names}
        )
        assert status == 400 and body["field"] == "NodeNames", names
    # the ghost was never learned: alone, it is failed as unknown and scores 0 (/prioritize
    # leaves zero scores out: kube-scheduler counts an absent host as 0)
    status, reply = _post(client, "filter", {"Pod": pod, "NodeNames": ["ghost-q"]})
    assert status == 200 and reply["NodeNames"] == [] and "ghost-q" in reply["FailedNodes"]
    status, scores = _post(client, "prioritize", {"Pod": pod, "NodeNames": ["ghost-q"]})
    assert status == 200 and scores == []
    # a consistent request with both is fine
    status, reply = _post(
        client, "filter", {"Pod": pod, "Nodes": {"items": [_node()]}, "NodeNames": ["gpu-node-a"]}
    )
    assert status == 200 and [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == [
        "gpu-node-a"
    ]


def test_a_claimed_resource_version_cannot_shadow_the_real_node(client: TestClient) -> None:
    real = _node()
    real["metadata"]["resourceVersion"] = "77"
    fake = copy.deepcopy(real)
    fake["metadata"]["labels"]["parfusion.io/cpu-units"] = "2"
    for node in (fake, real):
        status, _ = _post(client, "filter", {"Pod": _pod(), "Nodes": {"items": [node]}})
        assert status == 200
    (learned,) = client.get("/state").json()["nodes"]["nodes"]
    assert learned["cpu_units"] == cpu_quantity(real["status"]["allocatable"]["cpu"]) > 2


@pytest.mark.parametrize(
    ("labels", "allocatable", "field"),
    [
        ({"parfusion.io/lane-online": "1e7"}, "64", "labels[parfusion.io/lane-online]"),
        ({"parfusion.io/lane-online": "1e9"}, "64", "labels[parfusion.io/lane-online]"),
        ({"parfusion.io/lane-online": "40", "parfusion.io/lane-batch": "40"}, "64", "lane-"),
        ({"parfusion.io/cpu-units": "1e6"}, "64", "labels[parfusion.io/cpu-units]"),
        ({}, "1e400", "status.allocatable.cpu"),
        ({}, "inf", "status.allocatable.cpu"),
        ({}, "nan", "status.allocatable.cpu"),
        ({}, "9" * 400, "status.allocatable.cpu"),
    ],
)
def test_numbers_from_nodes_are_bounded_with_a_clear_400(
    client: TestClient, labels: dict[str, str], allocatable: str, field: str
) -> None:
    node = _node("bomb-node", **labels)
    node["status"]["allocatable"]["cpu"] = allocatable
    for verb in ("filter", "prioritize"):
        status, body = _post(client, verb, {"Pod": _pod(), "Nodes": {"items": [node]}})
        assert status == 400, (verb, body)
        assert field in body["field"] and body["field"].startswith("Nodes.items[0]")
        assert (
            str(MAX_GPUS_PER_NODE) in body["error"]
            or str(MAX_CPU_UNITS) in body["error"]
            or ("quantity" in body["error"])
        )
    assert client.get("/state").json()["nodes"]["count"] == 0  # nothing of it was learned


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    "body",
    [
        b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["a"], "x": '
        + _deep(5000).encode()
        + b"}",
        b'{"Pod": ' + b'{"a":' * 3000 + b"1" + b"}" * 3000 + b', "NodeNames": []}',
        b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{"metadata": {"name": "\xff\xfe"}}]}}',
        b'{"Pod": {"metadata": {"name": "\xc3"}}, "NodeNames": ["a"]}',
        b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": [1e400]}',
        b'{"Pod": {"metadata": {"name": "p"}, "spec": {"priority": '
        + b"9" * 400
        + b'}}, "NodeNames": []}',
        b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": "gpu-node-a"}',
        b"[]",
        b"\xff",
    ],
    ids=[
        "deep-body",
        "deep-pod",
        "utf8-in-node",
        "utf8-in-pod",
        "1e400",
        "huge-int",
        "type",
        "list",
        "byte",
    ],
)
def test_malformed_bodies_are_400_with_the_reason(client: TestClient, body: bytes) -> None:
    for verb in ("filter", "prioritize"):
        status, reply = _post(client, verb, body)
        assert status == 400, (verb, reply)
        assert reply["error"]
    for verb in ("preempt", "bind"):  # they read other fields: bad or not, never a 500
        status, reply = _post(client, verb, body)
        assert status in (200, 400), (verb, reply)


@pytest.mark.parametrize(
    "annotation",
    [
        _deep(1000),
        '{"name": "x", "workload_class": "ONLINE", "labels": ' + '{"a":' * 1000 + "1" + "}" * 1001,
        '{"workload_class": "ONLINE", "slo": {"deadline_ms": ' + "1" * 400 + "}}",
        '{"workload_class": "ONLINE", "slo": {"deadline_ms": 1e400}}',
        '{"workload_class": "ONLINE", "slo": {"deadline_ms": NaN}}',
        '{"workload_class": "ONLINE", "priority": ' + "9" * 30 + "}",
        '{"workload_class": "WORKLOAD_CLASS_WHATEVER"}',
        "x" * 100_000,
    ],
    ids=["deep-list", "deep-labels", "400-digits", "1e400", "nan", "huge-priority", "enum", "big"],
)
def test_hostile_annotations_make_the_pod_unresolvable_not_the_extender_fail(
    client: TestClient, annotation: str
) -> None:
    pod = samples.pod_object("evil-0")
    pod["metadata"].setdefault("annotations", {})["parfusion.io/intent"] = annotation
    status, reply = _post(
        client, "filter", samples.extender_args(pod, samples.sample_node_objects(), False)
    )
    assert status == 200, reply
    assert reply["Nodes"]["items"] == []
    reasons = set(reply["FailedAndUnresolvableNodes"].values())
    assert len(reasons) == 1, reasons
    reason = reasons.pop()
    assert "parfusion.io/intent" in reason or "invalid intent" in reason, reason


def test_kube_schedulers_own_payloads_still_work(client: TestClient) -> None:
    nodes = samples.sample_node_objects()
    status, reply = _post(client, "filter", samples.extender_args(_pod(), nodes, by_names=False))
    assert status == 200 and [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == [
        "gpu-node-a",
        "gpu-node-b",
    ]
    status, reply = _post(client, "filter", samples.extender_args(_pod(), nodes, by_names=True))
    assert status == 200 and reply["NodeNames"] == ["gpu-node-a", "gpu-node-b"]
    status, scores = _post(client, "prioritize", samples.extender_args(_pod(), nodes, True))
    # every host that can take the pod is scored; the others are left out (an absent host is 0)
    assert status == 200
    assert {s["Host"] for s in scores} <= {n["metadata"]["name"] for n in nodes}
    assert {s["Host"] for s in scores if s["Score"] > 0} >= {"gpu-node-a", "gpu-node-b"}
    status, bound = _post(
        client,
        "bind",
        {"PodName": "detector-0", "PodNamespace": "default", "PodUID": "u", "Node": "gpu-node-a"},
    )
    assert status == 200 and bound == {"Error": ""}


def test_malformed_tokens_are_401(home: Path) -> None:
    settings = build_settings(
        "extender", overrides={"telemetry": False}, env={"PARFUSION_API_TOKEN": "s3cret"}
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        body = json.dumps(samples.extender_args(_pod(), samples.sample_node_objects(), True))
        for headers in (
            [(b"x-api-token", b"\xff")],
            [(b"authorization", "Bearer é".encode())],
            [(b"authorization", b"Bearer")],
            [],
        ):
            r = client.post("/filter", content=body, headers=headers)
            assert r.status_code == 401, headers
        ok = client.post("/filter", content=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
