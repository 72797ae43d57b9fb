"""Node observation: per-core utilisation, load, memory and pressure stall information.

The one adapter over psutil and /proc/pressure (PSI). The arena choice (the k most idle
cores) is measured here at agent start, before any pool runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class PressureReading:
    some_avg10: float = 0.0
    full_avg10: float = 0.0
    available: bool = False


@dataclass(frozen=True)
class NodeSample:
    cpu_percent_per_core: tuple[float, ...]
    load1: float
    memory_total_bytes: int
    memory_used_bytes: int
    cpu_pressure: PressureReading
    memory_pressure: PressureReading
    io_pressure: PressureReading


def read_pressure(kind: str, root: Path = Path("/proc/pressure")) -> PressureReading:
    """Parse /proc/pressure/<kind>; absent (old kernel, no PSI) -> available=False."""
    try:
        text = (root / kind).read_text()
    except OSError:
        return PressureReading()
    some = full = 0.0
    for line in text.splitlines():
        head, *pairs = line.split()
        values = dict(p.split("=", 1) for p in pairs)
        avg10 = float(values.get("avg10", 0.0))
        if head == "some":
            some = avg10
        elif head == "full":
            full = avg10
    return PressureReading(some_avg10=some, full_avg10=full, available=True)


class NodeSampler:
    """Non-blocking samples: utilisation is the delta since the previous call."""

    def __init__(self, pressure_root: Path = Path("/proc/pressure")) -> None:
        self._pressure_root = pressure_root
        psutil.cpu_percent(percpu=True)  # prime the delta

    def sample(self) -> NodeSample:
        mem = psutil.virtual_memory()
        return NodeSample(
            cpu_percent_per_core=tuple(psutil.cpu_percent(percpu=True)),
            load1=os.getloadavg()[0],
            memory_total_bytes=int(mem.total),
            memory_used_bytes=int(mem.total - mem.available),
            cpu_pressure=read_pressure("cpu", self._pressure_root),
            memory_pressure=read_pressure("memory", self._pressure_root),
            io_pressure=read_pressure("io", self._pressure_root),
        )


def most_idle_cores(
    k: int, sample_s: float = 0.3, allowed: tuple[int, ...] = ()
) -> tuple[int, ...]:
    """The k cores with the most idle time over sample_s (k <= 0 or >= all: every allowed core)."""
    cpus = allowed or tuple(sorted(os.sched_getaffinity(0)))
    if k <= 0 or k >= len(cpus):
        return cpus
    per_core = psutil.cpu_times_percent(interval=sample_s, percpu=True)
    idle = {cpu: per_core[cpu].idle for cpu in cpus if cpu < len(per_core)}
    ranked = sorted(idle, key=lambda cpu: (-idle[cpu], cpu))
    return tuple(sorted(ranked[:k]))
