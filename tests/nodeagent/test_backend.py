"""The backend registry: configured names resolve, unknown names fail at start-up, options parse."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.config import ConfigError, build_settings
from services.common.registry import lazy
from services.nodeagent.backend import BACKENDS, BackendOptions, create_backend


def test_unknown_backend_is_a_config_error_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown backend 'bogus' \(known: .*real"):
        create_backend("bogus", BackendOptions())


def test_real_backend_is_registered_lazily() -> None:
    assert "real" in BACKENDS
    assert "lazy(services.nodeagent.real:RealBackend)" in BACKENDS["real"].__qualname__


def test_lazy_factory_imports_only_when_built() -> None:
    factory = lazy("pathlib:PurePosixPath")
    assert str(factory("a")) == "a"  # type: ignore[arg-type]


def test_options_from_settings(home: Path) -> None:
    settings = build_settings("nodeagent", env={"PARFUSION_NODEAGENT_ARENA_CORES": "1"})
    options = BackendOptions.from_settings(settings)
    assert options.arena_cores == 1
    assert options.cgroup_mode == "dry-run"
    assert options.allow_real_stress is False
    assert options.run_dir == home / "run"
    assert options.latency_window_s == 10.0


@pytest.mark.parametrize("window", ["0.1", "7200", "nan"])
def test_a_latency_window_out_of_bounds_is_rejected(home: Path, window: str) -> None:
    settings = build_settings("nodeagent", env={"PARFUSION_NODEAGENT_LATENCY_WINDOW_S": window})
    with pytest.raises(ConfigError, match="latency_window_s"):
        BackendOptions.from_settings(settings)


def test_bad_cgroup_mode_is_rejected(home: Path) -> None:
    settings = build_settings("nodeagent", env={"PARFUSION_NODEAGENT_CGROUP_MODE": "apply"})
    with pytest.raises(ConfigError, match="cgroup_mode"):
        BackendOptions.from_settings(settings)
