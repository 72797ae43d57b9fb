"""Prometheus series of the allocator's decisions and its control loop.

Per-intent gauges carry the intent's name (``intent``) and id (``intent_id``: names need not be
unique); their series are removed when the intent leaves the plan, so a deleted intent stops
being reported instead of freezing at its last value. RPC counters and latency come from the
common interceptor.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from prometheus_client import Counter, Gauge, Histogram

from services.allocator import model

DECISION_SECONDS = Histogram(
    "parfusion_dmug_decision_duration_seconds",
    "Time the active policy took to decide one tick",
    ["policy"],
    buckets=(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
)
UNITS = Gauge(
    "parfusion_dmug_units", "CPU units (workers) allocated to the intent", ["intent", "intent_id"]
)
RISK = Gauge(
    "parfusion_dmug_deadline_risk",
    "Predicted probability-like risk of missing the deadline (0-1)",
    ["intent", "intent_id"],
)
SLACK = Gauge(
    "parfusion_dmug_slack_seconds", "Deadline minus predicted tail latency", ["intent", "intent_id"]
)
NMU = Gauge(
    "parfusion_dmug_nmu",
    "Normalised marginal utility of the intent's last unit",
    ["intent", "intent_id"],
)
DEGRADATIONS = Counter(
    "parfusion_dmug_degradations_total",
    "Intents planned below NORMAL precision, per tick",
    ["policy"],
)
PREEMPTIONS = Counter(
    "parfusion_dmug_preemptions_total",
    "Units taken from preemptible intents for urgent work",
    ["policy"],
)
INTENTS = Gauge("parfusion_allocator_intents", "Intents in the store", ["workload_class"])
TICKS = Counter("parfusion_allocator_ticks_total", "Control-loop ticks that produced a plan")
NODE_STALE = Gauge("parfusion_allocator_node_stale", "1 while the node agent's telemetry is stale")

PER_INTENT = (UNITS, RISK, SLACK, NMU)
CLASSES = ("ONLINE", "BATCH", "ROBOT", "URGENT")


class DecisionMetrics:
    """Publishes one tick's decisions and forgets the series of intents no longer planned.

    A series whose Decision is the very object it was last set from (the policies keep
    unchanged Decisions, which are frozen) already holds its values and is not set again: at
    10,000 intents setting four gauges each takes about 110 ms a tick.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: dict[tuple[str, str], model.Decision] = {}  # series -> Decision set from

    def record(self, result: model.PlanResult, names: Mapping[str, str], seconds: float) -> None:
        DECISION_SECONDS.labels(result.policy).observe(seconds)
        if result.degradations:
            DEGRADATIONS.labels(result.policy).inc(result.degradations)
        if result.preemptions:
            PREEMPTIONS.labels(result.policy).inc(result.preemptions)
        TICKS.inc()
        with self._lock:
            last = self._series
        current: dict[tuple[str, str], model.Decision] = {}
        for d in result.decisions:
            key = (names.get(d.intent_id, d.intent_id), d.intent_id)
            current[key] = d
            if last.get(key) is d:
                continue
            UNITS.labels(*key).set(d.units)
            RISK.labels(*key).set(d.deadline_risk)
            SLACK.labels(*key).set(d.slack_ms / 1000.0)
            NMU.labels(*key).set(d.nmu)
        with self._lock:
            gone = self._series.keys() - current.keys()
            self._series = current
        self._remove(gone)

    def forget(self, intent_ids: Iterable[str]) -> None:
        ids = set(intent_ids)
        if not ids:
            return
        with self._lock:
            gone = {key for key in self._series if key[1] in ids}
            self._series = {k: d for k, d in self._series.items() if k not in gone}
        self._remove(gone)

    @staticmethod
    def _remove(keys: Iterable[tuple[str, str]]) -> None:
        for key in keys:
            for gauge in PER_INTENT:
                try:
                    gauge.remove(*key)
                except KeyError:
                    pass


def set_intent_counts(counts_by_class: Mapping[str, int]) -> None:
    for cls in CLASSES:
        INTENTS.labels(cls).set(counts_by_class.get(cls, 0))


def set_node_stale(stale: bool) -> None:
    NODE_STALE.set(1 if stale else 0)
