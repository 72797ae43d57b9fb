"""deploy/20-bridge.yaml gives the bridge what DDS needs (docs/architecture.md, "The bridge on
ROS 2 in a container"): the host's network, UDP-only Fast DDS, the robot's subnet and domain."""

from __future__ import annotations

from typing import Any

import yaml

from services.bridge.ros2 import DISCOVERY_RANGES
from tests.conftest import ROOT


def bridge_deployment() -> dict[str, Any]:
    docs = yaml.safe_load_all((ROOT / "deploy" / "20-bridge.yaml").read_text())
    return next(d for d in docs if d["kind"] == "Deployment")


def test_the_bridge_pod_is_a_dds_participant_on_the_nodes_network() -> None:
    deployment = bridge_deployment()
    pod = deployment["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"  # still resolves parfusion-node
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # one pod holds the host port
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "SUBNET"
    assert env["ROS_AUTOMATIC_DISCOVERY_RANGE"] in DISCOVERY_RANGES
    assert env["FASTDDS_BUILTIN_TRANSPORTS"] == "UDPv4"  # no shared memory across namespaces
    assert 0 <= int(env["ROS_DOMAIN_ID"]) <= 101
    assert env["PARFUSION_BRIDGE_ALLOCATOR_ADDRESS"].startswith("parfusion-node.")
