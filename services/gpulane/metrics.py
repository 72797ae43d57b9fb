"""Prometheus metrics of the GPU-lane service (parfusion_gpulane_*); label values are bounded:
lane names come from the config, GPU indexes from NVML, modes and outcomes from fixed sets."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

NVML_AVAILABLE = Gauge("parfusion_gpulane_nvml_available", "1 when NVML answers, else 0")
GPUS_PRESENT = Gauge("parfusion_gpulane_gpus_present", "GPUs NVML reports on this node")
LANE_AVAILABLE = Gauge(
    "parfusion_gpulane_lane_available", "1 when the lane has at least one GPU present", ["lane"]
)
LANE_SHARE_PERCENT = Gauge(
    "parfusion_gpulane_lane_share_percent",
    "GPU share the active plan allocates on the lane, percent of one GPU (a 4-GPU lane holds 400)",
    ["lane"],
)
GPU_UTILIZATION_RATIO = Gauge(
    "parfusion_gpulane_gpu_utilization_ratio", "NVML GPU utilisation, 0-1", ["gpu"]
)
GPU_PRESSURE_RATIO = Gauge(
    "parfusion_gpulane_gpu_pressure_ratio", "GPU pressure reported to the allocator, 0-1"
)
PLANS_APPLIED_TOTAL = Counter(
    "parfusion_gpulane_plans_applied_total", "GPU plans accepted, by mode", ["mode"]
)
PLANS_RECORDED_TOTAL = Counter(
    "parfusion_gpulane_plans_recorded_total", "GPU plans that changed and were recorded"
)
APPLY_REFUSED_TOTAL = Counter(
    "parfusion_gpulane_apply_refused_total", "Apply-mode plans refused, by reason", ["reason"]
)
LOAD_WORKERS = Gauge("parfusion_gpulane_load_workers", "Opt-in low-intensity GPU load workers")
