"""Node decisions come from the allocator's placement core, plus the lane/share predicates."""

from __future__ import annotations

from dataclasses import replace

import msgspec
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from services.core import placement
from services.core.model import DmugConfig, IntentSpec
from services.extender import samples
from services.extender.nodeview import ClusterView
from services.extender.protocol import NodeHead
from services.extender.scoring import FAILED, OK, UNRESOLVABLE, ScoringConfig, Verdicts, decide
from services.extender.verbs import shortlist

CONFIG = ScoringConfig()
ONLINE = IntentSpec(
    id="det", name="det", workload_class="ONLINE", deadline_ms=40, min_units=2, max_units=8,
    parallel_fraction=0.9, base_service_ms=60, arrival_rate_per_s=20, gpu_lane="online", gpu_share=0.5,
)  # fmt: skip


def _view(*nodes: dict) -> ClusterView:
    view = ClusterView()
    view.learn([msgspec.convert(n, NodeHead) for n in nodes])
    return view


def _decide(intent: IntentSpec, view: ClusterView, names: list[str]) -> list:
    verdicts = decide(intent, view.rows_of(names), view.columns, CONFIG)
    return [verdicts.at(i, name) for i, name in enumerate(names)]


def test_scores_equal_the_single_node_placement_core() -> None:
    view = _view(*samples.sample_node_objects())
    resident = replace(ONLINE, id="other", gpu_share=0.25)
    view.place("gpu-node-a", resident)
    names = ["gpu-node-a", "gpu-node-b"]
    decisions = _decide(ONLINE, view, names)
    for name, d in zip(names, decisions, strict=True):
        rec = view.get(name)
        assert rec is not None
        expected = placement.score_placement(ONLINE, rec.state, rec.residents, {}, DmugConfig())
        assert (d.outcome == OK) == expected.fits
        assert d.score == expected.score and d.slack_ms == expected.slack_ms
    assert all(1 <= d.score <= 10 for d in decisions)


def test_lane_and_share_predicates() -> None:
    view = _view(samples.node_object("small", 16, {"online": 1}), samples.node_object("cpu", 16))
    d_small, d_cpu = _decide(ONLINE, view, ["small", "cpu"])
    assert d_small.outcome == OK and d_small.lane == "online"
    assert d_cpu.outcome == UNRESOLVABLE and "lane online not present" in d_cpu.reason
    view.place("small", replace(ONLINE, id="a", gpu_share=0.75))
    [d] = _decide(ONLINE, view, ["small"])
    assert d.outcome == FAILED and "fewer than the 50 share units" in d.reason
    any_lane = replace(ONLINE, gpu_lane="", gpu_share=0.25)
    [d] = _decide(any_lane, view, ["small"])
    assert d.outcome == OK and d.lane == "online"


def test_deadline_out_of_reach_is_unresolvable_and_short_capacity_fails() -> None:
    view = _view(samples.node_object("edge", 8, {"online": 1}))
    impossible = replace(ONLINE, deadline_ms=1.0, degradation=("NORMAL",))
    [d] = _decide(impossible, view, ["edge"])
    assert d.outcome == UNRESOLVABLE and "unreachable" in d.reason
    batch = IntentSpec(
        id="b", name="b", workload_class="BATCH", min_units=6, max_units=6, work_units=100
    )
    view.place("edge", replace(batch, id="hog"))
    [d] = _decide(batch, view, ["edge"])
    assert d.outcome == FAILED and "insufficient units" in d.reason


def test_unknown_nodes_fail_with_a_reason() -> None:
    [d] = _decide(ONLINE, ClusterView(), ["nowhere"])
    assert d.outcome == FAILED and "node view" in d.reason


def test_nodes_of_one_class_are_scored_once_and_agree() -> None:
    view = _view(*samples.cluster_node_objects(40))
    view.place("node-00000", replace(ONLINE, id="r1"))
    names = [f"node-{i:05d}" for i in range(40)]
    verdicts = decide(ONLINE, view.rows_of(names), view.columns, CONFIG)
    assert len(view.columns.class_views) < 10  # 4 shapes + the node with a resident
    for i, name in enumerate(names):
        rec = view.get(name)
        assert rec is not None
        single = _decide(ONLINE, view, [name])[0]
        assert verdicts.at(i, name) == single


def test_a_forgotten_placement_leaves_every_node_it_was_on() -> None:
    view = _view(
        samples.node_object("a", 16, {"online": 1}), samples.node_object("b", 16, {"online": 1})
    )
    moved = replace(ONLINE, id="moved", gpu_share=0.75)
    kept = replace(ONLINE, id="kept", gpu_share=0.25)
    view.place("a", moved)
    view.place("b", moved)  # a pod re-bound elsewhere before the first was forgotten
    view.place("b", kept)
    view.place("b", kept)  # the same placement twice changes nothing
    view.forget_placement("moved")
    assert [i.id for i in view.get("a").residents] == []
    assert [i.id for i in view.get("b").residents] == ["kept"]
    [d] = _decide(ONLINE, view, ["a"])
    assert d.outcome == OK  # the lane's share came back
    view.forget_placement("moved")  # forgetting twice is harmless
    assert [i.id for i in view.get("b").residents] == ["kept"]


def test_the_watch_reporting_a_reserved_pod_keeps_the_lane_the_bind_chose() -> None:
    view = _view(samples.node_object("a", 16, {"online": 1}))
    from_annotation = replace(ONLINE, id="web", gpu_lane="", gpu_share=0.75)
    view.place("a", replace(from_annotation, node="a", gpu_lane="online"))  # bind's reservation
    view.place("a", from_annotation)  # the bound-pod watch
    [resident] = view.get("a").residents
    assert resident.gpu_lane == "online" and resident.node == "a"
    [d] = _decide(ONLINE, view, ["a"])
    assert d.outcome == FAILED  # the lane's share stays taken


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([OK, FAILED, UNRESOLVABLE]),
            st.integers(0, 10),
            st.sampled_from([-5.0, 0.0, 3.5, 20.0, 80.0]),
        ),
        min_size=1,
        max_size=60,
    ),
    st.integers(0, 40),
    st.text(max_size=8),
)
def test_shortlist_keeps_the_best_feasible_nodes(
    rows: list[tuple[int, int, float]], limit: int, intent_id: str
) -> None:
    n = len(rows)
    verdicts = Verdicts(
        outcome=np.array([r[0] for r in rows]),
        score=np.array([r[1] if r[0] == OK else 0 for r in rows]),
        reason=np.full(n, -1),
        reasons=[],
        lane=np.full(n, -1),
        lanes=[],
        slack_ms=np.array([r[2] for r in rows]),
        deadline_risk=np.zeros(n),
        units=np.zeros(n, dtype=np.int64),
    )
    feasible = np.flatnonzero(verdicts.outcome == OK)
    kept = shortlist(feasible, verdicts, limit, intent_id)
    assert kept.tolist() == sorted(kept.tolist())  # candidate order
    assert set(kept.tolist()) <= set(feasible.tolist())
    assert kept.size == (feasible.size if limit == 0 else min(limit, feasible.size))
    key = {int(i): (int(verdicts.score[i]), float(verdicts.slack_ms[i])) for i in feasible}
    left_out = set(feasible.tolist()) - set(kept.tolist())
    for i in kept.tolist():  # nothing left out is better than anything kept
        assert all(key[i] >= key[j] for j in left_out)
    assert shortlist(feasible, verdicts, limit, intent_id).tolist() == kept.tolist()
