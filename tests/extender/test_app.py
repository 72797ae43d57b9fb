"""The extender app end to end over HTTP (Starlette TestClient): kube-scheduler-shaped bodies
built from realistic Pod and Node objects, in both modes, plus bad input."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from starlette.testclient import TestClient

from services.common.config import ConfigError, build_settings
from services.extender import samples
from services.extender.app import create_app


@pytest.fixture
def client(home: Path) -> Iterator[TestClient]:
    settings = build_settings("extender", overrides={"telemetry": False, "max_body_bytes": 1 << 20})
    with TestClient(create_app(settings)) as c:
        yield c


def _post(client: TestClient, verb: str, body: object) -> dict | list:
    r = client.post(
        f"/{verb}", content=orjson.dumps(body), headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 200, r.text
    return r.json()


def _online_pod(name: str = "detector-0") -> dict:
    return samples.pod_object(name, intent=samples.ONLINE_INTENT)


def test_filter_nodelist_mode_keeps_lane_nodes_and_gives_reasons(client: TestClient) -> None:
    nodes = samples.sample_node_objects()
    reply = _post(client, "filter", samples.extender_args(_online_pod(), nodes, by_names=False))
    kept = [n["metadata"]["name"] for n in reply["Nodes"]["items"]]
    assert kept == ["gpu-node-a", "gpu-node-b"]
    assert reply["Nodes"]["items"][0] == nodes[0]  # passed through unchanged
    assert reply["NodeNames"] is None and reply["Error"] == ""
    assert set(reply["FailedAndUnresolvableNodes"]) == {"cpu-node-c", "edge-node-d"}
    assert "lane online not present" in reply["FailedAndUnresolvableNodes"]["cpu-node-c"]


def test_nodenames_mode_uses_nodes_learned_from_earlier_lists(client: TestClient) -> None:
    nodes = samples.sample_node_objects()
    by_names = samples.extender_args(_online_pod(), nodes, by_names=True)
    first = _post(client, "filter", by_names)
    # nothing known yet: every node fails with a reason, none is silently kept
    assert first["NodeNames"] == [] and len(first["FailedNodes"]) == 4
    _post(client, "filter", samples.extender_args(_online_pod(), nodes, by_names=False))
    reply = _post(client, "filter", by_names)
    assert reply["Nodes"] is None
    assert reply["NodeNames"] == ["gpu-node-a", "gpu-node-b"]


def test_pod_without_intent_passes_through(client: TestClient) -> None:
    nodes = samples.sample_node_objects()
    plain = samples.pod_object("nginx-1")
    reply = _post(client, "filter", samples.extender_args(plain, nodes, by_names=True))
    assert reply["NodeNames"] == [n["metadata"]["name"] for n in nodes]
    assert reply["FailedNodes"] == {} and reply["FailedAndUnresolvableNodes"] == {}
    scores = _post(client, "prioritize", samples.extender_args(plain, nodes, by_names=False))
    assert scores == []  # 0 everywhere: no host named (kube-scheduler adds nothing for them)


def test_invalid_intent_fails_every_node_as_unresolvable(client: TestClient) -> None:
    bad = copy.deepcopy(samples.ONLINE_INTENT)
    bad["priority"] = 5000
    pod = samples.pod_object("bad-0", intent=bad)
    reply = _post(
        client, "filter", samples.extender_args(pod, samples.sample_node_objects(), False)
    )
    assert reply["Nodes"]["items"] == []
    assert all("priority" in why for why in reply["FailedAndUnresolvableNodes"].values())


def test_prioritize_scores_every_candidate_in_range(client: TestClient) -> None:
    nodes = samples.sample_node_objects()
    scores = _post(
        client, "prioritize", samples.extender_args(_online_pod(), nodes, by_names=False)
    )
    names = [n["metadata"]["name"] for n in nodes]
    assert [s["Host"] for s in scores] == [n for n in names if n in {s["Host"] for s in scores}]
    assert scores and all(1 <= s["Score"] <= 10 for s in scores)  # zeros are left out
    assert "cpu-node-c" not in {s["Host"] for s in scores}  # no online lane: never preferred


def test_bind_standalone_reserves_capacity_and_refuses_when_full(client: TestClient) -> None:
    nodes = [samples.node_object("small-gpu", 8, {"online": 1})]
    intent = copy.deepcopy(samples.ONLINE_INTENT)
    intent["gpu"]["share"] = 0.75
    pods = [samples.pod_object(f"det-{i}", intent=intent) for i in range(2)]
    for pod in pods:
        reply = _post(client, "filter", samples.extender_args(pod, nodes, by_names=False))
        assert len(reply["Nodes"]["items"]) == 1

    def bind(pod: dict) -> dict:
        m = pod["metadata"]
        return _post(
            client,
            "bind",
            {
                "PodName": m["name"],
                "PodNamespace": m["namespace"],
                "PodUID": m["uid"],
                "Node": "small-gpu",
            },
        )

    assert bind(pods[0]) == {"Error": ""}
    # both passed filter before either bound; bind re-checks and the lane share is gone now
    refused = bind(pods[1])
    assert (
        "no longer fits" in refused["Error"]
        and "share units the intent needs free" in refused["Error"]
    )
    after = _post(client, "filter", samples.extender_args(pods[1], nodes, by_names=False))
    assert after["Nodes"]["items"] == [] and "small-gpu" in after["FailedNodes"]
    state = client.get("/state").json()
    assert state["bind_mode"] == "standalone"
    assert [b["pod"] for b in state["bindings"]] == ["default/det-0"]


def test_preempt_drops_nodes_where_the_intent_can_never_fit(client: TestClient) -> None:
    nodes = samples.sample_node_objects()
    _post(client, "filter", samples.extender_args(_online_pod(), nodes, by_names=False))
    body = {
        "Pod": _online_pod(),
        "NodeNameToMetaVictims": {
            "gpu-node-b": {"Pods": [{"UID": "v1"}], "NumPDBViolations": 0},
            "cpu-node-c": {"Pods": [{"UID": "v2"}], "NumPDBViolations": 0},
        },
    }
    reply = _post(client, "preempt", body)
    assert reply == {
        "NodeNameToMetaVictims": {"gpu-node-b": {"Pods": [{"UID": "v1"}], "NumPDBViolations": 0}}
    }


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind", "preempt"])
@pytest.mark.parametrize("body", [b"{", b"[]", b'{"Pod": 3}', b""])
def test_bad_bodies_get_400_with_an_error(client: TestClient, verb: str, body: bytes) -> None:
    r = client.post(f"/{verb}", content=body)
    assert r.status_code == 400
    assert r.json()["error"]


def test_body_size_limit_is_413(client: TestClient) -> None:
    r = client.post("/filter", content=b" " * ((1 << 20) + 1))
    assert r.status_code == 413 and "bytes" in r.json()["error"]


def test_verbs_answer_post_only_with_json_and_the_security_headers(client: TestClient) -> None:
    r = client.get("/filter")
    assert r.status_code == 405 and "POST" in r.json()["error"]
    r = client.post("/filter", content=orjson.dumps(
        samples.extender_args(_online_pod(), samples.sample_node_objects(), False)
    ))  # fmt: skip
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert int(r.headers["content-length"]) == len(r.content)
    assert client.get("/nothing-here").status_code == 404  # other paths reach the app


def test_metrics_state_healthz(client: TestClient) -> None:
    _post(
        client, "filter", samples.extender_args(_online_pod(), samples.sample_node_objects(), False)
    )
    client.post("/filter", content=b"{")
    text = client.get("/metrics").text
    assert 'parfusion_extender_request_duration_seconds_count{verb="filter"} 2.0' in text
    assert 'parfusion_extender_requests_total{code="400",verb="filter"} 1.0' in text
    assert 'parfusion_extender_filter_nodes_total{outcome="unresolvable"} 2.0' in text
    assert 'parfusion_extender_pods_total{intent="annotation",verb="filter"} 1.0' in text
    assert "parfusion_extender_nodes 4.0" in text
    assert client.get("/healthz").json() == {"status": "ok"}
    state = client.get("/state").json()
    assert state["nodes"]["count"] == 4
    assert state["recent_decisions"][-1]["kept"] == 2


def test_token_guards_the_verbs(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARFUSION_API_TOKEN", "s3cret")
    settings = build_settings("extender", overrides={"telemetry": False})
    with TestClient(create_app(settings)) as c:
        body = orjson.dumps(samples.extender_args(_online_pod(), [], True))
        assert c.post("/filter", content=body).status_code == 401
        assert (
            c.post("/filter", content=body, headers={"Authorization": "Bearer s3cret"}).status_code
            == 200
        )


def test_sample_nodes_only_with_the_flag(home: Path) -> None:
    for flag, count in ((False, 0), (True, 4)):
        settings = build_settings("extender", overrides={"telemetry": False, "sample_nodes": flag})
        with TestClient(create_app(settings)) as c:
            assert c.get("/state").json()["nodes"]["count"] == count


def _gpu_nodes(count: int) -> list[dict]:
    return [samples.node_object(f"gpu-{i:03d}", 64, {"online": 4}, index=i) for i in range(count)]


def test_filter_hands_kube_scheduler_a_shortlist_of_the_best_nodes(home: Path) -> None:
    # 40 nodes fit the intent; 8 of them already run one: the other 32 keep more slack
    nodes = _gpu_nodes(40)
    settings = build_settings("extender", overrides={"telemetry": False})
    with TestClient(create_app(settings)) as c:
        _post(c, "filter", samples.extender_args(_online_pod("warm"), nodes, by_names=False))
        for i in range(8):
            m = _online_pod(f"busy-{i}")["metadata"]
            _post(
                c, "filter", samples.extender_args(_online_pod(f"busy-{i}"), nodes, by_names=True)
            )
            bind = {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"],
                    "Node": f"gpu-{i:03d}"}  # fmt: skip
            assert _post(c, "bind", bind)["Error"] == ""
        before = _beyond_shortlist(c)
        reply = _post(c, "filter", samples.extender_args(_online_pod(), nodes, by_names=True))
        kept = reply["NodeNames"]
        assert len(kept) == 32 and kept == sorted(kept)  # candidate order
        assert not set(kept) & {f"gpu-{i:03d}" for i in range(8)}
        assert reply["FailedNodes"] == {} and reply["FailedAndUnresolvableNodes"] == {}
        assert _beyond_shortlist(c) - before == 8


def _beyond_shortlist(c: TestClient) -> float:
    prefix = 'parfusion_extender_filter_nodes_total{outcome="beyond_shortlist"} '
    lines = [x for x in c.get("/metrics").text.splitlines() if x.startswith(prefix)]
    return float(lines[0].removeprefix(prefix)) if lines else 0.0


def test_shortlist_zero_keeps_every_feasible_node(home: Path) -> None:
    nodes = _gpu_nodes(40)
    settings = build_settings("extender", overrides={"telemetry": False, "shortlist_nodes": 0})
    with TestClient(create_app(settings)) as c:
        reply = _post(c, "filter", samples.extender_args(_online_pod(), nodes, by_names=False))
        assert len(reply["Nodes"]["items"]) == 40


@pytest.mark.parametrize("bad", [-1, 100_001, 2.5, True, "32"])
def test_shortlist_setting_is_bounded_and_named(home: Path, bad: object) -> None:
    settings = build_settings("extender", overrides={"telemetry": False, "shortlist_nodes": bad})
    with pytest.raises(ConfigError, match="extender.shortlist_nodes"):
        create_app(settings)
