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

DEFAULTS_POLICIES = {"no-gpuintent", "no-crosslayer", "baseline"}
ALL_POLICIES = [
    "parfusion", "baseline", "fifo", "static", "loadbalance-only", "no-crosslayer", "edf-only",
    "no-gpuintent", "no-predictor", "no-elastic", "no-degrade", "no-preemption",
]  # fmt: skip


def _node(count: int = 8):
    snap = Nvml(h200_node(count)).snapshot()
    return resolve_lanes(LANES, snap), {d.index: d.name for d in snap.devices}


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_plan_flag_for_every_policy_name(policy: str) -> None:
    lanes, names = _node()
    enabled = policy not in DEFAULTS_POLICIES
    placements = {p.intent_id: p for p in place(demo_plan(policy, enabled), lanes, RANGE, names)}
    assert set(placements) == {"chat", "train", "arm", "estop"}
    assert all(p.available for p in placements.values())
    if enabled:
        chat, train = placements["chat"], placements["train"]
        # 40 lane units fit one GPU of the online lane; 57 one GPU of the batch lane
        assert chat.gpu_indexes == (0,) and train.gpu_indexes == (2,)
        assert (chat.share_percent, chat.cuda_stream_priority, chat.concurrency) == (40.0, -5, 2)
        assert (train.share_percent, train.cuda_stream_priority) == (57.0, 0)
        assert placements["arm"].cuda_stream_priority == -2
        assert train.mig_profile == "4g.71gb" and chat.mig_profile == "3g.71gb"
        assert placements["estop"].mig_profile == "1g.18gb"
        assert lane_shares(tuple(placements.values()))["online"] == 40.0
    else:
        assert placements["chat"].gpu_indexes == (0, 1)
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


def test_share_units_pack_onto_the_fewest_emptiest_gpus() -> None:
    lanes, names = _node()
    plan = demo_plan()
    del plan.assignments[:]
    plan.assignments.extend(
        [
            assignment("a", "online", 60.0),
            assignment("b", "online", 60.0),
            assignment("c", "batch", 250.0),
            assignment("d", "batch", 120.0),
        ]
    )
    got = {p.intent_id: p for p in place(plan, lanes, RANGE, names)}
    assert got["a"].gpu_indexes == (0,) and got["b"].gpu_indexes == (1,)
    assert got["c"].gpu_indexes == (2, 3, 4) and got["c"].share_percent == pytest.approx(250 / 3)
    assert got["d"].gpu_indexes == (2, 5)  # the two with the most share left
    assert got["d"].share_percent == 60.0 and got["d"].total_share_percent == 120.0
    assert lane_shares(tuple(got.values())) == {"online": 120.0, "batch": 370.0}


def test_real_policies_end_to_end() -> None:
    """Every registered policy's own decisions, converted by the allocator, placed here."""
    registry = pytest.importorskip("services.core.policies.registry")
    from google.protobuf.timestamp_pb2 import Timestamp

    from services.allocator.plans import gpu_plan
    from services.core import model

    lanes, names = _node(4)  # GPUs 0-3: online whole, batch half, robot/urgent absent
    capacity = tuple(
        model.LaneCapacity(v.name, v.present, 100 * len(v.present) if v.available else 0)
        for v in lanes
    )
    node = model.NodeState(name="node-0", cpu_units=8, cpu_ids=tuple(range(8)), lanes=capacity)
    intents = [
        model.IntentSpec("chat", "chat", "ONLINE", 800, deadline_ms=50, arrival_rate_per_s=50,
                         base_service_ms=5, gpu_lane="online", gpu_share=0.4, gpu_stream_priority_hint=1),
        model.IntentSpec("train", "train", "BATCH", 200, work_units=1000, gpu_lane="batch",
                         gpu_share=1.5, gpu_stream_priority_hint=-1, preemptible=True),
        model.IntentSpec("arm", "arm", "ROBOT", 900, deadline_ms=40, arrival_rate_per_s=20,
                         base_service_ms=4, gpu_lane="robot", gpu_share=0.2),
    ]  # fmt: skip
    names_seen = []
    for policy in registry.list_policies():
        names_seen.append(policy.name)
        result = policy.allocate(model.PlanInput(intents=intents, node=node))
        plan = gpu_plan(result, {}, node, generation=1, created_at=Timestamp())
        placements = place(plan, lanes, RANGE, names)
        assert {p.intent_id for p in placements} == {a.intent_id for a in plan.assignments}
        by_id = {d.intent_id: d for d in result.decisions}
        for p in placements:
            assert set(p.gpu_indexes) <= {0, 1, 2, 3}  # never a GPU NVML does not report
            assert 0 <= p.share_percent <= 100.0
            if not plan.gpu_intent_enabled:
                assert (
                    p.at_defaults and p.cuda_stream_priority == RANGE.least and p.mig_profile == ""
                )
            elif p.available:
                d = by_id[p.intent_id]
                assert p.total_share_percent == pytest.approx(
                    min(d.gpu_share_percent, 100.0 * len(p.gpu_indexes) or 1e9)
                )
                assert p.cuda_stream_priority == {1: -5, 0: -2, -1: 0}[d.stream_priority]
        for lane, share in lane_shares(placements).items():
            assert share <= next(c.share_units for c in capacity if c.name == lane) + 1e-6
        assert not any(p.available for p in placements if p.lane == "robot"), policy.name
        if policy.name == "parfusion":
            train = next(p for p in placements if p.intent_id == "train")
            assert (train.gpu_indexes, train.share_percent) == ((2, 3), 75.0)  # 150 units
    assert set(names_seen) == set(ALL_POLICIES)


def test_absent_gpus_are_unavailable_not_invented() -> None:
    lanes, names = _node(2)
    placements = {p.intent_id: p for p in place(demo_plan(), lanes, RANGE, names)}
    assert placements["chat"].available and placements["chat"].gpu_indexes == (0,)
    for intent in ("train", "arm", "estop"):
        p = placements[intent]
        assert not p.available and p.gpu_indexes == ()
        assert "not present" in p.reason
    assert placements["train"].reference_indexes == (2,)  # packed, for the labelled preview


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


def test_share_above_the_lane_is_capped_per_gpu() -> None:
    lanes, names = _node()
    plan = demo_plan()
    plan.assignments[1].share_percent = 500.0
    train = {p.intent_id: p for p in place(plan, lanes, RANGE, names)}["train"]
    assert train.gpu_indexes == (2, 3, 4, 5)
    assert train.share_percent == 100.0 and train.mig_profile == "7g.141gb"
    assert "capped at 100% per GPU" in train.reason
