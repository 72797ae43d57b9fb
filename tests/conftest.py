"""Shared fixtures: an isolated project home per test so run/, logs/, results/ never collide."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


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
