"""The three co-run phases on one GPU, measured from the host.

- alone: only the online loop (batch-1 MLP requests at a fixed arrival rate).
- baseline: online loop plus batch GEMM, both on default-priority streams, full-size GEMMs
  with many kernels in flight (what a GPU shared without intent does).
- parfusion: what the lane service plans: the online stream at the device's greatest
  priority, the batch stream at its least, batch GEMMs cut into short row blocks (priority
  never preempts a running kernel, so kernels must be short) and at most ``throttled_inflight``
  blocks in flight.

Latency is arrival-to-completion (open loop, queueing included); batch throughput counts
2*rows*n*n FLOPs per block over the phase's wall time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from experiments.gpu_corun.ops import GpuOps


@dataclass(frozen=True)
class CorunConfig:
    phase_seconds: float
    online_interval_ms: float = 2.0
    online_hidden: int = 2048
    online_layers: int = 4
    batch_n: int = 8192
    baseline_inflight: int = 8
    parfusion_block_rows: int = 1024
    throttled_inflight: int = 2


@dataclass(frozen=True)
class BatchPlan:
    stream_priority: int
    block_rows: int
    inflight: int


def _online(ops: GpuOps, stream: Any, cfg: CorunConfig, stop: threading.Event) -> list[float]:
    interval = cfg.online_interval_ms / 1000.0
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = start + cfg.phase_seconds
    k = 0
    while True:
        arrival = start + k * interval
        if arrival >= deadline:
            break
        now = time.perf_counter()
        if now < arrival:
            time.sleep(arrival - now)
        ops.online_request(stream)
        latencies.append((time.perf_counter() - arrival) * 1000.0)
        k += 1
    stop.set()
    return latencies


def _batch(
    ops: GpuOps, stream: Any, plan: BatchPlan, n: int, stop: threading.Event, out: dict[str, float]
) -> None:
    blocks = 0
    start = time.perf_counter()
    while not stop.is_set():
        for _ in range(plan.inflight):
            ops.batch_block(stream, plan.block_rows)
            blocks += 1
        ops.sync(stream)
    ops.sync(stream)
    elapsed = time.perf_counter() - start
    flops = 2.0 * plan.block_rows * n * n * blocks
    out.update(
        blocks=blocks, seconds=elapsed, tflops=flops / elapsed / 1e12 if elapsed > 0 else 0.0
    )


def summarise(latencies: list[float]) -> dict[str, float]:
    if not latencies:
        return {"count": 0, "p50_ms": 0.0, "p95_ms": 0.0, "p99_ms": 0.0, "mean_ms": 0.0}
    arr = np.asarray(latencies)
    return {
        "count": int(arr.size),
        "p50_ms": float(np.percentile(arr, 50)),
        "p95_ms": float(np.percentile(arr, 95)),
        "p99_ms": float(np.percentile(arr, 99)),
        "mean_ms": float(arr.mean()),
    }


def run_phase(
    ops: GpuOps, cfg: CorunConfig, online_priority: int, batch: BatchPlan | None
) -> dict[str, Any]:
    online_stream = ops.stream(online_priority)
    stop = threading.Event()
    batch_out: dict[str, float] = {}
    worker = None
    if batch is not None:
        batch_stream = ops.stream(batch.stream_priority)
        worker = threading.Thread(
            target=_batch, args=(ops, batch_stream, batch, cfg.batch_n, stop, batch_out)
        )
        worker.start()
        time.sleep(0.2)  # let the batch queue fill before the first online request
    try:
        latencies = _online(ops, online_stream, cfg, stop)
    finally:
        stop.set()
        if worker is not None:
            worker.join()
    result: dict[str, Any] = {
        "online": {**summarise(latencies), "stream_priority": online_priority}
    }
    if batch is not None:
        result["batch"] = {
            **batch_out,
            "stream_priority": batch.stream_priority,
            "block_rows": batch.block_rows,
            "inflight": batch.inflight,
        }
    return result


def run_corun(ops: GpuOps, cfg: CorunConfig) -> dict[str, Any]:
    least, greatest = ops.priority_range()
    for _ in range(20):  # warm-up: kernels compiled / cuBLAS handles created outside the timing
        ops.online_request(ops.stream(least))
    phases = {
        "alone": run_phase(ops, cfg, least, None),
        "baseline": run_phase(
            ops, cfg, least, BatchPlan(least, cfg.batch_n, cfg.baseline_inflight)
        ),
        "parfusion": run_phase(
            ops, cfg, greatest, BatchPlan(least, cfg.parfusion_block_rows, cfg.throttled_inflight)
        ),
    }
    return {
        "priority_range": {"least": least, "greatest": greatest},
        "phases": phases,
        "ratios": ratios(phases),
    }


def ratios(phases: dict[str, Any]) -> dict[str, float]:
    def div(a: float, b: float) -> float:
        return a / b if b else 0.0

    alone = phases["alone"]["online"]["p99_ms"]
    base = phases["baseline"]
    par = phases["parfusion"]
    return {
        "p99_baseline_over_alone": div(base["online"]["p99_ms"], alone),
        "p99_parfusion_over_alone": div(par["online"]["p99_ms"], alone),
        "p99_parfusion_over_baseline": div(par["online"]["p99_ms"], base["online"]["p99_ms"]),
        "batch_tflops_parfusion_over_baseline": div(
            par["batch"]["tflops"], base["batch"]["tflops"]
        ),
    }
