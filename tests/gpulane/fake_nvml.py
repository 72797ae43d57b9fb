"""A stand-in for the pynvml module, used at the NVML boundary only.

This machine has no NVIDIA driver, so tests hand services.gpulane.nvml.Nvml this object: it
has the same function names and return shapes as pynvml (nvmlInit, nvmlDeviceGetCount,
nvmlDeviceGetUtilizationRates -> .gpu, nvmlDeviceGetMemoryInfo -> .total/.used, power in mW,
nvmlDeviceGetComputeRunningProcesses -> .pid/.usedGpuMemory, ...). Everything above the
adapter runs for real.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    pass


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    utilization: int = 0
    memory_total: int = 141 * 10**9
    memory_used: int = 500 * 2**20
    power_mw: int = 75_000
    temperature: int = 31
    pids: list[int] = field(default_factory=list)
    mig_enabled: bool = False


class FakeNvml:
    NVML_TEMPERATURE_GPU = 0
    NVMLError = NVMLError

    def __init__(self, gpus: dict[int, FakeGpu] | None = None, *, driver_missing: bool = False):
        self.gpus = gpus or {}
        self.driver_missing = driver_missing
        self.init_calls = 0

    def nvmlInit(self) -> None:  # noqa: N802
        self.init_calls += 1
        if self.driver_missing:
            raise NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return "570.86.15"

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        ordered = sorted(self.gpus)
        return ordered[index]

    def nvmlDeviceGetName(self, handle: int) -> str:  # noqa: N802
        return self.gpus[handle].name

    def nvmlDeviceGetUUID(self, handle: int) -> str:  # noqa: N802
        return f"GPU-{handle:08d}"

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(gpu=self.gpus[handle].utilization, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:  # noqa: N802
        g = self.gpus[handle]
        return SimpleNamespace(
            total=g.memory_total, used=g.memory_used, free=g.memory_total - g.memory_used
        )

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:  # noqa: N802
        return self.gpus[handle].power_mw

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:  # noqa: N802
        return self.gpus[handle].temperature

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:  # noqa: N802
        return [SimpleNamespace(pid=p, usedGpuMemory=2**30) for p in self.gpus[handle].pids]

    def nvmlDeviceGetMigMode(self, handle: int) -> tuple[int, int]:  # noqa: N802
        m = int(self.gpus[handle].mig_enabled)
        return (m, m)


def h200_node(count: int = 8, **overrides: FakeGpu) -> FakeNvml:
    gpus = {i: FakeGpu() for i in range(count)}
    for key, gpu in overrides.items():
        gpus[int(key.removeprefix("gpu"))] = gpu
    return FakeNvml(gpus)
