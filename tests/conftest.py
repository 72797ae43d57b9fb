"""Shared fixtures: an isolated project home per test so run/, logs/, results/ never collide."""

from __future__ import annotations

import os
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
