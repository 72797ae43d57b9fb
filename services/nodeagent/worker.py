"""One pool worker process: runs fixed-size numpy kernels on request, one BLAS thread.

Started by pools.py as ``python -m services.nodeagent.worker`` in the agent's own session
(no setsid: Linux autogroup ranks nice and SCHED_IDLE only within a session). Protocol: one
JSON object per line on stdin, one answer per line on stdout; end of stdin means the agent is
gone or retired this worker, and the process exits. The BLAS thread variables are set before
numpy is imported, so pool size really is the parallelism.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

_MATRICES: dict[int, tuple[Any, Any]] = {}


def _matrices(n: int) -> tuple[Any, Any]:
    if n not in _MATRICES:
        rng = np.random.default_rng(n)
        _MATRICES[n] = (rng.standard_normal((n, n)), rng.standard_normal((n, n)))
    return _MATRICES[n]


def run_kernel(n: int, reps: int) -> None:
    """The unit of work: reps dense n x n products (CPU-bound, no allocation growth)."""
    a, b = _matrices(n)
    out = np.empty_like(a)
    for _ in range(max(1, reps)):
        np.matmul(a, b, out=out)


def calibrate(n: int, target_ms: float) -> dict[str, float]:
    """Reps so one request costs target_ms of CPU time (CPU time, so a busy host does not skew it)."""
    run_kernel(n, 3)  # warm caches and BLAS
    samples = []
    for _ in range(5):
        t0 = time.thread_time()
        run_kernel(n, 10)
        samples.append((time.thread_time() - t0) * 1000.0 / 10)
    rep_ms = sorted(samples)[len(samples) // 2]
    return {"reps": max(1, round(target_ms / rep_ms)), "rep_ms": rep_ms}


def handle(request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op")
    if op == "run":
        start = time.monotonic()
        cpu0 = time.thread_time()
        run_kernel(int(request["n"]), int(request["reps"]))
        end = time.monotonic()
        return {
            "id": request.get("id"),
            "start": start,
            "end": end,
            "cpu_ms": (time.thread_time() - cpu0) * 1000.0,
        }
    if op == "calibrate":
        return calibrate(int(request["n"]), float(request["target_ms"]))
    if op == "ping":
        return {"pid": os.getpid(), "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS")}
    return {"error": f"unknown op {op!r}"}


def main() -> int:
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        out.write(json.dumps(handle(json.loads(line))) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
