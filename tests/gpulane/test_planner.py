"""The planner for every policy: GPU intent honoured, or every GPU setting left at defaults."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument
from services.gpulane.lanes import parse_lanes, resolve_lanes
from services.gpulane.nvml import Nvml, NvmlSnapshot
from services.gpulane.planner import lane_shares, place
from services.gpulane.priority import ASSUMED_RANGE, PriorityRange
from tests.gpulane.fake_nvml import h200_node
from tests.gpulane.plans import assignment, demo_plan

LANES = parse_lanes({"online": [0, 1], "batch": [2, 3, 4, 5], "robot": [6], "urgent": [7]})
RANGE = PriorityRange(0, -5, "queried: test")

# The policy names of the design; which ones keep GPU settings at their defaults.
DEFAULTS_POLICIES = {"no-gpuintent", "no-crosslayer", "baseline"}
ALL_POLICIES = [
    "parfusion", "baseline", "fifo", "static", "loadbalance-only", "no-crosslayer", "edf-only",
    "no-gpuintent", "no-predictor", "no-elastic", "no-degrade", "no-preemption",
]  # fmt: skip


def policy_names() -> list[str]:
    try:
        from services.allocator.policies.registry import list_policies
    except ImportError:
        return ALL_POLICIES
    return [p.name if hasattr(p, "name") else str(p) for p in list_policies()]


def _node(count: int = 8):
    snap = Nvml(h200_node(count)).snapshot()
    return resolve_lanes(LANES, snap), {d.index: d.name for d in snap.devices}


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy(policy: str) -> None:
    lanes, names = _node()
    enabled = policy not in DEFAULTS_POLICIES
    placements = {p.intent_id: p for p in place(demo_plan(policy, enabled), lanes, RANGE, names)}
    assert set(placements) == {"chat", "train", "arm", "estop"}
    assert placements["chat"].gpu_indexes == (0, 1)
    assert placements["train"].gpu_indexes == (2, 3, 4, 5)
    assert all(p.available for p in placements.values())
    if enabled:
        chat, train = placements["chat"], placements["train"]
        assert (chat.share_percent, chat.cuda_stream_priority, chat.concurrency) == (40.0, -5, 2)
        assert (train.share_percent, train.cuda_stream_priority) == (57.0, 0)
        assert placements["arm"].cuda_stream_priority == -2
        assert train.mig_profile == "4g.71gb" and chat.mig_profile == "3g.71gb"
        assert placements["estop"].mig_profile == "1g.18gb"
        assert lane_shares(tuple(placements.values()))["online"] == 40.0
    else:
        for p in placements.values():
            assert p.at_defaults
            assert (p.share_percent, p.cuda_stream_priority, p.concurrency, p.mig_profile) == (
                100.0,
                0,
                0,
                "",
            )
            assert "defaults" in p.reason
        assert lane_shares(tuple(placements.values())) == {}


def test_absent_gpus_are_unavailable_not_invented() -> None:
    lanes, names = _node(2)
    placements = {p.intent_id: p for p in place(demo_plan(), lanes, RANGE, names)}
    assert placements["chat"].available and placements["chat"].gpu_indexes == (0, 1)
    for intent in ("train", "arm", "estop"):
        p = placements[intent]
        assert not p.available and p.gpu_indexes == ()
        assert "not present" in p.reason
    assert placements["train"].reference_indexes == (2, 3, 4, 5)


def test_no_nvml_nothing_available() -> None:
    lanes = resolve_lanes(LANES, NvmlSnapshot(False, "NVML unavailable: no driver"))
    placements = place(demo_plan(), lanes, ASSUMED_RANGE, {})
    assert all(not p.available and p.gpu_indexes == () for p in placements)
    assert all("no driver" in p.reason for p in placements)


def test_unknown_lane_requested_gpu_outside_lane_and_zero_share() -> None:
    lanes, names = _node()
    plan = demo_plan()
    del plan.assignments[:]
    plan.assignments.extend(
        [
            assignment("a", "video", 10.0),
            assignment("b", "online", 10.0, gpus=(5,)),
            assignment("c", "online", 0.0),
            assignment("d", "", 30.0),
            assignment("e", "batch", 20.0, gpus=(3,)),
        ]
    )
    got = {p.intent_id: p for p in place(plan, lanes, RANGE, names)}
    assert not got["a"].available and "not configured" in got["a"].reason
    assert not got["b"].available and "not in lane online" in got["b"].reason
    assert not got["c"].available and got["c"].share_percent == 0
    assert got["d"].lane == "online" and got["d"].available  # empty lane = first available
    assert got["e"].gpu_indexes == (3,)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"share_percent": float("nan")}, "share_percent"),
        ({"share_percent": -1.0}, "share_percent"),
        ({"stream_priority": 3}, "stream_priority"),
        ({"intent_id": ""}, "intent_id"),
    ],
)
def test_bad_plans_are_rejected_whole(change: dict, field: str) -> None:
    lanes, names = _node()
    plan = demo_plan()
    for key, value in change.items():
        setattr(plan.assignments[1], key, value)
    with pytest.raises(InvalidArgument, match=rf"plan.assignments\[1\].{field}"):
        place(plan, lanes, RANGE, names)


def test_duplicate_intent_rejected() -> None:
    lanes, names = _node()
    plan = demo_plan()
    plan.assignments.append(plan.assignments[0])
    with pytest.raises(InvalidArgument, match="appears twice"):
        place(plan, lanes, RANGE, names)


def test_share_above_one_gpu_is_capped_per_gpu() -> None:
    lanes, names = _node()
    plan = demo_plan()
    plan.assignments[1].share_percent = 180.0
    train = {p.intent_id: p for p in place(plan, lanes, RANGE, names)}["train"]
    assert train.share_percent == 100.0 and train.mig_profile == ""
    assert "capped at 100% per GPU" in train.reason
