"""Shared fixtures: an isolated project home per test so run/, logs/, results/ never collide."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ros_domain import claim_domain

ROOT = Path(__file__).resolve().parent.parent
ROS_ENV = ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "ROS_STATIC_PEERS")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A throw-away PARFUSION_HOME with the project's configs/ available."""
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    monkeypatch.setenv("PARFUSION_HOME", str(tmp_path))
    monkeypatch.delenv("PARFUSION_API_TOKEN", raising=False)
    return tmp_path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def quiet_port(taken: frozenset[int] = frozenset()) -> int:
    """A free port below the kernel's ephemeral range: a port held only by a later bind (a
    container's published port, after a build of minutes) is not handed meanwhile to some
    process's outgoing connection, as one from the ephemeral range can be."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        candidate = rng.randrange(10_000, max(low, 10_001))
        if candidate in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return candidate
    return free_port()


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session", autouse=True)
def ros_domain() -> Iterator[int]:
    """This run's own ROS 2 domain, loopback discovery only (tests/ros_domain.py says why)."""
    domain, lock = claim_domain()
    saved = {key: os.environ.get(key) for key in ROS_ENV}
    os.environ.update({"ROS_DOMAIN_ID": str(domain), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"})
    os.environ.pop("ROS_STATIC_PEERS", None)
    yield domain
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    lock.close()
