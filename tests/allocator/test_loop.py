"""The control loop: ticks, telemetry pull/push, staleness and recovery, predictor feed, pushes.

The node agent and gpulane are in-test servicers of their protos (see conftest.py): the
allocator's boundary, not the real services.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from prometheus_client import REGISTRY

from parfusion.v1 import nodeagent_pb2_grpc, telemetry_pb2
from services.allocator.loop import ControlLoop, LoopConfig
from services.allocator.metrics import PER_INTENT
from services.allocator.store import IntentStore
from services.allocator.watch import END
from services.common.errors import InvalidArgument
from services.common.grpc_server import start_grpc_server
from services.core import model
from services.core.validation import normalize_intent
from tests.allocator.conftest import NODEAGENT, PeerAgent, Peers, batch_intent, online_intent


@pytest.fixture
def store(tmp_path: Path) -> Iterator[IntentStore]:
    s = IntentStore(tmp_path / "allocator.db")
    yield s
    s.close()


def make_loop(store: IntentStore, peers: Peers | None = None, **config: object) -> ControlLoop:
    fields: dict[str, object] = {
        "tick_s": 0.1,
        "stale_after_s": 0.3,
        "configured_lanes": {"online": [0, 1], "batch": [2]},
    }
    if peers is not None:
        fields["nodeagent_address"] = f"127.0.0.1:{peers.agent_port}"
        fields["gpulane_address"] = f"127.0.0.1:{peers.gpulane_port}"
    fields.update(config)
    return ControlLoop(store, LoopConfig(**fields))  # type: ignore[arg-type]


def submit(store: IntentStore, *intents: object) -> list[str]:
    return [store.submit(normalize_intent(i)).intent.id for i in intents]  # type: ignore[arg-type]


def test_tick_plans_every_intent_and_pushes_both_plans(store: IntentStore, peers: Peers) -> None:
    ids = submit(store, online_intent(), batch_intent())
    loop = make_loop(store, peers)
    try:
        first = loop.tick()
        second = loop.tick()
    finally:
        loop.stop()
    assert first is not None and second is not None
    assert (first.generation, second.generation) == (1, 2)
    plan = second.node_plan
    assert {a.intent_id for a in plan.allocations} == set(ids)
    assert plan.cpu_units == 4  # the agent's arena
    assert sum(a.workers for a in plan.allocations) <= 4
    assert not plan.node_stale
    assert [p.generation for p in peers.agent.plans] == [1, 2]
    assert [p.generation for p in peers.gpulane.plans] == [1, 2]
    assert second.gpu_plan.generation == 2 and second.gpu_plan.policy == plan.policy


def test_capacity_config_then_arena_then_cpu_count(store: IntentStore, peers: Peers) -> None:
    loop = make_loop(store)
    assert loop.node_state().cpu_units == (os.cpu_count() or 1)
    assert loop.node_state().stale  # never heard from the node
    loop.report(telemetry_pb2.NodeTelemetry(arena_cpus=[2, 3, 5]), None)
    state = loop.node_state()
    assert (state.cpu_units, state.cpu_ids, state.stale) == (3, (2, 3, 5), False)
    fixed = make_loop(store, cpu_units=2)
    fixed.report(telemetry_pb2.NodeTelemetry(arena_cpus=[2, 3, 5]), None)
    assert (fixed.node_state().cpu_units, fixed.node_state().cpu_ids) == (2, (2, 3))
    over = make_loop(store, cpu_units=6)  # more units than cores: oversubscribe, never invent CPUs
    over.report(telemetry_pb2.NodeTelemetry(arena_cpus=[2, 3, 5]), None)
    assert (over.node_state().cpu_units, over.node_state().cpu_ids) == (6, (2, 3, 5))
    plan = over.tick().node_plan  # type: ignore[union-attr]
    assert {c for a in plan.allocations for c in a.cpu_set} <= {2, 3, 5}


def test_node_status_says_what_node_state_says_without_the_lock(store: IntentStore) -> None:
    """GetPlan reads staleness from the server's event loop: node_status must agree with
    node_state before any telemetry, after some, and once it is older than stale_after_s,
    and answer while a tick holds the loop's lock."""
    now = [100.0]
    loop = ControlLoop(store, LoopConfig(stale_after_s=0.3), clock=lambda: now[0])
    assert loop.node_status() == (True, None) and loop.node_state().stale
    loop.report(telemetry_pb2.NodeTelemetry(arena_cpus=[0, 1]), None)
    stale, wall = loop.node_status()
    assert (stale, loop.node_state().stale) == (False, False) and wall is not None
    assert wall.seconds > 0
    now[0] += 0.31
    assert loop.node_status() == (True, wall) and loop.node_state().stale
    answered: list[tuple[bool, object]] = []
    with loop._lock:  # a tick holding the lock, as a whole store read does
        reader = threading.Thread(target=lambda: answered.append(loop.node_status()))
        reader.start()
        reader.join(5)
    assert answered == [(True, wall)]
    assert loop.policy_name == "parfusion"


def test_agent_down_marks_stale_keeps_planning_then_recovers(
    store: IntentStore, peers: Peers, caplog: pytest.LogCaptureFixture
) -> None:
    submit(store, online_intent())
    peers.agent.telemetry.arena_cpus[:] = [0, 1, 2]
    loop = make_loop(store, peers)
    try:
        assert loop.tick().node_plan.cpu_units == 3  # type: ignore[union-attr]
        peers.stop_agent()
        caplog.set_level(logging.WARNING, logger="services.allocator.peers")
        time.sleep(0.35)
        stale = [loop.tick() for _ in range(3)]
        assert all(s is not None and s.node_plan.node_stale for s in stale)
        assert all(s.node_plan.cpu_units == 3 for s in stale if s)  # last known capacity
        assert REGISTRY.get_sample_value("parfusion_allocator_node_stale") == 1
        warnings = [
            r
            for r in caplog.records
            if r.getMessage().startswith("peer call failing")
            and getattr(r, "peer", "") == "nodeagent"
        ]
        assert len(warnings) == 2  # once for the pull, once for the push: not once per tick
        peers.start_agent()  # same port: the loop's channel reconnects by itself
        deadline = time.monotonic() + 5
        snap = loop.tick()
        while snap is not None and snap.node_plan.node_stale and time.monotonic() < deadline:
            time.sleep(0.05)
            snap = loop.tick()
        assert snap is not None and not snap.node_plan.node_stale
        assert peers.agent.plans[-1].generation == snap.generation
        assert REGISTRY.get_sample_value("parfusion_allocator_node_stale") == 0
    finally:
        loop.stop()


def test_predictor_fed_at_the_pools_units(store: IntentStore, peers: Peers) -> None:
    (web,) = submit(store, online_intent())
    peers.agent.telemetry.latencies.add(intent_id=web, recent_service_ms=[10.0, 12.0, 11.0])
    peers.agent.telemetry.latencies.add(intent_id="unknown", recent_service_ms=[99.0])
    peers.agent.telemetry.pools.add(intent_id=web, workers=2)
    loop = make_loop(store, peers)
    try:
        loop.tick()
    finally:
        loop.stop()
    stats = loop.service_stats()
    assert set(stats) == {web}
    assert stats[web].count == 3
    assert stats[web].observed_units == 2
    assert 10.0 <= stats[web].mean_ms <= 12.0


def test_submit_and_delete_invalidate_the_cache_and_metric_series(store: IntentStore) -> None:
    loop = make_loop(store)
    assert loop.tick().node_plan.allocations == []  # type: ignore[union-attr]
    (web,) = submit(store, online_intent("web-m"))
    plan = loop.tick().node_plan  # type: ignore[union-attr]
    assert [a.intent_id for a in plan.allocations] == [web]
    labels = {"intent": "web-m", "intent_id": web}
    assert (
        PER_INTENT.get_sample_value("parfusion_dmug_units", labels) == plan.allocations[0].workers
    )
    assert (
        REGISTRY.get_sample_value("parfusion_allocator_intents", {"workload_class": "ONLINE"}) == 1
    )
    store.delete(web)
    assert loop.tick().node_plan.allocations == []  # type: ignore[union-attr]
    assert PER_INTENT.get_sample_value("parfusion_dmug_units", labels) is None
    assert PER_INTENT.get_sample_value("parfusion_dmug_slack_seconds", labels) is None
    assert loop.allocation(web) is None


def test_lanes_contention_and_disturbance_from_telemetry(store: IntentStore) -> None:
    loop = make_loop(store)
    assert [(lane.name, lane.available) for lane in loop.node_state().lanes] == [
        ("online", False),
        ("batch", False),
    ]
    gpu = telemetry_pb2.GpuTelemetry(gpu_pressure=0.1)
    gpu.lanes.add(name="online", present_indexes=[0, 1], available=True)
    gpu.lanes.add(name="batch", present_indexes=[], available=False)
    node = telemetry_pb2.NodeTelemetry(arena_cpus=[0, 1], disturbance_remaining_s=5)
    node.cpu_pressure.CopyFrom(telemetry_pb2.Pressure(some_avg10=30.0, available=True))
    node.active_disturbance.CopyFrom(telemetry_pb2.Disturbance(cpu_pressure=0.5, duration_s=5))
    loop.report(node, gpu)
    state = loop.node_state()
    assert state.lanes == (
        model.LaneCapacity("online", (0, 1), 200),
        model.LaneCapacity("batch", (), 0),
    )
    assert state.contention == pytest.approx(0.3)
    assert state.disturbance == model.Disturbance(cpu=0.5, gpu=0.1)


def test_a_failing_policy_keeps_the_last_plan_and_the_loop(store: IntentStore) -> None:
    submit(store, online_intent())
    loop = make_loop(store)
    good = loop.tick()

    class Broken:
        name, kind, description = "broken", "ablation", "raises"

        def allocate(self, state: model.PlanInput) -> model.PlanResult:
            raise RuntimeError("bad input")

    loop._policy = Broken()  # type: ignore[assignment]
    assert loop.tick() is None
    assert loop.current() is good


def test_thread_ticks_and_slow_subscriber_never_blocks(store: IntentStore) -> None:
    submit(store, online_intent())
    loop = make_loop(store, tick_s=0.02)
    slow = loop.feed.subscribe(maxsize=2)  # never read while the loop runs
    loop.start()
    try:
        deadline = time.monotonic() + 5
        while (
            loop.current() is None or loop.current().generation < 10
        ) and time.monotonic() < deadline:  # type: ignore[union-attr]
            time.sleep(0.02)
        assert loop.current() is not None and loop.current().generation >= 10  # type: ignore[union-attr]
        assert slow.dropped >= 5
    finally:
        loop.stop()

    async def drain() -> list[object]:
        return [await slow.next() for _ in range(2)]

    assert asyncio.run(drain())[-1] is END  # shutdown ends the subscription, after the queued plan


def test_preview_changes_nothing(store: IntentStore) -> None:
    submit(store, online_intent(), batch_intent())
    loop = make_loop(store)
    current = loop.tick()
    previous = dict(loop._previous)
    preview = loop.preview(model.Disturbance(cpu=0.9), 3.0, "")
    assert preview.generation == current.generation  # type: ignore[union-attr]
    assert loop.current() is current
    assert loop._previous == previous
    assert len(preview.node_plan.allocations) == 2


def test_pushes_carry_the_api_token(store: IntentStore) -> None:
    agent = PeerAgent()
    server = start_grpc_server(
        [(nodeagent_pb2_grpc.add_NodeAgentServiceServicer_to_server, agent, NODEAGENT)],
        port=0,
        api_token="s3cret",
    )
    try:
        address = f"127.0.0.1:{server.port}"
        for token, pushed in ((None, 0), ("s3cret", 1)):
            loop = make_loop(store, nodeagent_address=address, api_token=token)
            try:
                loop.tick()
            finally:
                loop.stop()
            assert len(agent.plans) == pushed  # ApplyNodePlan is refused without the token
    finally:
        server.stop(0)


def test_predictor_samples_normalised_by_level_and_pressure(store: IntentStore) -> None:
    """Samples measured at FP16 under 50 % CPU pressure are stored as NORMAL, pressure-free
    times (x 1 / (0.6 x 1.5)), so the next tick does not take FP16's speed for NORMAL's."""

    (web,) = submit(store, online_intent())
    loop = make_loop(store)
    try:
        loop.tick()
        with loop._lock:  # the last decision ran the intent at FP16
            loop._previous = {web: msgspec.structs.replace(loop._previous[web], degradation="FP16")}
        node = telemetry_pb2.NodeTelemetry(arena_cpus=[0, 1])
        node.cpu_pressure.CopyFrom(telemetry_pb2.Pressure(some_avg10=50.0, available=True))
        node.latencies.add(intent_id=web, recent_service_ms=[27.0] * 6)
        node.pools.add(intent_id=web, workers=1)
        loop.report(node, None)
    finally:
        loop.stop()
    stats = loop.service_stats()[web]
    assert stats.count == 6 and stats.observed_units == 1
    assert stats.mean_ms == pytest.approx(27.0 / (0.6 * 1.5))


def test_ticks_on_an_unchanged_store_reuse_the_policys_memo(store: IntentStore) -> None:
    """The loop hands its policy the same spec objects and last tick's Decisions while the store
    is unchanged, so the memo (services/core/memo.py) reads the specs once and keeps the
    Decisions that did not change; after a submit only the new spec is read and the other
    intents' unchanged Decisions are kept."""
    submit(store, online_intent(), batch_intent())
    loop = make_loop(store, cpu_units=4)
    try:
        loop.tick()
        memo = loop._policy.memo  # type: ignore[attr-defined]
        columns = memo.spec_columns
        loop.tick()
        before = dict(loop._previous)
        loop.tick()
        assert memo.spec_columns is columns
        kept = [d for i, d in loop._previous.items() if d is before[i]]
        assert kept  # unchanged decisions are the very same objects
        before = dict(loop._previous)
        submit(store, batch_intent())
        loop.tick()
        assert memo.spec_columns is not columns and len(memo.spec_columns.specs) == 3
        kept_specs = memo.spec_columns.specs[:2]
        assert all(a is b for a, b in zip(kept_specs, columns.specs, strict=True))
        assert [i for i, d in loop._previous.items() if d is before.get(i)]
    finally:
        loop.stop()


def test_a_store_change_converts_only_the_intents_it_replaced(store: IntentStore) -> None:
    web, job = submit(store, online_intent("web-k"), batch_intent("job-k"))
    loop = make_loop(store)
    before, _ = loop._current_intents()
    assert loop._current_intents()[0] is before  # same store version: the same tuple
    (extra,) = submit(store, online_intent("extra-k"))
    after, _ = loop._current_intents()
    assert [s.id for s in after] == [web, job, extra]
    assert after[0] is before[0] and after[1] is before[1]  # unchanged: the same objects
    store.delete(web)
    last, intents = loop._current_intents()
    assert [s.id for s in last] == [job, extra] and set(intents) == {job, extra}
    assert last[0] is before[1] and last[1] is after[2]
    plan = loop.tick().node_plan  # type: ignore[union-attr]
    assert [a.intent_id for a in plan.allocations] == [job, extra]


def test_a_preview_leaves_the_loops_policy_memo_alone(store: IntentStore) -> None:
    submit(store, online_intent("web-p"), batch_intent("job-p"))
    loop = make_loop(store)
    loop.tick()
    own = loop._policy.memo.last  # type: ignore[attr-defined]
    loop.preview(model.Disturbance(cpu=0.8))
    loop.preview(model.Disturbance(cpu=0.8), policy_name="fifo")
    assert loop._policy.memo.last is own  # type: ignore[attr-defined]
    first = loop.preview(model.Disturbance(cpu=0.8))
    again = loop.preview(model.Disturbance(cpu=0.8))
    assert list(first.node_plan.allocations) == list(again.node_plan.allocations)
    with pytest.raises(InvalidArgument):
        loop.preview(policy_name="no-such-policy")
