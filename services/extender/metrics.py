"""Prometheus metrics of the extender: per-verb latency and the decisions it made.

Each app gets its own registry so several apps (tests, benchmarks) can live in one process.
Label values come from bounded sets: verbs, HTTP codes, outcomes, intent sources.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

VERBS = ("filter", "prioritize", "bind", "preempt")
# Sub-millisecond buckets: kube-scheduler budgets an extender a few milliseconds per pod.
LATENCY_BUCKETS = (
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)


class ExtenderMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.request_seconds = Histogram(
            "parfusion_extender_request_duration_seconds",
            "Time to answer one kube-scheduler extender call, by verb",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "parfusion_extender_requests_total",
            "Extender calls by verb and HTTP status code",
            ["verb", "code"],
            registry=r,
        )
        self.pods = Counter(
            "parfusion_extender_pods_total",
            "Pods seen per verb, by where their intent came from (annotation, labels, none, invalid)",
            ["verb", "intent"],
            registry=r,
        )
        self.filter_nodes = Counter(
            "parfusion_extender_filter_nodes_total",
            "Per-node /filter decisions: kept, failed (resolvable), unresolvable, passthrough, "
            "beyond_shortlist (feasible, left out of the shortlist)",
            ["outcome"],
            registry=r,
        )
        self.bindings = Counter(
            "parfusion_extender_bindings_total",
            "Bind calls by mode (api, standalone) and outcome (bound, refused, error)",
            ["mode", "outcome"],
            registry=r,
        )
        self.nodes = Gauge(
            "parfusion_extender_nodes", "Nodes in the extender's node view", registry=r
        )
        self.telemetry_nodes = Gauge(
            "parfusion_extender_telemetry_nodes",
            "Nodes whose view is enriched with live allocator telemetry",
            registry=r,
        )
        for verb in VERBS:
            self.request_seconds.labels(verb)
