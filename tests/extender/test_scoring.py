"""Node decisions come from the allocator's placement core, plus the lane/share predicates."""

from __future__ import annotations

from dataclasses import replace

import msgspec

from services.allocator import placement
from services.allocator.model import DmugConfig, IntentSpec
from services.extender import samples
from services.extender.nodeview import ClusterView
from services.extender.protocol import NodeHead
from services.extender.scoring import FAILED, OK, UNRESOLVABLE, ScoringConfig, decide

CONFIG = ScoringConfig()
ONLINE = IntentSpec(
    id="det", name="det", workload_class="ONLINE", deadline_ms=40, min_units=2, max_units=8,
    parallel_fraction=0.9, base_service_ms=60, arrival_rate_per_s=20, gpu_lane="online", gpu_share=0.5,
)  # fmt: skip


def _view(*nodes: dict) -> ClusterView:
    view = ClusterView()
    view.learn([msgspec.convert(n, NodeHead) for n in nodes])
    return view


def test_scores_equal_the_single_node_placement_core() -> None:
    view = _view(*samples.sample_node_objects())
    resident = replace(ONLINE, id="other", gpu_share=0.25)
    view.place("gpu-node-a", resident)
    names = ["gpu-node-a", "gpu-node-b"]
    decisions = decide(ONLINE, view.lookup(names), CONFIG)
    for name, d in zip(names, decisions, strict=True):
        rec = view.get(name)
        assert rec is not None
        expected = placement.score_placement(ONLINE, rec.state, rec.residents, {}, DmugConfig())
        assert (d.outcome == OK) == expected.fits
        assert d.score == expected.score and d.slack_ms == expected.slack_ms
    assert all(1 <= d.score <= 10 for d in decisions)


def test_lane_and_share_predicates() -> None:
    view = _view(samples.node_object("small", 16, {"online": 1}), samples.node_object("cpu", 16))
    d_small, d_cpu = decide(ONLINE, view.lookup(["small", "cpu"]), CONFIG)
    assert d_small.outcome == OK and d_small.lane == "online"
    assert d_cpu.outcome == UNRESOLVABLE and "lane online" in d_cpu.reason
    view.place("small", replace(ONLINE, id="a", gpu_share=0.75))
    [d] = decide(ONLINE, view.lookup(["small"]), CONFIG)
    assert d.outcome == FAILED and "25 share units free" in d.reason
    any_lane = replace(ONLINE, gpu_lane="", gpu_share=0.25)
    [d] = decide(any_lane, view.lookup(["small"]), CONFIG)
    assert d.outcome == OK and d.lane == "online"


def test_deadline_out_of_reach_is_unresolvable_and_short_capacity_fails() -> None:
    view = _view(samples.node_object("edge", 8, {"online": 1}))
    impossible = replace(ONLINE, deadline_ms=1.0, degradation=("NORMAL",))
    [d] = decide(impossible, view.lookup(["edge"]), CONFIG)
    assert d.outcome == UNRESOLVABLE and "unreachable" in d.reason
    batch = IntentSpec(
        id="b", name="b", workload_class="BATCH", min_units=6, max_units=6, work_units=100
    )
    view.place("edge", replace(batch, id="hog"))
    [d] = decide(batch, view.lookup(["edge"]), CONFIG)
    assert d.outcome == FAILED and "insufficient units" in d.reason


def test_unknown_nodes_fail_with_a_reason() -> None:
    [d] = decide(ONLINE, [None], CONFIG)
    assert d.outcome == FAILED and "node view" in d.reason
