"""Dashboard settings pointing at chosen addresses (free ports: nothing there unless a test starts it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from services.common.config import ServiceSettings, build_settings
from tests.conftest import free_port

HTMX = {"HX-Request": "true"}  # what htmx sends with every request the page makes


@pytest.fixture
def dashboard_settings(home: Path) -> Callable[..., ServiceSettings]:
    def make(**overrides: Any) -> ServiceSettings:
        values: dict[str, Any] = {
            "port": free_port(),
            "allocator_address": f"127.0.0.1:{free_port()}",
            "nodeagent_address": f"127.0.0.1:{free_port()}",
            "gpulane_address": f"127.0.0.1:{free_port()}",
            "bridge_url": f"http://127.0.0.1:{free_port()}",
            "extender_url": f"http://127.0.0.1:{free_port()}",
            "refresh_ms": 200.0,
            "call_timeout_ms": 300.0,
        }
        values.update(overrides)
        return build_settings("dashboard", overrides=values, env={"PARFUSION_HOME": str(home)})

    return make
