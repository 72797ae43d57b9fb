"""deploy/ parses, agrees with the service table, and its cross-references resolve."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import json_format

from parfusion import deploy
from parfusion.deploy_objects import NAMESPACE, NODE_SERVICES
from parfusion.deploy_scheduler import MARKER_POLICY, SCHEDULER_NAME
from parfusion.services import BY_NAME, SERVICES
from parfusion.v1 import intent_pb2
from services.core.convert import intents_in_file
from services.core.podintent import MARKER
from tests.conftest import ROOT

CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
}
SYSTEM_ROLES = {
    "system:kube-scheduler",
    "system:volume-scheduler",
    "extension-apiserver-authentication-reader",
}


def _all_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert isinstance(doc, dict), path
            docs.append(doc)
    return docs


def _objects() -> list[dict[str, Any]]:
    return [d for d in _all_docs() if d["kind"] != "KubeSchedulerConfiguration"]


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _objects() if d["kind"] == kind}


def test_committed_files_are_the_rendered_output() -> None:
    rendered = deploy.render_manifests()
    on_disk = {str(p.relative_to(ROOT / "deploy")) for p in (ROOT / "deploy").rglob("*.yaml")}
    assert on_disk == set(rendered), "run `python -m parfusion.deploy`"
    for name, docs in rendered.items():
        assert (ROOT / "deploy" / name).read_text() == deploy.manifest_text(docs), (
            f"deploy/{name} is stale"
        )


def test_every_object_is_well_formed_and_namespaced() -> None:
    seen = set()
    for doc in _objects():
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"]
        key = (doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"])
        assert key not in seen, f"duplicate {key}"
        seen.add(key)
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in doc["metadata"]
        elif doc["kind"] not in ("Pod", "ResourceIntent"):  # examples live with the workloads
            assert doc["metadata"]["namespace"] in (NAMESPACE, "kube-system"), key


def _workloads() -> dict[str, dict[str, Any]]:
    return {**_by_kind("Deployment"), **_by_kind("DaemonSet")}


def test_every_service_runs_with_the_tables_command_and_ports() -> None:
    containers: dict[str, tuple[str, dict[str, Any]]] = {}
    for workload in _workloads().values():
        for c in workload["spec"]["template"]["spec"]["containers"]:
            containers[c["name"]] = (workload["kind"], c)
    for spec in SERVICES:
        kind, c = containers[spec.name]
        assert kind == ("DaemonSet" if spec.name in NODE_SERVICES else "Deployment")
        assert c["command"] == spec.command(host="0.0.0.0")
        assert tuple(p["containerPort"] for p in c["ports"]) == spec.ports
        probe = c["readinessProbe"]
        assert (probe.get("grpc") or probe.get("httpGet"))["port"] == spec.port


def test_selectors_match_templates_and_services_reach_container_ports() -> None:
    workloads = _workloads()
    for name, w in workloads.items():
        selector = w["spec"]["selector"]["matchLabels"]
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), name
    for name, svc in _by_kind("Service").items():
        matches = [
            w
            for w in workloads.values()
            if svc["spec"]["selector"].items()
            <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matches) == 1, f"Service {name} selects {len(matches)} workloads"
        ports = {
            p["containerPort"]
            for c in matches[0]["spec"]["template"]["spec"]["containers"]
            for p in c["ports"]
        }
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports, (name, port)
            assert len(port["name"]) <= 15


def test_service_accounts_and_role_references_exist() -> None:
    accounts = set(_by_kind("ServiceAccount"))
    roles = set(_by_kind("ClusterRole")) | set(_by_kind("Role")) | SYSTEM_ROLES
    for w in _workloads().values():
        account = w["spec"]["template"]["spec"].get("serviceAccountName")
        if account:
            assert account in accounts
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for name, b in _by_kind(kind).items():
            assert b["roleRef"]["name"] in roles, name
            for subject in b["subjects"]:
                assert subject["name"] in accounts and subject["namespace"] == NAMESPACE


def _service_endpoints() -> set[tuple[str, int]]:
    return {
        (f"{name}.{svc['metadata']['namespace']}.svc", p["port"])
        for name, svc in _by_kind("Service").items()
        for p in svc["spec"]["ports"]
    }


def test_cross_service_addresses_resolve_to_services() -> None:
    endpoints = _service_endpoints()
    address = re.compile(r"^(?:https?://)?([a-z0-9.-]+):(\d+)$")
    checked = 0
    for w in _workloads().values():
        for c in w["spec"]["template"]["spec"]["containers"]:
            for env in c.get("env", []):
                m = address.match(str(env.get("value", "")))
                if m and not m.group(1).startswith(("0.0.0.0", "127.")):
                    assert (m.group(1), int(m.group(2))) in endpoints, env
                    checked += 1
    assert checked >= 5


def test_scheduler_configuration_calls_the_extender() -> None:
    config_map = _by_kind("ConfigMap")["parfusion-scheduler-config"]
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert config == yaml.safe_load(
        (ROOT / "deploy/scheduler/kube-scheduler-config.yaml").read_text()
    )
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    [profile] = config["profiles"]
    [ext] = config["extenders"]
    for key in (
        "urlPrefix",
        "filterVerb",
        "prioritizeVerb",
        "bindVerb",
        "weight",
        "httpTimeout",
        "nodeCacheCapable",
        "managedResources",
        "ignorable",
    ):
        assert key in ext, key
    m = re.match(r"^http://([^:/]+):(\d+)$", ext["urlPrefix"])
    assert m and (m.group(1), int(m.group(2))) in _service_endpoints()
    assert (
        m.group(1).startswith("parfusion-extender.") and int(m.group(2)) == BY_NAME["extender"].port
    )
    # the verbs are paths the extender app serves
    from services.common.config import build_settings
    from services.extender.app import create_app

    paths = set(create_app(build_settings("extender", overrides={"telemetry": False})).handlers)
    for verb in ("filterVerb", "prioritizeVerb", "bindVerb", "preemptVerb"):
        assert f"/{ext[verb]}" in paths
    assert ext["weight"] >= 1 and ext["nodeCacheCapable"] is True
    # the second scheduler mounts this config where --config points, runs as its own account
    sched = _by_kind("Deployment")[SCHEDULER_NAME]["spec"]["template"]["spec"]
    [container] = sched["containers"]
    [flag] = [a for a in container["command"] if a.startswith("--config=")]
    mount = container["volumeMounts"][0]
    assert flag.removeprefix("--config=").startswith(mount["mountPath"] + "/")
    volume = next(v for v in sched["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == "parfusion-scheduler-config"
    leases = config["leaderElection"]
    assert (
        leases["resourceName"]
        in _by_kind("Role")[f"{SCHEDULER_NAME}-leader-election"]["rules"][1]["resourceNames"]
    )
    assert _by_kind("Pod")["detector"]["spec"]["schedulerName"] == profile["schedulerName"]


def test_the_extender_manages_the_marker_that_the_shipped_policy_adds() -> None:
    """The scheduler calls the extender only for pods requesting the marker, so deploy/ must
    also ship the admission policy adding it, bound, for this scheduler's pods (what it marks
    is tested against a real API server in tests/kube/test_marker.py)."""
    [ext] = yaml.safe_load((ROOT / "deploy/scheduler/kube-scheduler-config.yaml").read_text())[
        "extenders"
    ]
    assert ext["managedResources"] == [{"name": MARKER, "ignoredByScheduler": True}]
    policy = _by_kind("MutatingAdmissionPolicy")[MARKER_POLICY]
    binding = _by_kind("MutatingAdmissionPolicyBinding")[MARKER_POLICY]
    assert binding["spec"]["policyName"] == MARKER_POLICY
    assert policy["spec"]["failurePolicy"] == "Fail"
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["pods"] and rule["operations"] == ["CREATE"]
    conditions = " ".join(c["expression"] for c in policy["spec"]["matchConditions"])
    assert f'"{SCHEDULER_NAME}"' in conditions
    [mutation] = policy["spec"]["mutations"]
    assert mutation["applyConfiguration"]["expression"].count(f'"{MARKER}": "1"') == 2


def _check(schema: dict[str, Any], value: Any, where: str) -> None:
    """The subset of OpenAPI v3 structural-schema validation the CRD uses."""
    kind = schema["type"]
    if kind == "object":
        assert isinstance(value, dict), where
        if "additionalProperties" in schema:
            for k, v in value.items():
                _check(schema["additionalProperties"], v, f"{where}.{k}")
            return
        for k, v in value.items():
            assert k in schema["properties"], f"{where}.{k} not in the CRD schema"
            _check(schema["properties"][k], v, f"{where}.{k}")
        for k in schema.get("required", []):
            assert k in value, f"{where}.{k} required"
    elif kind == "array":
        assert isinstance(value, list), where
        for i, v in enumerate(value):
            _check(schema["items"], v, f"{where}[{i}]")
    elif kind == "integer":
        assert isinstance(value, int) or (isinstance(value, str) and value.isdigit()), where
        assert int(value) >= schema.get("minimum", int(value)), where
    elif kind == "number":
        assert isinstance(value, (int, float)), where
    elif kind == "boolean":
        assert isinstance(value, bool), where
    else:
        assert isinstance(value, str), where
        assert value in schema.get("enum", [value]), where


def _crd_spec_schema() -> dict[str, Any]:
    crd = _by_kind("CustomResourceDefinition")["resourceintents.parfusion.io"]
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_crd_schema_mirrors_the_proto() -> None:
    schema = _crd_spec_schema()
    fields = {f.json_name for f in intent_pb2.ResourceIntent.DESCRIPTOR.fields} - {"createdAt"}
    assert set(schema["properties"]) == fields
    gpu = {f.json_name for f in intent_pb2.GpuIntent.DESCRIPTOR.fields}
    assert set(schema["properties"]["gpu"]["properties"]) == gpu
    assert schema["properties"]["degradation"]["type"] == "array"
    assert schema["properties"]["labels"]["additionalProperties"] == {"type": "string"}


@pytest.mark.parametrize(
    "path", sorted((ROOT / "configs" / "intents").glob("*.yaml")), ids=lambda p: p.name
)
def test_demo_intents_are_valid_custom_resources(path: Path) -> None:
    schema = _crd_spec_schema()
    for intent in intents_in_file(path):
        _check(schema, json_format.MessageToDict(intent), path.name)


def test_example_resource_intents_match_the_crd() -> None:
    crs = [d for d in _objects() if d["kind"] == "ResourceIntent"]
    crd = _by_kind("CustomResourceDefinition")["resourceintents.parfusion.io"]
    assert len(crs) >= 3
    for cr in crs:
        assert cr["apiVersion"] == f"{crd['spec']['group']}/{crd['spec']['versions'][0]['name']}"
        _check(_crd_spec_schema(), cr["spec"], cr["metadata"]["name"])


def test_schema_check_rejects_what_the_api_server_would() -> None:
    with pytest.raises(AssertionError):
        _check(_crd_spec_schema(), {"workloadClass": "ONLINE", "slo": {"deadline": 5}}, "spec")
    with pytest.raises(AssertionError):
        _check(_crd_spec_schema(), {"workloadClass": "REALTIME"}, "spec")


def test_example_pod_intent_is_accepted_by_the_extender() -> None:
    import msgspec

    from services.extender.podintent import pod_intent
    from services.extender.protocol import Pod

    found = pod_intent(msgspec.convert(_by_kind("Pod")["detector"], Pod))
    assert found.spec is not None and found.spec.workload_class == "ONLINE", found.error
