"""Settings: YAML, then PARFUSION_* environment, then flags; precise errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.config import (
    CODE_HOME,
    ConfigError,
    build_settings,
    default_config_path,
    resolve_input,
)
from services.sim.params import default_model_path


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


def test_a_fresh_home_reads_the_shipped_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second stack's PARFUSION_HOME holds its runtime files only: what the services read
    comes from the checkout until the home has its own copy; an explicit file is never
    replaced."""
    monkeypatch.setenv("PARFUSION_HOME", str(tmp_path))
    monkeypatch.delenv("PARFUSION_CONFIG", raising=False)
    monkeypatch.delenv("PARFUSION_MODEL_CONFIG", raising=False)
    shipped = CODE_HOME / "configs"
    assert default_config_path() == shipped / "demo.yaml"
    assert default_model_path() == shipped / "model.yaml"
    assert resolve_input("configs/intents") == shipped / "intents"
    s = build_settings("allocator", env={})
    assert s.port == 50051 and s.run_dir == tmp_path / "run"  # written under the home

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "demo.yaml").write_text("allocator:\n  port: 6001\n")
    assert build_settings("allocator", env={}).port == 6001  # the home's own copy wins
    assert resolve_input("configs/intents") == shipped / "intents"  # per file
    assert resolve_input("configs/nothing") == tmp_path / "configs" / "nothing"  # named as missing
    assert resolve_input(tmp_path / "x") == tmp_path / "x"

    monkeypatch.setenv("PARFUSION_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="missing.yaml"):
        build_settings("allocator", env={})
