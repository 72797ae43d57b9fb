"""The opt-in GPU load gate: no variable, no GPU work; with it, only idle lane GPUs.

The process spawner is replaced (this machine has no GPU, so a real worker could not run); it
records what would be started. NVML is the fake library at the pynvml boundary.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from services.common.config import build_settings
from services.gpulane.load import ENABLE_ENV, GpuLoadWorkers
from services.gpulane.nvml import Nvml
from services.gpulane.server import build_controller
from tests.gpulane.fake_nvml import FakeGpu, h200_node


class Spawner:
    def __init__(self) -> None:
        self.started: list[tuple[list[str], dict[str, str]]] = []

    def __call__(self, argv, env):
        self.started.append((list(argv), dict(env)))
        return SimpleNamespace(
            pid=10_000 + len(self.started), terminate=lambda: None, wait=lambda timeout: 0
        )


def _workers(env: dict[str, str], spawn: Spawner, runtime: bool = True) -> GpuLoadWorkers:
    return GpuLoadWorkers(
        build_settings("gpulane", env={}), env=env, spawn=spawn, runtime_available=lambda: runtime
    )


@pytest.mark.parametrize("value", [None, "", "0", "true"])
def test_unset_never_starts_gpu_work(home: Path, value: str | None) -> None:
    spawn = Spawner()
    env = {} if value is None else {ENABLE_ENV: value}
    controller = build_controller(build_settings("gpulane", env={}), nvml=Nvml(h200_node()))
    assert _workers(env, spawn).start(controller) == []
    assert spawn.started == []


def test_enabled_without_cupy_or_torch_does_nothing(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spawn = Spawner()
    controller = build_controller(build_settings("gpulane", env={}), nvml=Nvml(h200_node()))
    assert _workers({ENABLE_ENV: "1"}, spawn, runtime=False).start(controller) == []
    assert spawn.started == []
    assert "neither CuPy nor torch" in caplog.text


def test_enabled_without_nvml_does_nothing(home: Path) -> None:
    from tests.gpulane.fake_nvml import FakeNvml

    spawn = Spawner()
    controller = build_controller(
        build_settings("gpulane", env={}), nvml=Nvml(FakeNvml(driver_missing=True))
    )
    assert _workers({ENABLE_ENV: "1"}, spawn).start(controller) == []
    assert spawn.started == []


def test_enabled_starts_only_on_idle_gpus_and_own_pids_stay_idle(home: Path) -> None:
    spawn = Spawner()
    fake = h200_node(4, gpu1=FakeGpu(utilization=60, pids=[42]))
    workers = _workers({ENABLE_ENV: "1"}, spawn)
    controller = build_controller(
        build_settings("gpulane", env={}), nvml=Nvml(fake), own_pids=workers.pids
    )
    assert workers.start(controller) == [0, 2, 3]
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env in spawn.started] == ["0", "2", "3"]
    assert all(argv[1:3] == ["-m", "services.gpulane.load_worker"] for argv, _ in spawn.started)
    # NVML now sees the workers on GPU 0; they are PARFusion's own, so it stays idle for planning
    fake.gpus[0].pids.append(workers.pids()[0])
    controller._snapshot = None
    assert 0 in controller.idle_gpus()
    workers.stop()
    assert workers.pids() == ()
