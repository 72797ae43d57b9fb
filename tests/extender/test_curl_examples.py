"""The curl examples of the README, run verbatim (command strings parsed with shlex) against the
app in the order the README shows them, so they cannot drift from what the extender answers."""

from __future__ import annotations

import shlex
from pathlib import Path

from starlette.testclient import TestClient

from services.common.config import build_settings
from services.extender.app import create_app

POD = (
    '{"metadata":{"name":"detector-0","namespace":"default","uid":"c0ffee00-0000-4000-8000-000000000001",'
    '"annotations":{"parfusion.io/intent":"{\\"workload_class\\":\\"ONLINE\\",\\"slo\\":{\\"deadline_ms\\":40},'
    '\\"parallelism\\":{\\"min\\":2,\\"max\\":8},\\"speedup\\":{\\"parallel_fraction\\":0.9,\\"base_service_ms\\":60},'
    '\\"gpu\\":{\\"lane\\":\\"online\\",\\"share\\":0.5}}"}}}'
)
NODES = (
    '{"metadata":{},"items":['
    '{"metadata":{"name":"gpu-node-a","labels":{"parfusion.io/lane-online":"2"}},"status":{"allocatable":{"cpu":"64","memory":"256Gi","pods":"110"}}},'
    '{"metadata":{"name":"cpu-node-c"},"status":{"allocatable":{"cpu":"32","memory":"128Gi","pods":"110"}}}]}'
)
URL = "http://127.0.0.1:18082"
H = "-H 'Content-Type: application/json'"
EXAMPLES = [
    f"""curl -s {URL}/filter {H} -d '{{"Pod":{POD},"Nodes":{NODES},"NodeNames":null}}'""",
    f"""curl -s {URL}/filter {H} -d '{{"Pod":{POD},"Nodes":null,"NodeNames":["gpu-node-a","cpu-node-c"]}}'""",
    f"""curl -s {URL}/prioritize {H} -d '{{"Pod":{POD},"Nodes":null,"NodeNames":["gpu-node-a","cpu-node-c"]}}'""",
    f"""curl -s {URL}/bind {H} -d '{{"PodName":"detector-0","PodNamespace":"default","PodUID":"c0ffee00-0000-4000-8000-000000000001","Node":"gpu-node-a"}}'""",
    f"""curl -s {URL}/preempt {H} -d '{{"Pod":{POD},"NodeNameToMetaVictims":{{"gpu-node-a":{{"Pods":[{{"UID":"v1"}}],"NumPDBViolations":0}},"cpu-node-c":{{"Pods":[{{"UID":"v2"}}],"NumPDBViolations":0}}}}}}'""",
    f"curl -s {URL}/state",
]


def _run(client: TestClient, command: str) -> object:
    argv = shlex.split(command)
    url = next(a for a in argv if a.startswith("http"))
    path = url.removeprefix(URL)
    if "-d" in argv:
        body = argv[argv.index("-d") + 1].encode()
        r = client.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        r = client.get(path)
    assert r.status_code == 200, (command, r.text)
    return r.json()


def test_readme_curl_examples(home: Path) -> None:
    with TestClient(create_app(build_settings("extender", overrides={"telemetry": False}))) as c:
        nodes_mode, names_mode, scores, bound, preempt, state = (_run(c, e) for e in EXAMPLES)
    assert [n["metadata"]["name"] for n in nodes_mode["Nodes"]["items"]] == ["gpu-node-a"]
    assert "cpu-node-c" in nodes_mode["FailedAndUnresolvableNodes"]
    assert names_mode["NodeNames"] == ["gpu-node-a"] and names_mode["Nodes"] is None
    assert len(scores) == 1 and scores[0]["Host"] == "gpu-node-a" and scores[0]["Score"] >= 1
    assert bound == {"Error": ""}
    assert list(preempt["NodeNameToMetaVictims"]) == ["gpu-node-a"]
    assert state["bindings"][0]["node"] == "gpu-node-a"


if __name__ == "__main__":  # prints the examples for the README
    print("\n".join(EXAMPLES))
