"""CUDA stream priority: the logical -1/0/1 of a plan mapped into the device's priority range.

CUDA convention: lower number = higher priority; the meaningful range is
[greatest, least] as returned by cudaDeviceGetStreamPriorityRange (for example least=0,
greatest=-5). A priority only orders *pending* work: it never preempts a kernel that is
already running, so batch kernels must stay short for the online tail to hold.

The range is queried from the device at run time, in a short child process (so the service
itself never holds a CUDA context that would make the GPU look busy). Without a device or
without CuPy/torch the mapping uses :data:`ASSUMED_RANGE`, flagged as an assumption.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import subprocess
import sys
from dataclasses import dataclass

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
    source="assumed: not queried from a device (no GPU or no CuPy/torch); CUDA 12 default",
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


def _query_in_process(gpu: int) -> tuple[int, int, str]:
    """Runs in the probe child: the first available of CuPy, torch."""
    if importlib.util.find_spec("cupy") is not None:
        import cupy

        query = getattr(cupy.cuda.runtime, "deviceGetStreamPriorityRange", None)
        if query is not None:  # not every CuPy release exposes it; torch is tried next
            with cupy.cuda.Device(gpu):
                least, greatest = query()
            return int(least), int(greatest), "cupy"
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.cuda.set_device(gpu)
        least, greatest = torch.cuda.Stream.priority_range()
        return int(least), int(greatest), "torch"
    raise RuntimeError("neither CuPy nor torch is importable")


def gpu_runtime_available() -> bool:
    return any(importlib.util.find_spec(m) is not None for m in ("cupy", "torch"))


def probe_priority_range(gpu: int, timeout_s: float = 60.0) -> PriorityRange:
    """Query GPU ``gpu`` in a child process; ASSUMED_RANGE (with the reason) on any failure."""
    if not gpu_runtime_available():
        return ASSUMED_RANGE
    cmd = [sys.executable, "-m", "services.gpulane.priority", "--gpu", str(gpu)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        reply = json.loads(done.stdout.strip().splitlines()[-1])
        return PriorityRange(
            int(reply["least"]),
            int(reply["greatest"]),
            f"queried: cudaDeviceGetStreamPriorityRange on GPU {gpu} via {reply['via']}",
        )
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, IndexError) as exc:
        log.warning("stream priority probe failed", extra={"gpu": gpu, "error": str(exc)})
        return ASSUMED_RANGE


def _main() -> int:
    parser = argparse.ArgumentParser(description="print a GPU's CUDA stream priority range")
    parser.add_argument("--gpu", type=int, required=True)
    ns = parser.parse_args()
    least, greatest, via = _query_in_process(ns.gpu)
    sys.stdout.write(json.dumps({"least": least, "greatest": greatest, "via": via}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
