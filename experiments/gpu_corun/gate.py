"""Who may run the GPU co-run: a candidate GPU that NVML shows idle, and a GPU runtime.

Candidates default to GPUs 6,7 (the robot/urgent lanes of the 8xH200 map, least likely to
carry the demo's online work); where none of them exists, every present GPU is a candidate.
A candidate that is present but busy is never swapped for another lane's GPU: the run refuses.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from services.gpulane.nvml import DEFAULT_IDLE_UTILIZATION_PERCENT, GpuSample, Nvml

DEFAULT_CANDIDATES = (6, 7)


class Refusal(Exception):
    """The benchmark will not run; the message says why."""


@dataclass(frozen=True)
class Selection:
    device: GpuSample
    driver_version: str
    candidates: tuple[int, ...]


def select_gpu(
    nvml: Nvml,
    candidates: tuple[int, ...] = DEFAULT_CANDIDATES,
    max_utilization_percent: float = DEFAULT_IDLE_UTILIZATION_PERCENT,
) -> Selection:
    snap = nvml.snapshot()
    if not snap.available:
        raise Refusal(
            f"GPU co-run needs NVML to show an idle GPU: {snap.error or 'NVML unavailable'}"
        )
    if not snap.devices:
        raise Refusal("GPU co-run: NVML reports no GPU")
    present = snap.present_indexes
    chosen = tuple(i for i in candidates if i in present) or present
    reasons = []
    for index in chosen:
        device = snap.device(index)
        if device is None:
            continue
        reason = device.busy_reason(max_utilization_percent=max_utilization_percent)
        if not reason:
            return Selection(device, snap.driver_version, chosen)
        reasons.append(reason)
    raise Refusal("GPU co-run refused, no candidate GPU is idle: " + "; ".join(reasons))


def runtime_name() -> str:
    """The GPU runtime to use: torch, else CuPy (the first importable), else a Refusal."""
    for name in ("torch", "cupy"):
        if importlib.util.find_spec(name) is not None:
            return name
    raise Refusal(
        "GPU co-run needs torch or CuPy (optional: pip install -e '.[gpu]' for CuPy); neither is importable"
    )
