"""Prometheus series of the allocator's decisions and its control loop.

Per-intent gauges carry the intent's name (``intent``) and id (``intent_id``: names need not be
unique). They are not gauge children: a collector reads them at scrape time from the Decisions
of the last recorded plan (``DecisionMetrics``), so an intent that leaves the plan leaves the
scrape with it, and a tick that changes thousands of rows sets nothing. (As gauge children, about
0.7 KB each and four to six per intent, 10,000 intents made 30 MB of small objects that
fragmented the heap they were freed from.) RPC counters and latency come from the common
interceptor.
"""

from __future__ import annotations

import itertools
import operator
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from services.core import model
from services.core.stability import PlanChanges, plan_changes

DECISION_SECONDS = Histogram(
    "parfusion_dmug_decision_duration_seconds",
    "Time the active policy took to decide one tick",
    ["policy"],
    buckets=(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
)
STORE_SKIPPED_ROWS = Counter(
    "parfusion_store_skipped_rows_total",
    "Intent rows the store could not read at start-up and left out (logged with their id)",
)
# per-intent gauges (name, help), read at scrape time by _DecisionCollector
_PLAN_SERIES = (
    ("parfusion_dmug_units", "CPU units (workers) allocated to the intent"),
    (
        "parfusion_dmug_deadline_risk",
        "Predicted probability-like risk of missing the deadline (0-1)",
    ),
    ("parfusion_dmug_slack_seconds", "Deadline minus predicted tail latency"),
    ("parfusion_dmug_nmu", "Normalised marginal utility of the intent's last unit"),
)
_CALIBRATION_SERIES = (
    (
        "parfusion_dmug_prediction_error_ratio",
        "Last plan's predicted tail latency over the observed one, minus 1 (negative: "
        "under-predicted)",
    ),
    (
        "parfusion_dmug_latency_correction_ratio",
        "Observed / modelled tail latency the predictor has learnt; D-MUG plans with it",
    ),
)
_INTENT_LABELS = ("intent", "intent_id")
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
PLAN_CHANGES = Counter(
    "parfusion_dmug_plan_changes_total",
    "Intents whose units or degradation level changed from one plan to the next",
    ["kind"],
)
PLAN_FLAPS = Counter(
    "parfusion_dmug_plan_flaps_total",
    "Changes of an intent's units or level within 5 s of its previous change",
)
INTENTS = Gauge("parfusion_allocator_intents", "Intents in the store", ["workload_class"])
TICKS = Counter("parfusion_allocator_ticks_total", "Control-loop ticks that produced a plan")
NODE_STALE = Gauge("parfusion_allocator_node_stale", "1 while the node agent's telemetry is stale")
TICK_SECONDS = Histogram(
    "parfusion_allocator_tick_duration_seconds",
    "Wall time of one control-loop tick: intents, telemetry pull, policy, plans, publish, push",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.5, 1.0, 2.5),
)
PLAN_SIZE = Gauge(
    "parfusion_allocator_plan_size_bytes",
    "Serialized size of the last whole plan (node: NodePlan, gpu: GpuPlan)",
    ["plan"],
)
PEER_BYTES = Counter(
    "parfusion_allocator_peer_bytes_total",
    "Bytes of plans and telemetry exchanged with the node agent and gpulane (message sizes)",
    ["peer", "direction"],
)
RESYNCS = Counter(
    "parfusion_allocator_resyncs_total",
    "Deltas a side did not hold the base of, answered by a whole plan or telemetry reply",
    ["peer", "stream"],
)

_INTENT_ID = operator.attrgetter("intent_id")
CLASSES = ("ONLINE", "BATCH", "ROBOT", "URGENT")


class DecisionMetrics:
    """The per-intent series of the last recorded plan, read by the collector at scrape time.

    ``record`` keeps each tick's Decisions and names by intent id (two C-level dict builds);
    plan changes and flaps are counted on the rows whose Decision is not the very object of
    the last plan or whose name changed, found by C-level passes over the rows. Prediction
    errors and corrections come from telemetry and are kept for intents in the plan only.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # per intent id in the last plan: its Decision and its name (the `intent` label)
        self._decision: dict[str, model.Decision] = {}
        self._name: dict[str, str] = {}
        # per intent id: (last prediction error, last latency correction or None)
        self._calibration: dict[str, tuple[float, float | None]] = {}
        _LIVE.add(self)

    def record(
        self,
        result: model.PlanResult,
        names: Mapping[str, str],
        seconds: float,
        tick: int = 0,
        window: int = 0,
    ) -> None:
        """Publish one tick's decisions; with `window` (stability.window_ticks), count the
        plan's changes and flaps against the last recorded plan."""
        DECISION_SECONDS.labels(result.policy).observe(seconds)
        if result.degradations:
            DEGRADATIONS.labels(result.policy).inc(result.degradations)
        if result.preemptions:
            PREEMPTIONS.labels(result.policy).inc(result.preemptions)
        TICKS.inc()
        decisions = result.decisions
        ids = list(map(_INTENT_ID, decisions))
        labels = list(map(names.get, ids, ids))
        decision, name = dict(zip(ids, decisions, strict=True)), dict(zip(ids, labels, strict=True))
        with self._lock:
            if window:
                before = list(map(self._decision.get, ids))
                moved = map(
                    operator.or_,
                    map(operator.is_not, decisions, before),
                    map(operator.ne, labels, map(self._name.get, ids)),
                )
                rows = list(itertools.compress(range(len(ids)), moved))
                # a Decision that is the very object of the last plan is no change (see
                # plan_changes), so the rows looked at are all the rows that can count
                previous = {ids[k]: d for k in rows if (d := before[k]) is not None}
                changes = plan_changes(previous, [decisions[k] for k in rows], tick, window)
                _count_changes(changes)
            self._decision, self._name = decision, name
            if self._calibration.keys() - decision.keys():
                self._calibration = {i: c for i, c in self._calibration.items() if i in decision}

    def record_prediction_errors(
        self,
        errors: Mapping[str, float],
        corrections: Mapping[str, Any],
    ) -> None:
        """Per intent: the last plan's prediction error and the predictor's latency correction
        (a CalibrationState or None; None keeps the last one). Only intents in the plan get
        these: telemetry read before an intent was deleted can arrive after it left."""
        with self._lock:
            for intent_id, error in errors.items():
                if intent_id not in self._decision:
                    continue
                cal = corrections.get(intent_id)
                kept = self._calibration.get(intent_id)
                correction = cal.correction if cal is not None else kept[1] if kept else None
                self._calibration[intent_id] = (error, correction)

    def forget(self, intent_ids: Iterable[str]) -> None:
        """Drop these intents' series now (the next record would, for intents not planned);
        the tables are built afresh by the next record."""
        with self._lock:
            for intent_id in intent_ids:
                if self._decision.pop(intent_id, None) is not None:
                    del self._name[intent_id]
                    self._calibration.pop(intent_id, None)

    def samples(self) -> tuple[list[tuple[str, str, model.Decision]], list[tuple[Any, ...]]]:
        """(name, id, Decision) per intent in the plan; (name, id, error, correction) per
        intent with a prediction error."""
        with self._lock:
            decisions, name = list(self._decision.items()), dict(self._name)
            calibration = list(self._calibration.items())
        rows = [(name[i], i, d) for i, d in decisions]
        return rows, [(name[i], i, *c) for i, c in calibration if i in name]


_LIVE: weakref.WeakSet[DecisionMetrics] = weakref.WeakSet()


class _DecisionCollector:
    """The per-intent gauges of every live DecisionMetrics (one per control loop)."""

    def describe(self) -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(n, h, labels=_INTENT_LABELS)
            for n, h in _PLAN_SERIES + _CALIBRATION_SERIES
        ]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        units, risk, slack, nmu, error, correction = self.describe()
        for metrics in list(_LIVE):
            rows, cal = metrics.samples()
            for name, intent_id, d in rows:
                labels = [name, intent_id]
                units.add_metric(labels, d.units)
                risk.add_metric(labels, d.deadline_risk)
                slack.add_metric(labels, d.slack_ms / 1000.0)
                nmu.add_metric(labels, d.nmu)
            for name, intent_id, err, corr in cal:
                error.add_metric([name, intent_id], err)
                if corr is not None:
                    correction.add_metric([name, intent_id], corr)
        yield from (units, risk, slack, nmu, error, correction)


REGISTRY.register(_DecisionCollector())


def _count_changes(changes: PlanChanges) -> None:
    if changes.units:
        PLAN_CHANGES.labels("units").inc(changes.units)
    if changes.levels:
        PLAN_CHANGES.labels("level").inc(changes.levels)
    if changes.flaps:
        PLAN_FLAPS.inc(changes.flaps)


def set_intent_counts(counts_by_class: Mapping[str, int]) -> None:
    for cls in CLASSES:
        INTENTS.labels(cls).set(counts_by_class.get(cls, 0))


def set_node_stale(stale: bool) -> None:
    NODE_STALE.set(1 if stale else 0)
