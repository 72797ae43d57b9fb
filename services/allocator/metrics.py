"""Prometheus series of the allocator's decisions and its control loop.

Per-intent gauges carry the intent's name (``intent``) and id (``intent_id``: names need not be
unique). They are read at scrape time from the last plan's Decisions (a custom collector, not
one Gauge child per intent and metric: at 10,000 intents those were 40,000 children, each with
its own lock, that the tick had to set and the cyclic collector had to walk), so a deleted
intent stops being reported the moment it leaves the plan. RPC counters and latency come from
the common interceptor.
"""

from __future__ import annotations

import itertools
import operator
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from services.common.grpc_server import TEXT_SECTIONS
from services.common.memory import ShrinkWatch
from services.core import model
from services.core.memo import previous_rows
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
STORE_COMMIT_SECONDS = Histogram(
    "parfusion_store_commit_duration_seconds",
    "Wall time of one group commit of intent changes: its SQLite statements and the mirror",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
STORE_CHECKPOINT_SECONDS = Histogram(
    "parfusion_store_checkpoint_duration_seconds",
    "Wall time of one WAL checkpoint of the intent store, run beside the commits",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0),
)
STORE_GROUP_CHANGES = Histogram(
    "parfusion_store_commit_group_changes",
    "Changes (submits, deletes) committed together in one group",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
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
    # finer from 0.2 to 0.5 s: a p99 against the 250 ms period must not read as "somewhere in
    # (0.3, 0.5]"
    buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.125, 0.15)
    + (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 1.0, 2.5),
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
PEER_FAILURES = Counter(
    "parfusion_allocator_peer_call_failures_total",
    "Calls to the node agent and gpulane that failed or missed their deadline, by status code",
    ["peer", "call", "code"],
)
RESYNCS = Counter(
    "parfusion_allocator_resyncs_total",
    "Deltas a side did not hold the base of, answered by a whole plan or telemetry reply",
    ["peer", "stream"],
)

_INTENT_ID = operator.attrgetter("intent_id")
CLASSES = ("ONLINE", "BATCH", "ROBOT", "URGENT")


# per-intent gauges: name, help, and how the value comes from a Decision
_FROM_DECISION: tuple[tuple[str, str, Callable[[model.Decision], float]], ...] = (
    ("parfusion_dmug_units", "CPU units (workers) allocated to the intent", lambda d: d.units),
    (
        "parfusion_dmug_deadline_risk",
        "Predicted probability-like risk of missing the deadline (0-1)",
        lambda d: d.deadline_risk,
    ),
    (
        "parfusion_dmug_slack_seconds",
        "Deadline minus predicted tail latency",
        lambda d: d.slack_ms / 1000.0,
    ),
    (
        "parfusion_dmug_nmu",
        "Normalised marginal utility of the intent's last unit",
        lambda d: d.nmu,
    ),
)
# set from telemetry, not from the plan
_PREDICTION_ERROR = (
    "parfusion_dmug_prediction_error_ratio",
    "Last plan's predicted tail latency over the observed one, minus 1 (negative: under-predicted)",
)
_LATENCY_CORRECTION = (
    "parfusion_dmug_latency_correction_ratio",
    "Observed / modelled tail latency the predictor has learnt; D-MUG plans with it",
)
_LABELS = ["intent", "intent_id"]


class DecisionMetrics:
    """Keeps the last plan's Decision and name per intent for the per-intent gauges, counts
    the plan's changes, and forgets intents no longer planned.

    A row whose Decision is the very object it was last recorded from (the policies keep
    unchanged Decisions, which are frozen) under the same intent name is not looked at again:
    those rows are found by C-level passes over the rows, matched by intent id, so a big tick
    costs no Python code per unchanged row.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # per intent id: the Decision and the name its series show
        self._decision: dict[str, model.Decision] = {}
        self._name: dict[str, str] = {}
        # per intent id: (name, value) of the calibration gauges
        self._error: dict[str, tuple[str, float]] = {}
        self._correction: dict[str, tuple[str, float]] = {}
        # the last recorded plan's ids, Decisions and names, in order, while the tables above
        # hold exactly them (rows that kept their place are compared by position)
        self._ids: list[str] = []
        self._decisions: Sequence[model.Decision] = ()
        self._labels: list[str] = []
        self._shrink = ShrinkWatch()  # the tables are rebuilt after a large shrink
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
        with self._lock:
            last, named = self._decision, self._name
            before = list(previous_rows(self._ids, ids, self._decisions, last.get))
            named_before = previous_rows(self._ids, ids, self._labels, named.get)
            moved = map(
                operator.or_,
                map(operator.is_not, decisions, before),
                map(operator.ne, labels, named_before),
            )
            rows = list(itertools.compress(range(len(ids)), moved))
            if window:
                # a Decision that is the very object of the last plan is no change (see
                # plan_changes), so the rows looked at are all the rows that can count
                previous = {ids[k]: d for k in rows if (d := before[k]) is not None}
                changes = plan_changes(previous, [decisions[k] for k in rows], tick, window)
                _count_changes(changes)
            for k in rows:
                last[ids[k]] = decisions[k]
                named[ids[k]] = labels[k]
            if len(last) > len(ids):
                self._drop(last.keys() - set(ids))
            self._compact_if_shrunk()
            self._ids, self._decisions, self._labels = ids, decisions, labels

    def record_prediction_errors(
        self,
        errors: Mapping[str, float],
        corrections: Mapping[str, Any],
    ) -> None:
        """Per intent: the last plan's prediction error and the predictor's latency correction
        (a CalibrationState or None); forgotten with the intent. Only intents in the plan get
        them, under the plan's name: telemetry read before an intent was deleted can arrive
        after it left, and an entry made then would never be dropped."""
        with self._lock:
            named = self._name
            for intent_id, error in errors.items():
                name = named.get(intent_id)
                if name is None:
                    continue
                self._error[intent_id] = (name, error)
                cal = corrections.get(intent_id)
                if cal is not None:
                    self._correction[intent_id] = (name, cal.correction)

    def forget(self, intent_ids: Iterable[str]) -> None:
        with self._lock:
            self._drop(set(intent_ids))
            self._compact_if_shrunk()

    def close(self) -> None:
        """Stop reporting this loop's series (a stopped loop)."""
        _LIVE.discard(self)

    def _drop(self, ids: set[str]) -> None:
        # the tables no longer hold the last plan's rows
        self._ids, self._decisions, self._labels = [], (), []
        for table in (self._decision, self._name, self._error, self._correction):
            for intent_id in ids & table.keys():
                del table[intent_id]

    def _compact_if_shrunk(self) -> None:
        """A dict keeps its table's size when entries go: copies after a large shrink
        (services/common/memory.py; the lock held)."""
        if self._shrink.shrunk(len(self._decision)):
            self._decision, self._name = dict(self._decision), dict(self._name)
            self._error, self._correction = dict(self._error), dict(self._correction)

    def series(self) -> list[tuple[str, str, list[tuple[str, str, float]]]]:
        """The per-intent gauges as they stand: (metric, help, [(name, intent id, value)])."""
        with self._lock:  # copies at C speed; the rows are built outside the lock
            decisions, names = dict(self._decision), dict(self._name)
            errors, corrections = dict(self._error), dict(self._correction)
        out = []
        for metric, doc, value in _FROM_DECISION:
            rows = [(names.get(i, i), i, value(d)) for i, d in decisions.items()]
            out.append((metric, doc, rows))
        for (metric, doc), table in (
            (_PREDICTION_ERROR, errors),
            (_LATENCY_CORRECTION, corrections),
        ):
            out.append((metric, doc, [(name, i, v) for i, (name, v) in table.items()]))
        return out


class _PerIntentCollector(Collector):
    """The per-intent gauges of every live loop (one in a service; tests may run several)."""

    def describe(self) -> list[Metric]:
        names = [(m, doc) for m, doc, _ in _FROM_DECISION] + [
            _PREDICTION_ERROR,
            _LATENCY_CORRECTION,
        ]
        return [GaugeMetricFamily(m, doc, labels=_LABELS) for m, doc in names]

    def collect(self) -> Iterator[Metric]:
        for metric, doc, rows in _merged_series():
            family = GaugeMetricFamily(metric, doc, labels=_LABELS)
            for name, intent_id, value in rows:
                family.add_metric([name, intent_id], value)
            yield family


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _merged_series() -> list[tuple[str, str, list[tuple[str, str, float]]]]:
    merged: dict[str, tuple[str, str, list[tuple[str, str, float]]]] = {}
    for metrics in list(_LIVE):
        for metric, doc, rows in metrics.series():
            kept = merged.setdefault(metric, (metric, doc, rows))
            if kept[2] is not rows:
                kept[2].extend(rows)
    return list(merged.values())


def per_intent_text() -> bytes:
    """The per-intent gauges of every live loop in Prometheus' text format, as
    generate_latest(PER_INTENT) writes them, at a fraction of its cost: each intent's label
    pair is escaped once for all six metrics (a scrape at 10,000 intents holds the interpreter
    lock for the whole of it)."""
    pairs: dict[tuple[str, str], str] = {}
    out: list[str] = []
    for metric, doc, rows in _merged_series():
        out.append(f"# HELP {metric} {_help_text(doc)}\n# TYPE {metric} gauge\n")
        for name, intent_id, value in rows:
            pair = pairs.get((name, intent_id))
            if pair is None:
                pair = f'intent="{_label_value(name)}",intent_id="{_label_value(intent_id)}"'
                pairs[name, intent_id] = pair
            out.append(f"{metric}{{{pair}}} {floatToGoString(value)}\n")
    return "".join(out).encode()


def _help_text(doc: str) -> str:
    return doc.replace("\\", "\\\\").replace("\n", "\\n")


_LIVE: weakref.WeakSet[DecisionMetrics] = weakref.WeakSet()
# The per-intent series, readable in process (get_sample_value) from their own registry; the
# metrics endpoint writes them with per_intent_text, after the default registry's
PER_INTENT = CollectorRegistry(auto_describe=True)
PER_INTENT.register(_PerIntentCollector())
TEXT_SECTIONS.append(per_intent_text)


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
