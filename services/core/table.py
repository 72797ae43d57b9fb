"""The tick's intents as columns (IntentTable): what every D-MUG phase and every policy reads.

``build_table`` turns PlanInput into numpy columns: the specs' own fields (read once and kept
between ticks by services/core/memo.py while the spec objects stay the same), the capacity
caps, the contention inflation, the predictor's service times and the previous plan. ``Rows``
gathers the model parameters of the rows one step works on and evaluates the latency and risk
formulas (services/core/formulas.py) on them.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from services.core.columns import base_columns, read_spec_columns, service_columns
from services.core.formulas import (
    Values,
    deadline_risk,
    latency_inflation,
    predicted_latency_ms,
    slack_ms,
)
from services.core.memo import TickMemo
from services.core.model import (
    DEGRADATION_ORDER,
    Decision,
    IntentSpec,
    PlanInput,
)

LEVEL_INDEX = {name: i for i, name in enumerate(DEGRADATION_ORDER)}

_PREVIOUS_GETTER = operator.attrgetter(
    "units", "since_tick", "level_since_tick", "level_backoff", "level_raised"
)
_LEVEL_GETTER = operator.attrgetter("degradation")
_NO_PREVIOUS = Decision("", 0)  # stands in for "no previous decision" (units 0, NORMAL)


@dataclass
class IntentTable:
    """The tick's intents as columns (index i = position in PlanInput.intents)."""

    specs: Sequence[IntentSpec]
    ids: Sequence[str]
    cls: np.ndarray
    weight: np.ndarray
    deadline: np.ndarray
    has_deadline: np.ndarray
    min_units: np.ndarray
    cap: np.ndarray
    preferred: np.ndarray
    f: np.ndarray
    tail1: np.ndarray
    mean1: np.ndarray
    rel_spread: np.ndarray
    arrival: np.ndarray
    inflation: np.ndarray
    uses_gpu: np.ndarray
    ladder: np.ndarray  # (n, 3) bool: level allowed
    preemptible: np.ndarray
    elastic: np.ndarray
    seq: np.ndarray
    prev_units: np.ndarray
    prev_since: np.ndarray
    has_prev: np.ndarray
    level_factor: np.ndarray  # (3,) latency multiplier per degradation level
    prev_level: np.ndarray  # previous decision's degradation level (index), 0 if none
    prev_level_since: np.ndarray  # tick at which that level was taken
    prev_level_backoff: np.ndarray  # its failed step-ups in a row (Decision.level_backoff)
    prev_level_raised: np.ndarray  # bool: that level was taken by a step up
    stream_hint: np.ndarray  # the specs' gpu_stream_priority_hint
    concurrency: np.ndarray  # the specs' gpu_concurrency (0: the default)
    previous: list[Decision] | None = None  # previous decision per row (_NO_PREVIOUS if none)
    rank: np.ndarray | None = None  # tie rank (dmug.tie_rank), filled on first use

    @property
    def n(self) -> int:
        return len(self.specs)

    def take(self, idx: np.ndarray | None = None, column: bool = False) -> Rows:
        """The model parameters of rows idx (all rows when None), as (k,) or (k, 1) columns."""
        every = (self.tail1, self.mean1, self.f, self.arrival, self.inflation, self.deadline,
                 self.rel_spread, self.has_deadline, self.weight, self.cap)  # fmt: skip
        if idx is None:
            return Rows(*(c[:, None] for c in every)) if column else Rows(*every)
        at = np.asarray(idx)[:, None] if column else idx  # (k, 1) columns in the same gather
        return Rows(*(c[at] for c in every))

    def latency(self, idx: np.ndarray | int, p: Values, level: int | np.ndarray = 0) -> np.ndarray:
        """L(p) for rows idx at units p and degradation level (scalar or array), gathering only
        the columns the latency formula reads."""
        return predicted_latency_ms(
            self.tail1[idx], self.mean1[idx], self.f[idx], p, self.arrival[idx],
            self.inflation[idx] * self.level_factor[level],
        )  # fmt: skip

    def risk(self, idx: np.ndarray, p: Values, level: int | np.ndarray = 0) -> np.ndarray:
        return self.take(idx).risk(p, self.level_factor[level])


@dataclass(slots=True)
class Rows:
    """Model parameters gathered once for the rows one step works on."""

    tail1: np.ndarray
    mean1: np.ndarray
    f: np.ndarray
    arrival: np.ndarray
    inflation: np.ndarray
    deadline: np.ndarray
    rel_spread: np.ndarray
    has_deadline: np.ndarray
    weight: np.ndarray
    cap: np.ndarray

    def latency(self, p: Values, level_factor: Values) -> np.ndarray:
        return predicted_latency_ms(
            self.tail1, self.mean1, self.f, p, self.arrival, self.inflation * level_factor
        )

    def risk_at(self, latency: np.ndarray) -> np.ndarray:
        r = deadline_risk(slack_ms(self.deadline, latency), latency, self.rel_spread)
        return np.where(self.has_deadline, r, 0.0)

    def risk(self, p: Values, level_factor: Values) -> np.ndarray:
        return self.risk_at(self.latency(p, level_factor))


def build_table(
    state: PlanInput, use_predictor: bool = True, memo: TickMemo | None = None
) -> IntentTable:
    """The tick's intents as columns: the specs' own fields and what follows from them and the
    node's capacity (kept in `memo` between ticks while the spec objects and the capacity are
    the same), then this tick's pressure, stats and previous plan."""
    specs = state.intents
    n = len(specs)
    capacity = max(int(state.node.cpu_units), 0)
    columns = memo.columns_for(specs) if memo is not None else read_spec_columns(specs)
    base = memo.base if memo is not None else None
    if base is None or base.source is not columns or base.capacity != capacity:
        base = base_columns(columns, capacity)
        if memo is not None:
            memo.base = base
    ids, cls = columns.ids, columns.cls
    f = base.f
    inflation = latency_inflation(
        state.node, state.config.contention_gain, base.uses_gpu, base.network_bound
    )
    stats = state.stats if use_predictor else {}
    last_service = memo.service if memo is not None else None
    tail1, mean1, rel, service = service_columns(specs, columns, base, stats, last_service)
    if memo is not None:  # None (no statistics): the last columns are of no use, nor kept alive
        memo.service = service
    prevs: list[Decision] | None = None
    if state.previous:
        prevs = list(map(state.previous.get, ids, itertools.repeat(_NO_PREVIOUS, n)))
        has_prev = np.fromiter(map(operator.is_not, prevs, itertools.repeat(_NO_PREVIOUS)), bool, n)
        last = memo.last if memo is not None else None
        kept = last.tick_columns_of(prevs, _NO_PREVIOUS) if last is not None else None
        if kept is not None:
            # the previous plan is the one this policy built last tick (and intents appended
            # since): its columns are at hand
            prev_units, prev_since, prev_level_since, prev_level, prev_backoff, raised = kept
        else:
            flat = itertools.chain.from_iterable(map(_PREVIOUS_GETTER, prevs))
            prev_units, prev_since, prev_level_since, prev_backoff, raised = (
                np.fromiter(flat, np.int64, 5 * n).reshape(n, 5).T.copy()
            )
            levels = map(LEVEL_INDEX.get, map(_LEVEL_GETTER, prevs), itertools.repeat(0))
            prev_level = np.fromiter(levels, np.int64, n)
    else:
        prev_units = np.zeros(n, dtype=np.int64)
        prev_since = np.zeros(n, dtype=np.int64)
        has_prev = np.zeros(n, dtype=bool)
        prev_level = np.zeros(n, dtype=np.int64)
        prev_level_since = np.zeros(n, dtype=np.int64)
        prev_backoff = np.zeros(n, dtype=np.int64)
        raised = np.zeros(n, dtype=np.int64)
    speed = state.config.degradation_speedup
    return IntentTable(
        specs=specs,
        ids=ids,
        cls=cls,
        weight=base.weight,
        deadline=base.deadline,
        has_deadline=base.has_deadline,
        min_units=base.min_units,
        cap=base.cap,
        preferred=base.preferred,
        f=f,
        tail1=tail1,
        mean1=mean1,
        rel_spread=rel,
        arrival=base.arrival,
        inflation=np.asarray(inflation, dtype=np.float64),  # (n,): the row columns broadcast
        uses_gpu=columns.uses_gpu,
        ladder=columns.ladder,
        preemptible=columns.preemptible,
        elastic=columns.elastic,
        seq=base.seq,
        prev_units=prev_units,
        prev_since=prev_since,
        has_prev=has_prev,
        level_factor=np.array([float(speed.get(lvl, 1.0)) for lvl in DEGRADATION_ORDER]),
        prev_level=prev_level,
        prev_level_since=prev_level_since,
        prev_level_backoff=prev_backoff,
        prev_level_raised=raised.astype(bool),
        stream_hint=columns.stream_hint,
        concurrency=columns.concurrency,
        previous=prevs,
        rank=base.rank,
    )
