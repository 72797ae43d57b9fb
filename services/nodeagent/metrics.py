"""Prometheus metrics of the node agent (label values from bounded sets only)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

PLANS_APPLIED = Counter(
    "parfusion_nodeagent_plans_applied_total", "NodePlans applied, by outcome", ["outcome"]
)
POOL_WORKERS = Gauge(
    "parfusion_nodeagent_pool_workers",
    "Worker processes in PARFusion pools, by pool kind",
    ["kind"],
)
OWNED_PROCESSES = Gauge(
    "parfusion_nodeagent_owned_processes", "Processes the agent started and still owns"
)
ARENA_CPUS = Gauge("parfusion_nodeagent_arena_cpus", "CPUs in the agent's arena")
CONTROL_REFUSED = Counter(
    "parfusion_nodeagent_control_refused_total",
    "ControlProcess calls refused because the PID is not the agent's",
)
MODEL_SKIPPED = Counter(
    "parfusion_nodeagent_model_skipped_seconds_total",
    "Model time the served modeled node skipped: simulating it took longer than it lasts",
)
