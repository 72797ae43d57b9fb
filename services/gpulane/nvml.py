"""The NVML boundary: the only module that imports pynvml (nvidia-ml-py).

Every GPU fact the lane service uses (which GPUs exist, utilisation, memory, power,
temperature, compute processes, MIG mode) is read here into plain frozen dataclasses. Without
the NVIDIA driver the snapshot says ``available=False`` with the NVML error and an empty device
list: there are never placeholder GPUs. Tests hand :class:`Nvml` a fake library object with the
same functions (the boundary), and nothing else is replaced.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# A GPU counts as idle when NVML shows no compute process on it (other than ones PARFusion
# started itself) and its utilisation is at most this many percent.
DEFAULT_IDLE_UTILIZATION_PERCENT = 5.0


@dataclass(frozen=True)
class GpuProcessSample:
    pid: int
    used_memory_bytes: int


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str
    uuid: str
    utilization_percent: float
    memory_total_bytes: int
    memory_used_bytes: int
    power_watts: float
    temperature_c: float
    processes: tuple[GpuProcessSample, ...] = ()
    mig_enabled: bool = False

    def foreign_processes(self, own_pids: Iterable[int] = ()) -> tuple[GpuProcessSample, ...]:
        own = set(own_pids)
        return tuple(p for p in self.processes if p.pid not in own)

    def is_idle(
        self,
        own_pids: Iterable[int] = (),
        max_utilization_percent: float = DEFAULT_IDLE_UTILIZATION_PERCENT,
    ) -> bool:
        return (
            not self.foreign_processes(own_pids)
            and self.utilization_percent <= max_utilization_percent
        )

    def busy_reason(
        self,
        own_pids: Iterable[int] = (),
        max_utilization_percent: float = DEFAULT_IDLE_UTILIZATION_PERCENT,
    ) -> str:
        """Why this GPU is not idle, or "" when it is."""
        foreign = self.foreign_processes(own_pids)
        if foreign:
            pids = ",".join(str(p.pid) for p in foreign)
            return f"GPU {self.index} runs compute processes (pid {pids})"
        if self.utilization_percent > max_utilization_percent:
            return (
                f"GPU {self.index} is {self.utilization_percent:.0f}% utilised "
                f"(idle means <= {max_utilization_percent:.0f}%)"
            )
        return ""


@dataclass(frozen=True)
class NvmlSnapshot:
    available: bool
    error: str = ""
    driver_version: str = ""
    devices: tuple[GpuSample, ...] = ()
    observed_at: float = field(default_factory=time.time)

    @property
    def present_indexes(self) -> tuple[int, ...]:
        return tuple(d.index for d in self.devices)

    def device(self, index: int) -> GpuSample | None:
        for d in self.devices:
            if d.index == index:
                return d
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _load_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:  # the default install has nvidia-ml-py; a trimmed one may not
        return None
    return pynvml


class Nvml:
    """Reads NVML through ``library`` (default: the real pynvml module).

    Initialisation is lazy and retried at most every ``retry_s`` seconds so a missing driver
    costs one failed call per interval, not one per tick.
    """

    def __init__(self, library: Any | None = None, retry_s: float = 30.0) -> None:
        self._lib = library if library is not None else _load_pynvml()
        self._retry_s = retry_s
        self._initialised = False
        self._last_attempt = float("-inf")
        self._init_error = "" if self._lib is not None else "pynvml (nvidia-ml-py) is not installed"
        self._lock = threading.Lock()

    def _error_type(self) -> type[BaseException]:
        err = getattr(self._lib, "NVMLError", None)
        return err if isinstance(err, type) and issubclass(err, BaseException) else Exception

    def _ensure_init(self) -> bool:
        if self._initialised:
            return True
        if self._lib is None:
            return False
        now = time.monotonic()
        if now - self._last_attempt < self._retry_s:
            return False
        self._last_attempt = now
        try:
            self._lib.nvmlInit()
        except self._error_type() as exc:
            self._init_error = f"NVML unavailable: {exc}"
            log.info("nvml unavailable", extra={"error": str(exc)})
            return False
        self._initialised = True
        self._init_error = ""
        return True

    def snapshot(self) -> NvmlSnapshot:
        with self._lock:
            if not self._ensure_init():
                return NvmlSnapshot(available=False, error=self._init_error)
            lib = self._lib
            error = self._error_type()
            try:
                count = int(lib.nvmlDeviceGetCount())
                driver = _text(lib.nvmlSystemGetDriverVersion())
            except error as exc:
                return NvmlSnapshot(available=False, error=f"NVML query failed: {exc}")
            devices = []
            for index in range(count):
                try:
                    devices.append(self._sample(index))
                except error as exc:
                    log.warning("gpu unreadable", extra={"gpu": index, "error": str(exc)})
            return NvmlSnapshot(available=True, driver_version=driver, devices=tuple(devices))

    def _optional(self, fn: Any, *args: Any, default: Any = None) -> Any:
        """Fields some boards do not support (power on some SKUs, MIG on consumer cards)."""
        try:
            return fn(*args)
        except self._error_type():
            return default

    def _sample(self, index: int) -> GpuSample:
        lib = self._lib
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        util = self._optional(lib.nvmlDeviceGetUtilizationRates, handle)
        memory = lib.nvmlDeviceGetMemoryInfo(handle)
        power_mw = self._optional(lib.nvmlDeviceGetPowerUsage, handle, default=0)
        temperature = self._optional(
            lib.nvmlDeviceGetTemperature, handle, lib.NVML_TEMPERATURE_GPU, default=0
        )
        procs = self._optional(lib.nvmlDeviceGetComputeRunningProcesses, handle, default=[])
        mig = self._optional(lib.nvmlDeviceGetMigMode, handle, default=None)
        return GpuSample(
            index=index,
            name=_text(lib.nvmlDeviceGetName(handle)),
            uuid=_text(lib.nvmlDeviceGetUUID(handle)),
            utilization_percent=float(util.gpu) if util is not None else 0.0,
            memory_total_bytes=int(memory.total),
            memory_used_bytes=int(memory.used),
            power_watts=float(power_mw) / 1000.0,
            temperature_c=float(temperature),
            processes=tuple(
                GpuProcessSample(int(p.pid), int(getattr(p, "usedGpuMemory", 0) or 0))
                for p in procs or ()
            ),
            mig_enabled=bool(mig[0]) if mig else False,
        )

    def close(self) -> None:
        with self._lock:
            if self._initialised and self._lib is not None:
                try:
                    self._lib.nvmlShutdown()
                except self._error_type():
                    pass
                self._initialised = False
