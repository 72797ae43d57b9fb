"""Prometheus series of the allocator's decisions and its control loop.

Per-intent gauges carry the intent's name (``intent``) and id (``intent_id``: names need not be
unique); their series are removed when the intent leaves the plan, so a deleted intent stops
being reported instead of freezing at its last value. RPC counters and latency come from the
common interceptor.
"""

from __future__ import annotations

import itertools
import operator
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from services.common.memory import ShrinkWatch
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
PREDICTION_ERROR = Gauge(
    "parfusion_dmug_prediction_error_ratio",
    "Last plan's predicted tail latency over the observed one, minus 1 (negative: under-predicted)",
    ["intent", "intent_id"],
)
LATENCY_CORRECTION = Gauge(
    "parfusion_dmug_latency_correction_ratio",
    "Observed / modelled tail latency the predictor has learnt; D-MUG plans with it",
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

PER_INTENT = (UNITS, RISK, SLACK, NMU)
CALIBRATION = (PREDICTION_ERROR, LATENCY_CORRECTION)  # set from telemetry, not from the plan
_INTENT_ID = operator.attrgetter("intent_id")
CLASSES = ("ONLINE", "BATCH", "ROBOT", "URGENT")


# (intent, intent_id) labels, the Decision the series were set from, and the four gauges' children
# for those labels (looking a child up by its labels costs more than setting it)
_Series = tuple[tuple[str, str], model.Decision, tuple[Any, ...]]


class DecisionMetrics:
    """Publishes one tick's decisions and forgets the series of intents no longer planned.

    A series whose Decision is the very object it was last set from (the policies keep
    unchanged Decisions, which are frozen) under the same intent name already holds its
    values and is not set again (setting four gauges per intent is a large part of a big
    tick). Those rows are found by C-level passes over the rows, matched by intent id, so
    intents coming and going cost no Python code per unchanged row.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: dict[str, _Series] = {}  # per intent id
        # per intent id: the Decision and the name its series were last set from
        self._decision: dict[str, model.Decision] = {}
        self._name: dict[str, str] = {}
        self._shrink = ShrinkWatch()  # the tables are rebuilt after a large shrink

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
        with self._lock:
            last, named = self._decision, self._name
            before = list(map(last.get, ids))
            moved = map(
                operator.or_,
                map(operator.is_not, decisions, before),
                map(operator.ne, labels, map(named.get, ids)),
            )
            rows = list(itertools.compress(range(len(ids)), moved))
            if window:
                # a Decision that is the very object of the last plan is no change (see
                # plan_changes), so the rows looked at are all the rows that can count
                previous = {ids[k]: d for k in rows if (d := before[k]) is not None}
                changes = plan_changes(previous, [decisions[k] for k in rows], tick, window)
                _count_changes(changes)
            for k in rows:
                self._set(decisions[k], labels[k])
            if len(self._series) > len(ids):
                for intent_id in self._series.keys() - set(ids):
                    self._remove(self._series.pop(intent_id)[0])
                    del last[intent_id], named[intent_id]
            self._compact_if_shrunk()

    def _set(self, d: model.Decision, name: str) -> None:
        key = (name, d.intent_id)
        kept = self._series.get(d.intent_id)
        if kept is not None and kept[0] == key:
            children = kept[2]
        else:
            if kept is not None:
                self._remove(kept[0])  # renamed: the old series goes
            children = tuple(gauge.labels(*key) for gauge in PER_INTENT)
        units, risk, slack, nmu = children
        units.set(d.units)
        risk.set(d.deadline_risk)
        slack.set(d.slack_ms / 1000.0)
        nmu.set(d.nmu)
        self._series[d.intent_id] = (key, d, children)
        self._decision[d.intent_id] = d
        self._name[d.intent_id] = name

    def record_prediction_errors(
        self,
        errors: Mapping[str, float],
        corrections: Mapping[str, Any],
    ) -> None:
        """Per intent: the last plan's prediction error and the predictor's latency correction
        (a CalibrationState or None); removed with the intent's other series. Only intents
        with series get these: telemetry read before an intent was deleted can arrive after
        its series went, and a series made then would never be removed."""
        with self._lock:
            for intent_id, error in errors.items():
                kept = self._series.get(intent_id)
                if kept is None:
                    continue
                PREDICTION_ERROR.labels(*kept[0]).set(error)
                cal = corrections.get(intent_id)
                if cal is not None:
                    LATENCY_CORRECTION.labels(*kept[0]).set(cal.correction)

    def forget(self, intent_ids: Iterable[str]) -> None:
        ids = set(intent_ids)
        if not ids:
            return
        with self._lock:
            for intent_id in ids:
                kept = self._series.pop(intent_id, None)
                if kept is not None:
                    self._remove(kept[0])
                    del self._decision[intent_id], self._name[intent_id]
            self._compact_if_shrunk()

    def _compact_if_shrunk(self) -> None:
        """After a large shrink, rebuild the per-intent tables, here and in the gauges (the
        lock held; services/common/memory.py)."""
        if not self._shrink.shrunk(len(self._series)):
            return
        self._series, self._decision = dict(self._series), dict(self._decision)
        self._name = dict(self._name)
        for gauge in PER_INTENT + CALIBRATION:
            # prometheus_client keeps a metric's children in `_metrics`, guarded by `_lock`
            # (unchanged since 0.4); it has no call that rebuilds the table
            with gauge._lock:
                gauge._metrics = dict(gauge._metrics)

    @staticmethod
    def _remove(key: tuple[str, str]) -> None:
        for gauge in PER_INTENT + CALIBRATION:
            try:
                gauge.remove(*key)
            except KeyError:
                pass


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
