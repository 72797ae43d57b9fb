"""The optional ``parfusion.io/intent`` marker (docs/kubernetes.md): with it in the extender's
``managedResources`` a real kube-scheduler calls the extender only for pods requesting it, and
the marker (advertised by no node) does not keep those pods from being placed."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import free_port
from tests.kube.conftest import Cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MARKER = "parfusion.io/intent"
SCHEDULER = "parfusion-marked"
INTENT_LABELS = {"parfusion.io/class": "BATCH", "parfusion.io/priority": "300"}


@pytest.fixture
def marked_scheduler(cluster: Cluster) -> Iterator[str]:
    """A second kube-scheduler (profile ``parfusion-marked``) whose extender is the cluster's,
    managing only the marker; its name for ``spec.schedulerName``."""
    plane = cluster.plane
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": plane.kubeconfig},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": SCHEDULER}],
        "extenders": [
            {
                "urlPrefix": cluster.extender_url,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "weight": 5,
                "nodeCacheCapable": True,
                "ignorable": False,
                "managedResources": [{"name": MARKER, "ignoredByScheduler": True}],
            }
        ],
    }
    path = plane.directory / "scheduler-marked.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    log = (plane.directory / "kube-scheduler-marked.log").open("ab")
    process = subprocess.Popen(
        [
            str(plane.directory / "bin" / "kube-scheduler"),
            f"--config={path}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
        ],
        stdout=log,
        stderr=log,
    )
    try:
        wait_for(
            lambda: httpx.get(f"https://127.0.0.1:{port}/readyz", verify=False).status_code == 200,
            "the second kube-scheduler to be ready",
            timeout=60,
        )
        yield SCHEDULER
    finally:
        process.terminate()
        process.wait(15)
        log.close()


def marked_pod(name: str, intent: bool, marker: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if intent:
        meta["labels"] = INTENT_LABELS
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/none:0"}
    if marker:
        container["resources"] = {"requests": {MARKER: "1"}, "limits": {MARKER: "1"}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"schedulerName": SCHEDULER, "containers": [container]},
    }


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


def test_only_pods_with_the_marker_go_to_the_extender_and_all_are_placed(
    cluster: Cluster, marked_scheduler: str
) -> None:
    before = filtered_pods(cluster)
    pods = {
        "marked-with-intent": marked_pod("marked-with-intent", intent=True, marker=True),
        "plain": marked_pod("plain", intent=False, marker=False),
        "intent-without-marker": marked_pod("intent-without-marker", intent=True, marker=False),
    }
    cluster.plane.apply(*pods.values())
    try:
        for name in pods:
            wait_for(
                lambda name=name: cluster.plane.get("pod", name)["spec"].get("nodeName"),
                f"{name} to be bound",
                timeout=60,
            )
        after = filtered_pods(cluster)
        # the marked pod reached /filter with its intent; the other two never did (the intent
        # without the marker is the documented cost: placed without the extender)
        assert after.get("labels", 0) - before.get("labels", 0) == 1
        assert after.get("none", 0) - before.get("none", 0) == 0
        assert after.get("annotation", 0) - before.get("annotation", 0) == 0
    finally:
        cluster.plane.kubectl("delete", "pod", *pods, "--wait=false", check=False)
