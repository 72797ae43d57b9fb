"""Settings: YAML, then PARFUSION_* environment, then flags; precise errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.config import ConfigError, build_settings


def test_defaults_from_demo_yaml(home: Path) -> None:
    s = build_settings("allocator", env={})
    assert (s.host, s.port, s.metrics_port) == ("127.0.0.1", 50051, 19101)
    assert s.run_dir == home / "run"
    assert s.api_token is None


def test_env_overrides_are_typed(home: Path) -> None:
    env = {
        "PARFUSION_ALLOCATOR_TICK_MS": "500",
        "PARFUSION_HOST": "0.0.0.0",
        "PARFUSION_API_TOKEN": "t",
    }
    s = build_settings("allocator", env=env)
    assert s.get_int("tick_ms") == 500 and s.host == "0.0.0.0" and s.api_token == "t"
    lanes = build_settings("gpulane", env={"PARFUSION_GPULANE_LANES": '{"online": [0]}'}).get(
        "lanes"
    )
    assert lanes == {"online": [0]}


def test_flag_overrides_win(home: Path) -> None:
    s = build_settings(
        "allocator", overrides={"port": 6000}, env={"PARFUSION_ALLOCATOR_PORT": "7000"}
    )
    assert s.port == 6000


def test_bad_values_name_the_key(home: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="PARFUSION_ALLOCATOR_TICK_MS"):
        build_settings("allocator", env={"PARFUSION_ALLOCATOR_TICK_MS": "fast"})
    with pytest.raises(ConfigError, match="cannot read config"):
        build_settings("allocator", config_path=tmp_path / "missing.yaml", env={})
    with pytest.raises(ConfigError, match="allocator.tick_ms"):
        build_settings("allocator", env={}, overrides={"tick_ms": "x"}).get_int("tick_ms")
