"""CUDA stream priority: the logical -1/0/1 of a plan mapped into the device's priority range.

CUDA convention: lower number = higher priority; the meaningful range is
[greatest, least] as returned by cudaDeviceGetStreamPriorityRange (for example least=0,
greatest=-5). A priority only orders *pending* work: it never preempts a kernel that is
already running, so batch kernels must stay short for the online tail to hold.

The range is read from the device at run time through the CUDA driver API
(``cuCtxGetStreamPriorityRange`` in libcuda, by ctypes: no CuPy or torch needed), in a short
child process so the service itself never holds a CUDA context that would make the GPU look
busy. Without a GPU or without the driver the mapping uses :data:`ASSUMED_RANGE`, and a probe
that fails says why; both are flagged as assumptions in every preview.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import importlib.util
import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PriorityRange:
    least: int  # numerically largest: the default stream priority, lowest urgency
    greatest: int  # numerically smallest: highest urgency
    source: str

    @property
    def assumed(self) -> bool:
        return self.source.startswith("assumed")

    def describe(self) -> str:
        return f"[greatest={self.greatest}, least={self.least}] ({self.source})"


# What CUDA 12 reports on current data-centre GPUs; used only when no device can be queried.
ASSUMED_RANGE = PriorityRange(
    least=0,
    greatest=-5,
    source="assumed: not queried from a device (no GPU or no CUDA driver); CUDA 12 default",
)


def map_priority(logical: int, rng: PriorityRange) -> int:
    """Logical 1 (high) -> greatest, -1 (low) -> least, 0 -> middle, rounded toward least."""
    if logical not in (-1, 0, 1):
        raise ValueError(f"logical stream priority must be -1, 0 or 1, got {logical}")
    if logical > 0:
        return rng.greatest
    if logical < 0:
        return rng.least
    return rng.least + int((rng.greatest - rng.least) / 2)


def query_driver(gpu: int, cuda: Any) -> tuple[int, int]:
    """(least, greatest) of GPU ``gpu`` from the CUDA driver library ``cuda`` (libcuda)."""

    def check(rc: int, call: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{call} returned CUDA error {rc}")

    check(cuda.cuInit(0), "cuInit")
    device = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(device), gpu), f"cuDeviceGet({gpu})")
    context = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    try:
        check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        least, greatest = ctypes.c_int(), ctypes.c_int()
        check(
            cuda.cuCtxGetStreamPriorityRange(ctypes.byref(least), ctypes.byref(greatest)),
            "cuCtxGetStreamPriorityRange",
        )
    finally:
        cuda.cuDevicePrimaryCtxRelease_v2(device)
    return least.value, greatest.value


def gpu_runtime_available() -> bool:
    """CuPy or torch importable: what the synthetic GPU load needs (the probe needs neither)."""
    return any(importlib.util.find_spec(m) is not None for m in ("cupy", "torch"))


def cuda_driver_available() -> bool:
    return ctypes.util.find_library("cuda") is not None


def probe_priority_range(gpu: int, timeout_s: float = 60.0) -> PriorityRange:
    """Query GPU ``gpu`` in a child process; the flagged assumption (with why) otherwise."""
    if not cuda_driver_available():
        return ASSUMED_RANGE
    cmd = [sys.executable, "-m", "services.gpulane.priority", "--gpu", str(gpu)]
    # CUDA ordinals follow NVML's (PCI bus) order only when asked to.
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, check=False, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return _assumed_after_failure(gpu, str(exc))
    try:
        reply = json.loads(done.stdout.strip().splitlines()[-1])
        return PriorityRange(
            int(reply["least"]),
            int(reply["greatest"]),
            f"queried: cuCtxGetStreamPriorityRange on GPU {gpu} (CUDA driver)",
        )
    except (ValueError, KeyError, IndexError, TypeError):
        errors = done.stderr.strip().splitlines()
        return _assumed_after_failure(gpu, errors[-1] if errors else f"exit {done.returncode}")


def _assumed_after_failure(gpu: int, why: str) -> PriorityRange:
    log.warning("stream priority probe failed", extra={"gpu": gpu, "error": why})
    return replace(
        ASSUMED_RANGE, source=f"assumed: the probe on GPU {gpu} failed ({why}); CUDA 12 default"
    )


def _main() -> int:
    parser = argparse.ArgumentParser(description="print a GPU's CUDA stream priority range")
    parser.add_argument("--gpu", type=int, required=True)
    ns = parser.parse_args()
    library = ctypes.util.find_library("cuda")
    if library is None:
        raise OSError("no CUDA driver library (libcuda) on this machine")
    least, greatest = query_driver(ns.gpu, ctypes.CDLL(library))
    sys.stdout.write(json.dumps({"least": least, "greatest": greatest}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
