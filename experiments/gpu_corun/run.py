"""`parfusion bench gpu-corun`: gate on an idle GPU, run the three phases, write the outputs.

Refuses (exit 2, nothing started on any GPU) without NVML, when no candidate GPU is idle, or
without torch/CuPy. The chosen GPU is made the only visible one (CUDA_VISIBLE_DEVICES by its NVML
UUID) before the runtime is imported, so NVML's GPU and CUDA's device 0 are the same board.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from experiments.gpu_corun.gate import DEFAULT_CANDIDATES, Refusal, runtime_name, select_gpu
from experiments.gpu_corun.harness import CorunConfig, run_corun
from experiments.gpu_corun.ops import load_ops
from experiments.gpu_corun.report import write_outputs
from services.gpulane.nvml import Nvml

log = logging.getLogger(__name__)

REFUSED = 2


def run_gpu_corun(
    seconds: float,
    results_dir: Path,
    *,
    candidates: tuple[int, ...] = DEFAULT_CANDIDATES,
    nvml: Nvml | None = None,
) -> tuple[int, str, dict[str, Path]]:
    """(exit code, message, output paths)."""
    if seconds < 3:
        return REFUSED, "--seconds must be at least 3 (three phases)", {}
    try:
        selection = select_gpu(nvml or Nvml(), candidates)
        runtime = runtime_name()
    except Refusal as exc:
        return REFUSED, str(exc), {}
    gpu = selection.device.index
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_VISIBLE_DEVICES"] = selection.device.uuid or str(gpu)
    cfg = CorunConfig(phase_seconds=seconds / 3.0)
    ops = load_ops(runtime, 0, cfg.online_hidden, cfg.online_layers, cfg.batch_n)
    try:
        ops.priority_range()
    except RuntimeError as exc:  # a CuPy without the query: no priorities, no meaningful run
        return REFUSED, f"GPU co-run cannot read the stream priority range: {exc}", {}
    measured = run_corun(ops, cfg)
    result: dict[str, Any] = {
        "benchmark": "gpu-corun",
        "synthetic": False,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": f"parfusion bench gpu-corun --seconds {seconds:g}",
        "device": {
            "index": gpu,
            "name": selection.device.name,
            "uuid": selection.device.uuid,
            "driver_version": selection.driver_version,
        },
        "runtime": f"{ops.name} {ops.version}",
        "config": asdict(cfg),
        **measured,
    }
    paths = write_outputs(result, results_dir, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    r = result["ratios"]
    message = (
        f"GPU {gpu}: online p99 baseline/alone {r['p99_baseline_over_alone']:.2f}x, "
        f"parfusion/alone {r['p99_parfusion_over_alone']:.2f}x; batch TFLOP/s parfusion/baseline "
        f"{r['batch_tflops_parfusion_over_baseline']:.2f}x"
    )
    return 0, message, paths
