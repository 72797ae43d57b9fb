"""The policy's decisions as the plans the node agent and gpulane enforce.

One Decision per intent becomes one Allocation (workers, cpu set, nice, cgroup plan, GPU lane
and share, predicted latency, slack, risk, NMU, state); the allocations make the NodePlan,
the GPU part of each makes the GpuPlan. Both carry the tick's generation and the policy name.

Building thousands of Allocation messages field by field is most of a large loop tick, while
a steady tick changes few of them (docs/performance.md). ``AllocationCache`` keeps each intent's
Allocation from the last plan, serialized as a NodePlan entry (a NodePlan holding only that
allocation), and reuses it while the Decision is the very same object (the policies keep
unchanged ones, and Decisions are frozen) and the intent is the very same stored message (the
store replaces an intent's message on every change, never edits it). The NodePlan is parsed
once from its header and the entries: protobuf's wire format appends repeated fields when
serialized messages are concatenated, so the result equals the one built field by field, and
nothing handed out aliases the cache.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Mapping, Sequence

from google.protobuf.timestamp_pb2 import Timestamp

from parfusion.v1 import intent_pb2
from services.common.memory import ShrinkWatch
from services.core import model
from services.core.convert import DEGRADATION_TO_PROTO, STATE_TO_PROTO
from services.core.cpuset import format_cpuset
from services.core.memo import previous_rows


def length_delimited(field_number: int, payload: bytes) -> bytes:
    """One embedded-message (or string) field in protobuf's wire format: key, length, payload."""
    return wire_key(field_number, 2) + varint(len(payload)) + payload


def wire_key(field_number: int, wire_type: int) -> bytes:
    return varint(field_number << 3 | wire_type)


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# a plan has a handful of distinct CPU sets (each exclusive block, the shared rest) and thousands
# of allocations naming them: each set's cgroup text is made once
_cpuset_text = functools.lru_cache(maxsize=4096)(format_cpuset)
# a NodePlan entry is the allocations field (6) around one serialized Allocation
_ALLOCATIONS = intent_pb2.NodePlan.DESCRIPTOR.fields_by_name["allocations"].number


def cgroup_path(intent_id: str) -> str:
    """Per-intent cgroup, relative to the delegated root (ids are path-safe by validation)."""
    return f"parfusion/{intent_id}"


def allocation(
    decision: model.Decision, intent: intent_pb2.ResourceIntent | None
) -> intent_pb2.Allocation:
    alloc = intent_pb2.Allocation(
        intent_id=decision.intent_id,
        workers=max(0, decision.pool_size),
        units=max(0, decision.units),
        cpu_set=decision.cpu_set,
        nice=decision.nice,
        cgroup=intent_pb2.CgroupPlan(
            path=cgroup_path(decision.intent_id),
            cpu_weight=max(1, min(10000, decision.cpu_weight)),
            cpu_max=decision.cpu_max,
            cpuset_cpus=_cpuset_text(tuple(decision.cpu_set)),
        ),
        gpu_lane=decision.gpu_lane,
        gpu_indexes=list(decision.gpu_indexes),
        gpu_share_percent=decision.gpu_share_percent,
        stream_priority=decision.stream_priority,
        gpu_concurrency=decision.gpu_concurrency,
        degradation=DEGRADATION_TO_PROTO.get(
            decision.degradation, intent_pb2.DEGRADATION_LEVEL_NORMAL
        ),
        predicted_p99_ms=decision.predicted_p99_ms,
        slack_ms=decision.slack_ms,
        deadline_risk=decision.deadline_risk,
        nmu=decision.nmu,
        state=STATE_TO_PROTO.get(decision.state, intent_pb2.ALLOCATION_STATE_UNSPECIFIED),
        reason=decision.reason,
        preempted_units=decision.preempted_units,
        sched_policy=decision.sched_policy,
    )
    if intent is not None:
        alloc.intent_name = intent.name
        alloc.workload_class = intent.workload_class
        # The workload's shape rides along so the node agent can size and drive the pool.
        alloc.base_service_ms = intent.speedup.base_service_ms
        alloc.parallel_fraction = intent.speedup.parallel_fraction
        alloc.arrival_rate_per_s = intent.demand.arrival_rate_per_s
        alloc.deadline_ms = intent.slo.deadline_ms
    return alloc


_INTENT_ID = operator.attrgetter("intent_id")


class AllocationCache:
    """Each intent's Allocation from the last plan built, as its serialized NodePlan entry.

    Rows are matched by intent id; a row is built again only when its Decision is not the very
    object it was built from or its intent not the very stored message. Finding those rows is
    a few C-level passes over the rows (no Python code per unchanged row), whether or not
    intents came or went since, so the tick after a store change costs about what a steady one
    does. ``workers`` describes the last plan; it is replaced, never changed, so a caller may
    keep it.
    """

    def __init__(self) -> None:
        self._ids: list[str] = []  # the last plan's intent ids, in order
        self._entries: list[bytes] = []  # the last plan's entries, in order
        # the last plan's Decisions and intent messages, in order (rows that kept their place
        # are compared by position, without looking up their id)
        self._decisions: Sequence[model.Decision] = ()
        self._messages: list[intent_pb2.ResourceIntent | None] = []
        # per intent id: the Decision and the intent message its entry was built from
        self._decision: dict[str, model.Decision] = {}
        self._intent: dict[str, intent_pb2.ResourceIntent | None] = {}
        self._entry: dict[str, bytes] = {}
        self.workers: dict[str, int] = {}  # intent id -> Allocation.workers in the last plan
        # what the last call changed against the call before it: the ids whose entry is new
        # or different, and the ids that left (WatchPlans deltas)
        self.changed: list[str] = []
        self.removed: list[str] = []
        self.size = 0  # bytes of the last plan's entries together
        self._shrink = ShrinkWatch()  # the tables are rebuilt after a large shrink

    def entries(
        self,
        decisions: Sequence[model.Decision],
        intents: Mapping[str, intent_pb2.ResourceIntent],
    ) -> list[bytes]:
        """One serialized entry per decision, in order; remembers them for the next plan."""
        ids = list(map(_INTENT_ID, decisions))
        messages = list(map(intents.get, ids))
        layout = ids == self._ids
        # a new row has no Decision before it (None), so it is never the same
        same = map(
            operator.and_,
            map(
                operator.is_,
                decisions,
                previous_rows(self._ids, ids, self._decisions, self._decision.get),
            ),
            map(
                operator.is_,
                messages,
                previous_rows(self._ids, ids, self._messages, self._intent.get),
            ),
        )
        changed = list(itertools.compress(range(len(ids)), map(operator.not_, same)))
        self.changed, self.removed = [], []
        if not changed and layout:
            return self._entries
        workers = dict(self.workers)
        for k in changed:
            d, intent = decisions[k], messages[k]
            alloc = allocation(d, intent)
            self._decision[d.intent_id] = d
            self._intent[d.intent_id] = intent
            # only a rebuilt row makes a new entry: a steady plan adds nothing long-lived for
            # the garbage collector to walk
            entry = length_delimited(_ALLOCATIONS, alloc.SerializeToString())
            old = self._entry.get(d.intent_id)
            if entry != old:
                self._entry[d.intent_id] = entry
                self.changed.append(d.intent_id)
                self.size += len(entry) - (0 if old is None else len(old))
            workers[d.intent_id] = alloc.workers
        if len(self._decision) > len(ids):  # intents left the plan
            self.removed = list(self._decision.keys() - set(ids))
            for intent_id in self.removed:
                self.size -= len(self._entry[intent_id])
                del self._decision[intent_id], self._intent[intent_id], self._entry[intent_id]
                del workers[intent_id]
        if self._shrink.shrunk(len(self._decision)):  # see services/common/memory.py
            self._decision, self._intent = dict(self._decision), dict(self._intent)
            self._entry, workers = dict(self._entry), dict(workers)
        if layout:
            entries = list(self._entries)
            for k in changed:
                entries[k] = self._entry[ids[k]]
        else:
            entries = list(map(self._entry.__getitem__, ids))
        self._ids, self._entries, self.workers = ids, entries, workers
        self._decisions, self._messages = decisions, messages
        return entries

    def changed_entries(self) -> list[bytes]:
        """The entries of the rows the last call rebuilt, in plan order."""
        return list(map(self._entry.__getitem__, self.changed))

    def by_intent(self) -> dict[str, bytes]:
        """The last plan's entries per intent id, in plan order (what a delta is taken from)."""
        return dict(zip(self._ids, self._entries, strict=True))


def node_plan_header(
    result: model.PlanResult,
    node: model.NodeState,
    *,
    generation: int,
    created_at: Timestamp,
    decision_ms: float,
) -> intent_pb2.NodePlan:
    """A NodePlan without its allocations: what a delta to the node agent carries besides them."""
    plan = intent_pb2.NodePlan(
        node=node.name,
        generation=generation,
        policy=result.policy,
        cpu_units=node.cpu_units,
        contention=result.contention,
        node_stale=node.stale,
        decision_ms=decision_ms,
    )
    plan.created_at.CopyFrom(created_at)
    return plan


def node_plan_wire(header_wire: bytes, entries: Sequence[bytes]) -> bytes:
    """A serialized NodePlan from its serialized header and entries, without building it:
    serialized messages concatenate as a merge, which appends repeated fields."""
    return header_wire + b"".join(entries)


def node_plan(
    result: model.PlanResult,
    intents: Mapping[str, intent_pb2.ResourceIntent],
    node: model.NodeState,
    *,
    generation: int,
    created_at: Timestamp,
    decision_ms: float,
    cache: AllocationCache | None = None,
) -> intent_pb2.NodePlan:
    """The tick's NodePlan; with `cache`, unchanged allocations come from the last plan's."""
    plan = node_plan_header(
        result, node, generation=generation, created_at=created_at, decision_ms=decision_ms
    )
    if cache is None:
        plan.allocations.extend(allocation(d, intents.get(d.intent_id)) for d in result.decisions)
        return plan
    return intent_pb2.NodePlan.FromString(
        node_plan_wire(plan.SerializeToString(), cache.entries(result.decisions, intents))
    )


def gpu_plan(
    result: model.PlanResult,
    intents: Mapping[str, intent_pb2.ResourceIntent],
    node: model.NodeState,
    *,
    generation: int,
    created_at: Timestamp,
) -> intent_pb2.GpuPlan:
    plan = intent_pb2.GpuPlan(
        node=node.name,
        generation=generation,
        policy=result.policy,
        gpu_intent_enabled=result.gpu_intent_enabled,
    )
    plan.created_at.CopyFrom(created_at)
    for d in result.decisions:
        if not d.gpu_lane and d.gpu_share_percent <= 0:
            continue
        intent = intents.get(d.intent_id)
        plan.assignments.append(
            intent_pb2.GpuAssignment(
                intent_id=d.intent_id,
                intent_name=intent.name if intent is not None else "",
                lane=d.gpu_lane,
                gpu_indexes=list(d.gpu_indexes),
                share_percent=d.gpu_share_percent,
                stream_priority=d.stream_priority,
                concurrency=d.gpu_concurrency,
                memory_limit_bytes=intent.gpu.memory_bytes if intent is not None else 0,
                degradation=DEGRADATION_TO_PROTO.get(
                    d.degradation, intent_pb2.DEGRADATION_LEVEL_NORMAL
                ),
            )
        )
    return plan
