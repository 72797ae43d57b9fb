"""The dashboard's own Prometheus metrics (served at /metrics next to the process defaults)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

POLL_SECONDS = Histogram(
    "parfusion_dashboard_poll_seconds",
    "Time to read every service once (one dashboard refresh).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0),
)
SERVICE_UP = Gauge(
    "parfusion_dashboard_service_up",
    "1 when the service answered the dashboard's last poll, 0 when it did not.",
    ["service"],
)
ACTIONS = Counter(
    "parfusion_dashboard_actions_total",
    "Buttons pressed and what came of them.",
    ["action", "outcome"],
)
DEMO_STAGE = Gauge(
    "parfusion_dashboard_demo_stage",
    "Guided demo stage now playing (1-based), 0 when no demo runs.",
)
PREVIEWS = Counter(
    "parfusion_dashboard_previews_total",
    "What-if previews requested from the allocator.",
    ["outcome"],
)
