"""Ports move together: one resolution of where each service listens and how peers dial it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from parfusion.endpoints import address_of, endpoint, endpoints, peer_environment
from parfusion.services import BY_NAME, address_references, env_key
from tests.conftest import ROOT

DOC = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())


def _refs_to(service: str) -> set[str]:
    return {env_key(r.section, r.key) for r in address_references(DOC) if r.service == service}


def test_nothing_moved_means_no_rewrite(home: Path) -> None:
    assert peer_environment({}) == {}
    assert address_of("allocator", {}) == "127.0.0.1:50051"
    assert address_of("bridge", {}) == "http://127.0.0.1:18083"


def test_moving_one_port_moves_every_peer_that_dials_it(home: Path) -> None:
    env = {"PARFUSION_ALLOCATOR_PORT": "51051", "PARFUSION_BRIDGE_PORT": "28083"}
    peers = peer_environment(env)
    allocator_refs, bridge_refs = _refs_to("allocator"), _refs_to("bridge")
    # extender, bridge and dashboard all dial the allocator; the dashboard dials the bridge
    assert len(allocator_refs) >= 3 and bridge_refs
    assert set(peers) == allocator_refs | bridge_refs
    assert {peers[k] for k in allocator_refs} == {"127.0.0.1:51051"}
    assert {peers[k] for k in bridge_refs} == {"http://127.0.0.1:28083"}
    assert address_of("allocator", env) == "127.0.0.1:51051"


def test_an_explicit_address_wins(home: Path) -> None:
    env = {
        "PARFUSION_ALLOCATOR_PORT": "51051",
        "PARFUSION_BRIDGE_ALLOCATOR_ADDRESS": "10.9.8.7:50051",
    }
    peers = peer_environment(env)
    assert "PARFUSION_BRIDGE_ALLOCATOR_ADDRESS" not in peers
    assert peers["PARFUSION_DASHBOARD_ALLOCATOR_ADDRESS"] == "127.0.0.1:51051"


def test_host_is_dialled_unless_it_is_a_wildcard(home: Path) -> None:
    assert peer_environment({"PARFUSION_HOST": "0.0.0.0"}) == {}
    peers = peer_environment({"PARFUSION_HOST": "10.1.2.3"})
    assert set(peers) == {env_key(r.section, r.key) for r in address_references(DOC)}
    assert peers["PARFUSION_DASHBOARD_BRIDGE_URL"] == "http://10.1.2.3:18083"
    assert peers["PARFUSION_ALLOCATOR_NODEAGENT_ADDRESS"] == "10.1.2.3:50052"
    # one service bound elsewhere: only the addresses of that service change
    only = peer_environment({"PARFUSION_NODEAGENT_HOST": "::1"})
    assert set(only) == _refs_to("nodeagent")
    assert only["PARFUSION_ALLOCATOR_NODEAGENT_ADDRESS"] == "[::1]:50052"


def test_an_unreadable_config_still_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table's defaults then, moved by the same variables: a command must never dial the
    default port of another stack while its own was moved."""
    monkeypatch.setenv("PARFUSION_CONFIG", str(tmp_path / "missing.yaml"))
    env = {
        "PARFUSION_ALLOCATOR_PORT": "51051",
        "PARFUSION_HOST": "10.1.2.3",
        "PARFUSION_GPULANE_METRICS_PORT": "29103",
    }
    assert address_of("allocator", env) == "10.1.2.3:51051"
    assert endpoint(BY_NAME["gpulane"], env).ports == (50053, 29103)
    assert address_of("bridge", {}) == "http://127.0.0.1:18083"


def test_metrics_ports_follow_their_settings(home: Path) -> None:
    env = {"PARFUSION_GPULANE_METRICS_PORT": "29103"}
    ep = endpoint(BY_NAME["gpulane"], env)
    assert ep.ports == (50053, 29103)
    assert ep.metrics_url == "http://127.0.0.1:29103/metrics"
    assert endpoints(env)["dashboard"].ports == (18080,)  # HTTP services serve /metrics inline
