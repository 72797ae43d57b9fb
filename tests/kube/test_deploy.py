"""deploy/ as the real API server sees it: every object accepted, the examples valid."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tests.kube.conftest import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_the_api_server_accepts_every_manifest_and_example(cluster: Cluster) -> None:
    # the namespace for real (a dry run creates nothing the later objects could live in)
    cluster.plane.kubectl("apply", "-f", str(ROOT / "deploy" / "00-namespace.yaml"))
    out = cluster.plane.kubectl("apply", "--dry-run=server", "-f", str(ROOT / "deploy"))
    assert "parfusion-node" in out and "parfusion-extender" in out
    out = cluster.plane.kubectl(
        "apply", "--dry-run=server", "-f", str(ROOT / "deploy" / "examples")
    )
    assert "resourceintent.parfusion.io/online-inference" in out
    # the schema refuses what the proto would (an unknown class), with the field named
    bad = cluster.plane.kubectl(
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        stdin="apiVersion: parfusion.io/v1\nkind: ResourceIntent\nmetadata: {name: bad}\n"
        "spec: {workloadClass: REALTIME}\n",
        check=False,
    )
    assert "spec.workloadClass" in bad and "Unsupported value" in bad
