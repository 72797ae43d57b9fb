"""MPS: the control-daemon lines and the per-process environment that carry a GPU share.

Facts the commands respect (nvidia-cuda-mps-control(1), the MPS guide):
- Settings are lines piped into ``nvidia-cuda-mps-control``;
  ``set_default_active_thread_percentage PCT`` and
  ``set_default_device_pinned_mem_limit DEV 8G`` only affect MPS servers started afterwards;
  a running server is changed with ``set_active_thread_percentage SERVER_PID PCT``.
- One MPS server serves one user id, so every intent run as the same user shares one server:
  the daemon default is the largest share, and each client tightens to its own share.
- An MPS daemon started with CUDA_VISIBLE_DEVICES remaps device indexes for its clients;
  devices are therefore named by UUID in both the daemon's and the clients' environment.
- ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` in a client's
  environment can only tighten the daemon's limits, never raise them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

MPS_CONTROL = "nvidia-cuda-mps-control"
GIB = 1024**3
MIB = 1024**2


def thread_percentage(share_percent: float) -> int:
    """MPS takes an integer percentage in 1..100; round up so a share is never cut."""
    return max(1, min(100, math.ceil(share_percent - 1e-9)))


def mem_limit_text(limit_bytes: int) -> str:
    """8 GiB -> "8G", 512 MiB -> "512M" (rounded up: a limit never cuts below the plan)."""
    if limit_bytes >= GIB:
        return f"{math.ceil(limit_bytes / GIB)}G"
    return f"{max(1, math.ceil(limit_bytes / MIB))}M"


def default_percentage_line(pct: int) -> str:
    return f"set_default_active_thread_percentage {pct}"


def server_percentage_line(server_pid: str, pct: int) -> str:
    return f"set_active_thread_percentage {server_pid} {pct}"


def default_pinned_mem_line(device_ordinal: int, limit_bytes: int) -> str:
    return f"set_default_device_pinned_mem_limit {device_ordinal} {mem_limit_text(limit_bytes)}"


def visible_devices(gpu_indexes: tuple[int, ...], uuids: Mapping[int, str]) -> str:
    """CUDA_VISIBLE_DEVICES by GPU UUID where NVML gave one.

    An MPS daemon started with CUDA_VISIBLE_DEVICES remaps device indexes for its clients, so
    the MPS guide recommends UUIDs; indexes (with PCI bus order) only where no UUID is known.
    """
    return ",".join(uuids.get(i) or str(i) for i in gpu_indexes)


def client_env(
    gpu_indexes: tuple[int, ...],
    share_percent: float,
    memory_limit_bytes: int,
    uuids: Mapping[int, str] | None = None,
) -> dict[str, str]:
    """Environment for one intent's GPU processes; ordinals are relative to the visible set."""
    env = {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # index fallback follows the NVML index order
        "CUDA_VISIBLE_DEVICES": visible_devices(gpu_indexes, uuids or {}),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(thread_percentage(share_percent)),
    }
    if memory_limit_bytes > 0:
        limit = mem_limit_text(memory_limit_bytes)
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
            f"{ordinal}={limit}" for ordinal in range(len(gpu_indexes))
        )
    return env
