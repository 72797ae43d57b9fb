"""The extender under fuzzed kube-scheduler requests: /filter, /prioritize, /bind and /preempt
bodies mutated from kube-scheduler's own payloads (the pod's intent annotation too). No answer
may be a 5xx; afterwards the extender is healthy and answers a real payload as before."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient

from services.common.config import build_settings
from services.extender import samples
from services.extender.app import create_app
from tests.fuzzing import encode, fuzz_settings, json_bodies, mutated_documents

NODES = samples.sample_node_objects()
POD = samples.pod_object("detector-0", intent=samples.ONLINE_INTENT)
EXAMPLES = {
    "filter": [samples.extender_args(POD, NODES, False), samples.extender_args(POD, NODES, True)],
    "prioritize": [
        samples.extender_args(POD, NODES, False),
        samples.extender_args(POD, NODES, True),
    ],
    "bind": [
        {"PodName": "detector-0", "PodNamespace": "default", "PodUID": "u-1", "Node": "gpu-node-a"}
    ],
    "preempt": [
        {
            "Pod": POD,
            "NodeNameToMetaVictims": {
                "gpu-node-a": {"Pods": [{"UID": "v-1"}], "NumPDBViolations": 0}
            },
        }
    ],
}


@pytest.fixture
def client(home: Path) -> Iterator[TestClient]:
    settings = build_settings("extender", overrides={"telemetry": False, "max_body_bytes": 1 << 20})
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


@st.composite
def annotated_pods(draw: st.DrawFn) -> bytes:
    """A /filter body whose pod carries a mutated intent annotation (the intent's own JSON,
    damaged, inside the string)."""
    inner = encode(draw(mutated_documents(samples.ONLINE_INTENT)))
    pod = json.loads(json.dumps(POD))
    pod["metadata"]["annotations"]["parfusion.io/intent"] = inner.decode("utf-8", "surrogateescape")
    args = samples.extender_args(pod, NODES, draw(st.booleans()))
    return json.dumps(args).encode()


def test_no_request_gets_a_5xx(client: TestClient) -> None:
    @fuzz_settings()
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        verb = data.draw(st.sampled_from(sorted(EXAMPLES)), label="verb")
        if verb == "filter" and data.draw(st.booleans(), label="annotation"):
            body = data.draw(annotated_pods(), label="body")
        else:
            valid = data.draw(st.sampled_from(EXAMPLES[verb]), label="valid")
            body = data.draw(json_bodies(valid), label="body")
        reply = client.post(f"/{verb}", content=body, headers={"Content-Type": "application/json"})
        assert reply.status_code < 500, (verb, reply.status_code, reply.text[:300])
        assert reply.headers["x-content-type-options"] == "nosniff"  # security headers
        if reply.status_code >= 400:
            assert reply.json()["error"]  # a reason, not an empty 4xx

    fuzz()
    assert client.get("/healthz").status_code == 200
    reply = client.post("/filter", content=orjson.dumps(samples.extender_args(POD, NODES, False)))
    assert reply.status_code == 200
    kept = {n["metadata"]["name"] for n in reply.json()["Nodes"]["items"]}
    assert kept <= {"gpu-node-a", "gpu-node-b"}  # fuzzed binds may have used capacity up
    assert set(reply.json()["FailedAndUnresolvableNodes"]) == {"cpu-node-c", "edge-node-d"}
