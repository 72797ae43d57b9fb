"""Placement scoring for the extender: fits and reasons, the 0..10 range, batch form = single form."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.core.model import Disturbance, IntentSpec, LaneCapacity, NodeState, ServiceStats
from services.core.placement import (
    NodeView,
    score_nodes,
    score_nodes_arrays,
    score_placement,
    view_of,
)

WEB = IntentSpec(id="web", name="web", workload_class="ONLINE", priority=800, deadline_ms=40,
                 max_units=8, base_service_ms=100, degradation=("NORMAL", "FP16", "INT8"),
                 gpu_lane="infer", gpu_share=0.5)  # fmt: skip
TRAIN = IntentSpec(id="train", name="train", workload_class="BATCH", min_units=2, max_units=6)


INFER = (LaneCapacity("infer", (0,)),)


def node(units=8, lanes=INFER, **kw) -> NodeState:
    return NodeState(name="n1", cpu_units=units, lanes=lanes, **kw)


def test_fits_with_the_fewest_units_that_meet_the_deadline():
    s = score_placement(WEB, node())
    assert s.fits and s.units == 3 and s.slack_ms > 0 and 1 <= s.score <= 10
    assert s.reason.startswith("fits: 3 units meet 40 ms")


def test_reasons_when_it_does_not_fit():
    s = score_placement(WEB, node(lanes=(LaneCapacity("infer", ()),)))
    assert not s.fits and s.score == 0 and "GPU lane infer unavailable" in s.reason
    full = [IntentSpec(id="b", name="b", workload_class="BATCH", min_units=8)]
    s = score_placement(WEB, node(), full)
    assert not s.fits and s.reason.startswith("insufficient units: needs 1, 0 free")
    some = [IntentSpec(id="b", name="b", workload_class="BATCH", min_units=6)]
    s = score_placement(WEB, node(), some)
    assert not s.fits and "3 needed for 40 ms, 2 free" in s.reason
    tight = IntentSpec(
        id="t", name="t", workload_class="ONLINE", deadline_ms=5, base_service_ms=100
    )
    s = score_placement(tight, node())
    assert not s.fits and "unreachable at max units even degraded" in s.reason


def test_degraded_fit_and_pressure_lower_the_score():
    deg = IntentSpec(id="d", name="d", workload_class="ONLINE", deadline_ms=30, max_units=4,
                     base_service_ms=100, degradation=("NORMAL", "FP16"))  # fmt: skip
    s = score_placement(deg, node())
    assert s.fits and "at FP16" in s.reason
    calm = score_placement(TRAIN, node(16))
    busy = score_placement(TRAIN, node(16, contention=0.9), [TRAIN.__class__(
        id="x", name="x", workload_class="BATCH", min_units=8)])  # fmt: skip
    assert calm.score >= busy.score
    hot = score_placement(WEB, node(8, disturbance=Disturbance(cpu=0.9, network=0.9)))
    assert hot.slack_ms < score_placement(WEB, node(8)).slack_ms


def test_stats_change_the_prediction():
    slow = {"web": ServiceStats(mean_ms=150, p95_ms=180, p99_ms=200, count=100)}
    assert score_placement(WEB, node(), stats=slow).units > score_placement(WEB, node()).units


views_strategy = st.lists(
    st.builds(
        NodeView,
        name=st.sampled_from(["a", "b", "c"]),
        free_units=st.integers(0, 16),
        total_units=st.integers(16, 32),
        lanes_available=st.sampled_from([frozenset(), frozenset({"infer"}), frozenset({"x"})]),
        contention=st.floats(0.0, 1.0),
        disturbance=st.builds(Disturbance, st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)),
    ),
    min_size=1,
    max_size=12,
)
intent_strategy = st.builds(
    IntentSpec,
    id=st.just("p"),
    name=st.just("p"),
    workload_class=st.sampled_from(["ONLINE", "BATCH", "ROBOT", "URGENT"]),
    priority=st.integers(0, 1000),
    deadline_ms=st.floats(1.0, 300.0),
    min_units=st.integers(1, 4),
    max_units=st.integers(0, 12),
    parallel_fraction=st.floats(0.0, 1.0),
    base_service_ms=st.floats(1.0, 200.0),
    gpu_lane=st.sampled_from(["", "infer"]),
    gpu_share=st.sampled_from([0.0, 0.5]),
    degradation=st.sampled_from([("NORMAL",), ("NORMAL", "FP16", "INT8")]),
)


@settings(max_examples=60, deadline=None)
@given(intent_strategy, views_strategy)
def test_batch_form_equals_single_form_and_scores_in_range(intent, views):
    batch = score_nodes(intent, views)
    for view, s in zip(views, batch, strict=True):
        one = score_nodes(intent, [view])[0]
        assert one == s
        assert 0 <= s.score <= 10 and s.fits == (s.score > 0)
        assert 0.0 <= s.deadline_risk <= 1.0 and np.isfinite(s.nmu)
        assert s.reason
        if not view.lanes_available and (intent.gpu_lane or intent.gpu_share > 0):
            assert not s.fits and "GPU lane" in s.reason


def test_score_placement_equals_score_nodes_on_its_view():
    n = node(12, cpu_ids=tuple(range(12)))
    resident = [TRAIN, IntentSpec(id="r", name="r", workload_class="ROBOT", deadline_ms=50,
                                  base_service_ms=100, max_units=4)]  # fmt: skip
    view = view_of(n, resident)
    assert view.free_units < 12
    assert score_placement(WEB, n, resident) == score_nodes(WEB, [view])[0]


def test_many_nodes_at_once():
    views = [NodeView(f"n{i}", i % 17, 16, frozenset({"infer"}) if i % 3 else frozenset(),
                      contention=(i % 10) / 10) for i in range(5000)]  # fmt: skip
    cols = score_nodes_arrays(WEB, views)
    assert cols.score.shape == (5000,) and cols.fits.any() and not cols.fits.all()
    assert set(np.unique(cols.score)) <= set(range(11))
    assert score_nodes(WEB, views[:50]) == [score_nodes(WEB, [v])[0] for v in views[:50]]


def test_empty_views():
    assert score_nodes(WEB, []) == []
    with pytest.raises(TypeError):
        score_nodes(WEB)  # type: ignore[call-arg]
