"""Opt-in low-intensity GPU load for the demo, so the lanes carry real work.

Off unless ``PARFUSION_ENABLE_GPU_LOAD=1``: then the service starts one worker process per lane
GPU that NVML shows idle (never on a busy GPU), each running short GEMMs at a small duty cycle
(``gpulane.gpu_load_duty``). It needs CuPy or torch; with neither importable it logs that and
starts nothing. Without the variable no GPU work is ever started.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from services.common.config import ServiceSettings
from services.gpulane import metrics
from services.gpulane.priority import gpu_runtime_available

log = logging.getLogger(__name__)

ENABLE_ENV = "PARFUSION_ENABLE_GPU_LOAD"


class IdleSource(Protocol):
    def idle_gpus(self) -> tuple[int, ...]: ...


Spawn = Callable[[Sequence[str], Mapping[str, str]], Any]


def _popen(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL)


class GpuLoadWorkers:
    def __init__(
        self,
        settings: ServiceSettings,
        *,
        env: Mapping[str, str] | None = None,
        spawn: Spawn = _popen,
        runtime_available: Callable[[], bool] = gpu_runtime_available,
    ) -> None:
        self._settings = settings
        self._env = dict(os.environ if env is None else env)
        self._spawn = spawn
        self._runtime_available = runtime_available
        self._procs: list[Any] = []

    @property
    def enabled(self) -> bool:
        return self._env.get(ENABLE_ENV, "").strip() == "1"

    def lane_gpus(self) -> set[int]:
        lanes = self._settings.get("lanes") or {}
        return {int(i) for indexes in lanes.values() for i in indexes}

    def start(self, idle_source: IdleSource) -> list[int]:
        """Start workers; returns the GPU indexes that got one."""
        if not self.enabled:
            log.info("gpu load off", extra={"enable_with": f"{ENABLE_ENV}=1"})
            return []
        if not self._runtime_available():
            log.warning("gpu load requested but neither CuPy nor torch is importable; no GPU work")
            return []
        idle = [g for g in idle_source.idle_gpus() if g in self.lane_gpus()]
        if not idle:
            log.warning("gpu load requested but NVML shows no idle lane GPU; no GPU work")
            return []
        duty = min(0.5, max(0.01, self._settings.get_float("gpu_load_duty", 0.2)))
        size = self._settings.get_int("gpu_load_matrix", 2048)
        for gpu in idle:
            argv = [
                sys.executable,
                "-m",
                "services.gpulane.load_worker",
                "--duty",
                str(duty),
                "--matrix",
                str(size),
            ]
            env = {**self._env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(gpu)}
            self._procs.append(self._spawn(argv, env))
            log.info("gpu load worker started", extra={"gpu": gpu, "duty": duty})
        metrics.LOAD_WORKERS.set(len(self._procs))
        return idle

    def pids(self) -> tuple[int, ...]:
        return tuple(int(p.pid) for p in self._procs)

    def stop(self) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self._procs.clear()
        metrics.LOAD_WORKERS.set(0)
