"""One low-intensity GPU load worker (started by load.py only when PARFUSION_ENABLE_GPU_LOAD=1).

Runs short square GEMMs on the one visible GPU for ``duty`` of every 100 ms period and sleeps
the rest, until SIGTERM. Uses CuPy if importable, else torch.
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

PERIOD_S = 0.1


def _gemm_step(size: int) -> Callable[[], None]:
    if importlib.util.find_spec("cupy") is not None:
        import cupy

        a = cupy.random.random((size, size), dtype=cupy.float32)
        b = cupy.random.random((size, size), dtype=cupy.float32)

        def step() -> None:
            cupy.matmul(a, b)
            cupy.cuda.Device().synchronize()

        return step
    import torch

    x = torch.rand((size, size), device="cuda")
    y = torch.rand((size, size), device="cuda")

    def step_torch() -> None:
        torch.matmul(x, y)
        torch.cuda.synchronize()

    return step_torch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duty", type=float, default=0.2)
    parser.add_argument("--matrix", type=int, default=2048)
    ns = parser.parse_args()
    stop = {"now": False}

    def _term(_signum: int, _frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _term)
    step = _gemm_step(ns.matrix)
    while not stop["now"]:
        start = time.monotonic()
        while time.monotonic() - start < ns.duty * PERIOD_S:
            step()
        time.sleep(max(0.0, PERIOD_S - (time.monotonic() - start)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
