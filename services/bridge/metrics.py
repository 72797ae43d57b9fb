"""Prometheus metrics of the bridge (parfusion_bridge_*), in base units, on the app's own registry.

What an operator asks of a preemptible robot: how long until the mission reached a safe point,
how long until the urgent task had the robot, whether urgent work met its deadline, how fast
the mission came back and how much progress had to be redone.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.bridge.statemachine import State

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
RATIO_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.25, 1.5, 2, 4)
REPLAN_BUCKETS = (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1)


class BridgeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.state = Gauge(
            "parfusion_bridge_state",
            "1 for the robot's current state, 0 for the others",
            ["state"],
            registry=registry,
        )
        self.time_to_safe_point = Histogram(
            "parfusion_bridge_time_to_safe_point_seconds",
            "From an urgent event's arrival to the mission stopping (at a safe point or a rollback)",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.preemption_latency = Histogram(
            "parfusion_bridge_preemption_latency_seconds",
            "From an urgent event's arrival to its task starting on the robot",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.urgent_completion = Histogram(
            "parfusion_bridge_urgent_completion_seconds",
            "From an urgent event's arrival to its task finishing",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.urgent_deadline_ratio = Histogram(
            "parfusion_bridge_urgent_completion_deadline_ratio",
            "Urgent completion time divided by its deadline (over 1 = missed)",
            buckets=RATIO_BUCKETS,
            registry=registry,
        )
        self.urgent_completed = Counter(
            "parfusion_bridge_urgent_completed_total",
            "Urgent tasks finished, by deadline outcome",
            ["outcome"],
            registry=registry,
        )
        self.urgent_deadline_misses = Counter(
            "parfusion_bridge_urgent_deadline_misses_total",
            "Urgent tasks that finished after their deadline",
            registry=registry,
        )
        self.urgent_received = Counter(
            "parfusion_bridge_urgent_events_total",
            "Urgent events accepted, by source",
            ["source"],
            registry=registry,
        )
        self.urgent_handling = Counter(
            "parfusion_bridge_urgent_handled_total",
            "Urgent tasks started, by whether the allocator granted resources or it ran locally",
            ["mode"],
            registry=registry,
        )
        self.urgent_allocated_units = Gauge(
            "parfusion_bridge_urgent_allocated_units",
            "Units the allocator's latest plan gives the running urgent task (0: none or throttled)",
            registry=registry,
        )
        self.urgent_allocations = Counter(
            "parfusion_bridge_urgent_allocations_total",
            "Urgent tasks by the first allocation the allocator's plan gave them",
            ["state"],
            registry=registry,
        )
        self.allocator_failures = Counter(
            "parfusion_bridge_allocator_failures_total",
            "Allocator calls that failed, by operation and reason",
            ["operation", "reason"],
            registry=registry,
        )
        self.queue_depth = Gauge(
            "parfusion_bridge_urgent_queue_depth",
            "Urgent events waiting for the robot",
            registry=registry,
        )
        self.resume_latency = Histogram(
            "parfusion_bridge_resume_latency_seconds",
            "From the last urgent task finishing (or a restart) to the mission running again",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.steps_redone = Counter(
            "parfusion_bridge_steps_redone_total",
            "Mission steps lost since the last checkpoint and planned again",
            registry=registry,
        )
        self.replan = Histogram(
            "parfusion_bridge_replan_seconds",
            "Time to re-plan the rest of a mission from its checkpoint",
            buckets=REPLAN_BUCKETS,
            registry=registry,
        )
        self.missions = Counter(
            "parfusion_bridge_missions_total",
            "Missions ended, by outcome (met, missed, cancelled)",
            ["outcome"],
            registry=registry,
        )
        self.checkpoints = Counter(
            "parfusion_bridge_checkpoints_total",
            "Durable checkpoints written, by reason",
            ["reason"],
            registry=registry,
        )
        self.ticks = Counter(
            "parfusion_bridge_ticks_total",
            "Control ticks run (background ticker or POST /api/tick)",
            registry=registry,
        )
        for name in ("met", "missed"):
            self.urgent_completed.labels(name)
        self.set_state(State.IDLE)

    def set_state(self, current: State) -> None:
        for state in State:
            self.state.labels(state.value).set(1 if state is current else 0)
