"""Memo between ticks (services/core/memo.py): a policy that keeps its columns and Decisions
from tick to tick gives exactly the PlanResult a fresh policy computes from scratch, for every
policy in the registry, over chains of ticks in which specs, node, config and stats change."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.core.formulas import DEFAULT_REL_SPREAD
from services.core.memo import TickMemo, changed_from, changed_rows, read_spec_columns
from services.core.model import (
    DmugConfig,
    IntentSpec,
    LaneCapacity,
    NodeState,
    PlanInput,
    ServiceStats,
)
from services.core.policies.registry import POLICIES, get_policy
from services.core.table import _NO_PREVIOUS, LEVEL_INDEX, build_table
from tests.core.test_dmug import plan_inputs

CHAIN = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LANES = (LaneCapacity("infer", (0, 1), 200), LaneCapacity("train", ()))
CHANGES = ("same", "same", "spec", "add", "drop", "node", "config", "stats", "gpu", "list")


def _change(draw, state: PlanInput, kind: str) -> PlanInput:
    """The next tick's input: the same objects unless `kind` changes one thing."""
    specs = state.intents
    if kind == "spec" and specs:
        i = draw(st.integers(0, len(specs) - 1))
        field_name, value = draw(
            st.sampled_from(
                [
                    ("priority", draw(st.integers(0, 1000))),
                    ("min_units", draw(st.integers(1, 4))),
                    ("max_units", draw(st.integers(0, 9))),
                    ("base_service_ms", draw(st.floats(1.0, 200.0))),
                    ("preemptible", draw(st.booleans())),
                    ("elastic", draw(st.booleans())),
                    ("degradation", ("NORMAL", "FP16", "INT8")),
                    ("deadline_ms", draw(st.floats(1.0, 200.0))),
                ]
            )
        )
        if field_name == "deadline_ms" and specs[i].workload_class == "BATCH":
            value = 0.0
        new = dataclasses.replace(specs[i], **{field_name: value})
        specs = (*specs[:i], new, *specs[i + 1 :])
    elif kind == "add":
        seq = max((s.seq for s in specs), default=0) + 1
        specs = (*specs, IntentSpec(id=f"n{len(specs)}", name="added", workload_class="ONLINE",
                                    deadline_ms=30.0, min_units=2, seq=seq))  # fmt: skip
    elif kind == "drop" and specs:
        specs = specs[1:]
    elif kind == "gpu" and specs:
        specs = (dataclasses.replace(specs[0], gpu_lane="infer", gpu_share=0.25), *specs[1:])
    elif kind == "list":
        specs = list(specs)  # a new sequence of the same spec objects
    node, config, stats = state.node, state.config, state.stats
    if kind == "node":
        node = dataclasses.replace(
            node, cpu_units=draw(st.integers(0, 40)), contention=draw(st.sampled_from([0.0, 0.6]))
        )
    elif kind == "config":
        config = DmugConfig(
            hysteresis_min_gain=draw(st.sampled_from([0.0, 0.02, 0.5])),
            hysteresis_dwell_ticks=draw(st.integers(0, 4)),
            risk_threshold=draw(st.sampled_from([0.2, 0.5])),
            degradation_speedup={"NORMAL": 1.0, "FP16": 0.5, "INT8": 0.3},
        )
    elif kind == "stats" and specs:
        stats = {specs[0].id: ServiceStats(mean_ms=20.0, p95_ms=30.0, p99_ms=45.0, count=50)}
    return dataclasses.replace(state, intents=specs, node=node, config=config, stats=stats)


@pytest.mark.parametrize("name", list(POLICIES))
@CHAIN
@given(data=st.data())
def test_memo_chain_equals_a_fresh_policy_every_tick(name, data):
    first = data.draw(plan_inputs(max_n=8))
    if data.draw(st.booleans()):
        first = dataclasses.replace(first, node=dataclasses.replace(first.node, lanes=LANES))
        if first.intents:
            spec = dataclasses.replace(first.intents[0], gpu_lane="infer", gpu_share=0.5)
            first = dataclasses.replace(first, intents=(spec, *first.intents[1:]))
    kinds = data.draw(st.lists(st.sampled_from(CHANGES), min_size=1, max_size=6))
    kept = get_policy(name)  # one instance across the chain, as the allocator loop holds it
    state, result = first, None
    for tick, kind in enumerate(["first", *kinds]):
        if kind != "first":
            state = _change(data.draw, state, kind)
            assert result is not None
            state = dataclasses.replace(state, previous=result.by_id(), tick=state.tick + 1)
        result = kept.allocate(state)
        expected = get_policy(name).allocate(
            state
        )  # no memo: every column read, every Decision built
        assert result == expected, (tick, kind)
        assert repr(result) == repr(expected), (tick, kind)  # -0.0 vs 0.0 and types too


def test_unchanged_rows_keep_their_decision_objects():
    specs = _three_specs()
    kept = get_policy("parfusion")
    r1 = kept.allocate(PlanInput(intents=specs, node=_node(12), tick=10))
    r2 = kept.allocate(PlanInput(intents=specs, node=_node(12), previous=r1.by_id(), tick=11))
    r3 = kept.allocate(PlanInput(intents=specs, node=_node(12), previous=r2.by_id(), tick=12))
    assert r3 == r2
    assert all(a is b for a, b in zip(r3.decisions, r2.decisions, strict=True))


def _same_objects_where_equal(before, after) -> int:
    """Pairs that are equal must be the very same object; returns how many there are."""
    equal = [(a, b) for a, b in zip(before, after, strict=True) if a == b]
    assert all(a is b for a, b in equal)
    return len(equal)


def test_rows_keep_their_decisions_and_texts_when_intents_come_and_go():
    """Rows are matched to last tick's by intent id: with an intent added, or a dropped one
    moving every later row up, each row whose Decision (or text) is unchanged keeps the very
    object it had."""
    specs, added = _three_specs(), _ADDED
    kept = get_policy("parfusion")
    r1 = kept.allocate(PlanInput(intents=specs, node=_node(64), tick=1))
    texts1 = kept.memo.reasons.texts  # type: ignore[union-attr]
    state = PlanInput(intents=(*specs, added), node=_node(64), previous=r1.by_id(), tick=2)
    r2 = kept.allocate(state)
    assert r2 == get_policy("parfusion").allocate(state)
    assert _same_objects_where_equal(r1.decisions, r2.decisions[:3]) >= 1
    texts2 = kept.memo.reasons.texts  # type: ignore[union-attr]
    assert _same_objects_where_equal(texts1, texts2[:3]) == 3
    state = PlanInput(intents=(*specs[1:], added), node=_node(64), previous=r2.by_id(), tick=3)
    r3 = kept.allocate(state)
    assert r3 == get_policy("parfusion").allocate(state)
    assert _same_objects_where_equal(r2.decisions[1:], r3.decisions) >= 1
    texts3 = kept.memo.reasons.texts  # type: ignore[union-attr]
    assert _same_objects_where_equal(texts2[1:], texts3) >= 3


def test_only_rows_whose_inputs_changed_are_formatted_again():
    specs = tuple(
        IntentSpec(id=f"i{k}", name=f"w{k}", workload_class=cls, deadline_ms=dl, min_units=2,
                   max_units=5, base_service_ms=20.0, seq=k)
        for k, (cls, dl) in enumerate([("ONLINE", 40.0), ("BATCH", 0.0), ("ROBOT", 30.0)])
    )  # fmt: skip
    kept = get_policy("parfusion")
    r1 = kept.allocate(PlanInput(intents=specs, node=_node(12), tick=1))
    assert kept.memo.reasons is not None
    texts = kept.memo.reasons.texts
    # the robot's observed service time moves its predicted p99: its text alone is formatted
    stats = {"i2": ServiceStats(mean_ms=9.0, p95_ms=11.0, p99_ms=12.0, count=50)}
    state = PlanInput(intents=specs, node=_node(12), stats=stats, previous=r1.by_id(), tick=2)
    r2 = kept.allocate(state)
    again = kept.memo.reasons.texts
    assert again[0] is texts[0] and again[1] is texts[1]  # kept, not formatted again
    assert again[2] is not texts[2] and again[2] != texts[2]
    assert r2 == get_policy("parfusion").allocate(state)


def test_changed_spec_object_rereads_columns():
    a = IntentSpec(id="a", name="a", workload_class="BATCH", min_units=1)
    memo = TickMemo()
    first = memo.columns_for((a,))
    assert memo.columns_for((a,)) is first
    b = dataclasses.replace(a, min_units=3)  # same id, new object
    second = memo.columns_for((b,))
    assert second is not first and second.numeric[2, 0] == 3.0
    specs = [a]
    memo.columns_for(specs)
    specs[0] = b  # the same list, mutated in place: identity per element still catches it
    assert memo.columns_for(specs).numeric[2, 0] == 3.0


def _columns_equal(a, b) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape, f.name
            assert np.array_equal(x, y) and not x.flags.writeable, f.name
        else:
            assert x == y, f.name


def test_columns_of_changed_specs_are_read_alone_and_the_rest_gathered():
    specs = [
        IntentSpec(id=f"s{k}", name=f"s{k}", workload_class=cls, priority=k * 50,
                   deadline_ms=dl, min_units=1 + k % 3, max_units=k, gpu_lane="gl" if k % 2 else "",
                   degradation=("NORMAL", "FP16") if k % 3 else ("NORMAL",), preemptible=k % 2 == 0,
                   gpu_concurrency=k, seq=k)
        for k, (cls, dl) in enumerate([("ONLINE", 40.0), ("BATCH", 0.0), ("ROBOT", 30.0),
                                       ("URGENT", 5.0), ("BATCH", 0.0), ("ONLINE", 12.0)])
    ]  # fmt: skip
    memo = TickMemo()
    memo.columns_for(specs)
    changed = dataclasses.replace(specs[2], min_units=4, degradation=("NORMAL", "INT8"))
    added = IntentSpec(id="s9", name="s9", workload_class="URGENT", deadline_ms=3.0, seq=9)
    for step in (
        [*specs[:2], changed, *specs[3:]],  # one replaced
        [*specs, added],  # one added
        specs[1:],  # the first dropped: every row moves up
        [specs[5], specs[0], specs[3], added, specs[1]],  # reordered, dropped and added
    ):
        got = memo.columns_for(step)
        _columns_equal(got, read_spec_columns(step))
        memo.columns_for(specs)  # back to the first columns for the next step


def test_service_columns_recompute_only_rows_with_new_stats_objects():
    specs = tuple(
        IntentSpec(id=f"v{k}", name=f"v{k}", workload_class="ONLINE", deadline_ms=50.0,
                   base_service_ms=10.0 + k, target_percentile=95.0 if k == 2 else 99.0, seq=k)
        for k in range(3)
    )  # fmt: skip
    one = ServiceStats(mean_ms=8.0, p95_ms=11.0, p99_ms=14.0, count=40, observed_units=2)
    two = ServiceStats(mean_ms=20.0, p95_ms=25.0, p99_ms=31.0, count=9)
    memo = TickMemo()

    def table(stats):
        state = PlanInput(intents=specs, node=_node(8), stats=stats)
        kept, fresh = build_table(state, memo=memo), build_table(state)
        for name in ("tail1", "mean1", "rel_spread"):
            assert np.array_equal(getattr(kept, name), getattr(fresh, name)), name
        return kept

    first = table({"v0": one, "v2": two})
    again = table({"v0": one, "v2": two})  # a new mapping, the same objects: every row kept
    assert again.tail1 is first.tail1 and not again.tail1.flags.writeable
    moved = table({"v0": one, "v2": dataclasses.replace(two, p95_ms=27.0)})
    assert moved.tail1[0] == first.tail1[0] and moved.tail1[2] != first.tail1[2]
    gone = table({"v2": two})  # v0 lost its samples: back to its base service time
    assert gone.tail1[0] == 10.0 and gone.rel_spread[0] == DEFAULT_REL_SPREAD
    assert memo.service is not None
    table({})  # no statistics at all (every intent deleted, or none sampled yet)
    assert memo.service is None  # the last columns, their specs and stats are not kept alive


def test_cached_columns_are_read_only():
    a = IntentSpec(id="a", name="a", workload_class="ONLINE", deadline_ms=10.0)
    table = build_table(PlanInput(intents=(a,), node=_node(4)), memo=TickMemo())
    with pytest.raises(ValueError):
        table.deadline[0] = 1.0


def test_capacity_derived_columns_follow_the_node():
    a = IntentSpec(id="a", name="a", workload_class="BATCH", min_units=3, max_units=9)
    memo = TickMemo()
    first = build_table(PlanInput(intents=(a,), node=_node(16)), memo=memo)
    kept = memo.base
    again = build_table(PlanInput(intents=(a,), node=_node(16)), memo=memo)
    assert memo.base is kept and again.cap is first.cap  # same specs, same capacity: kept
    small = build_table(PlanInput(intents=(a,), node=_node(2)), memo=memo)
    assert small.cap.tolist() == [2] and small.min_units.tolist() == [2]  # capped by the node
    assert memo.base is not kept
    with pytest.raises(ValueError):
        small.min_units[0] = 5


def test_foreign_previous_plan_builds_every_decision():
    """A previous plan not built by this policy instance (another policy, a restart) is read
    field by field (its units and dwell ticks), never taken from the memo's columns."""
    specs = (
        IntentSpec(id="a", name="a", workload_class="ONLINE", deadline_ms=25.0, min_units=2),
        IntentSpec(id="b", name="b", workload_class="BATCH", min_units=1, max_units=6),
    )
    kept, other = get_policy("parfusion"), get_policy("baseline")
    first = PlanInput(intents=specs, node=_node(8))
    kept.allocate(first)
    foreign = other.allocate(first)
    state = dataclasses.replace(first, previous=foreign.by_id(), tick=1)
    assert kept.allocate(state) == get_policy("parfusion").allocate(state)


def test_changed_rows_compares_floats_by_bits():
    new = {"x": np.array([0.0, -0.0, np.nan, 1.0]), "s": ["a", "b", "c", "d"]}
    old = {"x": np.array([0.0, 0.0, np.nan, 2.0]), "s": ["a", "b", "c", "d"]}
    assert changed_rows(4, new, old).tolist() == [False, True, False, True]
    assert changed_rows(4, {"s": ["a", "x", "c", "d"]}, old).tolist() == [False, True, False, False]
    assert changed_rows(4, {"x": [0.0] * 4}, old).all()  # list against array: all changed


@given(
    st.lists(st.sampled_from("abcdefgh"), unique=True, max_size=8),
    st.lists(st.sampled_from("abcdefghij"), unique=True, max_size=10),
)
def test_changed_from_matches_rows_by_id_whatever_came_and_went(old_ids, new_ids):
    """Appended ids (the submit path), dropped, moved or new ones: each new row is compared
    with the old row of its id, and a new id is changed."""
    value = {k: i for i, k in enumerate("abcdefghij")}
    old = {"v": np.array([value[k] for k in old_ids], dtype=np.int64), "s": list(old_ids)}
    new = {"v": np.array([value[k] for k in new_ids], dtype=np.int64), "s": list(new_ids)}
    new["v"][[i for i, k in enumerate(new_ids) if k in "ae"]] += 100  # a and e changed
    changed, _ = changed_from(len(new_ids), new, old, old_ids, new_ids)
    expected = [k not in old_ids or k in "ae" for k in new_ids]
    assert changed.tolist() == expected


def test_changed_from_on_appended_ids_keeps_the_old_rows():
    old = {"v": np.array([1, 2], dtype=np.int64), "s": ["x", "y"]}
    new = {"v": np.array([1, 2, 3], dtype=np.int64), "s": ["x", "y", "z"]}
    changed, src = changed_from(3, new, old, ["a", "b"], ["a", "b", "c"])
    assert changed.tolist() == [False, False, True] and src.tolist() == [0, 1, -1]


@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=8),
    st.integers(1, 4),
    st.data(),
)
def test_changed_from_on_appended_ids_compares_each_old_row_with_itself(values, extra, data):
    """The submit path (old rows in place, new ones after): the same answer as gathering the
    old rows by id, whichever old rows changed in an array or a list column."""
    k = len(values)
    old_ids = [f"i{j}" for j in range(k)]
    new_ids = old_ids + [f"n{j}" for j in range(extra)]
    touched = data.draw(st.sets(st.integers(0, k - 1)))
    listed = data.draw(st.sets(st.integers(0, k - 1)))
    old = {"v": np.array(values, dtype=np.float64), "s": [str(v) for v in values]}
    new_values = [v + 1 if j in touched else v for j, v in enumerate(values)] + [0] * extra
    new_texts = [f"{v}!" if j in listed else str(v) for j, v in enumerate(values)] + [""] * extra
    new = {"v": np.array(new_values, dtype=np.float64), "s": new_texts}
    changed, src = changed_from(k + extra, new, old, old_ids, new_ids)
    expected = [j in touched or j in listed for j in range(k)] + [True] * extra
    assert changed.tolist() == expected
    assert src.tolist() == list(range(k)) + [-1] * extra


def _three_specs() -> tuple[IntentSpec, ...]:
    """An ONLINE, a BATCH and a ROBOT intent, 2-5 units each."""
    return tuple(
        IntentSpec(id=f"i{k}", name=f"w{k}", workload_class=cls, deadline_ms=dl, min_units=2,
                   max_units=5, seq=k)
        for k, (cls, dl) in enumerate([("ONLINE", 40.0), ("BATCH", 0.0), ("ROBOT", 30.0)])
    )  # fmt: skip


_ADDED = IntentSpec(
    id="n", name="new", workload_class="ONLINE", deadline_ms=35.0, min_units=2, max_units=5, seq=9
)  # an intent submitted after the three


def _node(units: int) -> NodeState:
    return NodeState(name="n", cpu_units=units, cpu_ids=tuple(range(units)))


def test_previous_columns_come_from_the_memo_when_intents_were_appended():
    """Under a stream of submits every tick's rows are last tick's plus new ones: the previous
    plan's units and dwell ticks are last tick's columns with zeros appended, equal to reading
    them Decision by Decision; a previous plan from elsewhere is not taken from the memo."""
    specs, added = _three_specs(), _ADDED
    kept = get_policy("parfusion")
    r1 = kept.allocate(PlanInput(intents=specs, node=_node(64), tick=1))
    last = kept.memo.last
    assert last is not None
    prevs = [*r1.decisions, _NO_PREVIOUS]
    columns = last.tick_columns_of(prevs, _NO_PREVIOUS)
    assert columns is not None
    units, since, level_since, level, backoff, raised = columns
    assert units.tolist() == [d.units for d in r1.decisions] + [0]
    assert backoff.tolist() == [d.level_backoff for d in r1.decisions] + [0]
    assert raised.tolist() == [int(d.level_raised) for d in r1.decisions] + [0]
    assert since.tolist() == [d.since_tick for d in r1.decisions] + [0]
    assert level_since.tolist() == [d.level_since_tick for d in r1.decisions] + [0]
    assert level.tolist() == [LEVEL_INDEX[d.degradation] for d in r1.decisions] + [0]
    assert last.tick_columns_of(list(r1.decisions), _NO_PREVIOUS) is not None
    foreign = get_policy("parfusion").allocate(PlanInput(intents=specs, node=_node(64), tick=1))
    assert last.tick_columns_of([*foreign.decisions, _NO_PREVIOUS], _NO_PREVIOUS) is None
    assert last.tick_columns_of([*r1.decisions, r1.decisions[0]], _NO_PREVIOUS) is None
    assert last.tick_columns_of(list(r1.decisions[:2]), _NO_PREVIOUS) is None
    state = PlanInput(intents=(*specs, added), node=_node(64), previous=r1.by_id(), tick=2)
    assert kept.allocate(state) == get_policy("parfusion").allocate(state)
