"""AllocatorService over real gRPC on a free port: intents, plans, watch, preview, policy,
telemetry push, seeding, and restart without loss after kill -9 of a subprocess server."""

from __future__ import annotations

import ctypes.util
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from parfusion.v1 import allocator_pb2, allocator_pb2_grpc, intent_pb2, telemetry_pb2
from services.allocator.metrics import PER_INTENT
from services.allocator.server import RunningAllocator
from services.allocator.watch import PlanMirror
from tests.allocator.conftest import batch_intent, online_intent
from tests.conftest import ROOT, free_port

Start = Callable[..., RunningAllocator]
StubFor = Callable[[str], allocator_pb2_grpc.AllocatorServiceStub]


def _submit(
    stub: allocator_pb2_grpc.AllocatorServiceStub, intent: intent_pb2.ResourceIntent
) -> allocator_pb2.SubmitIntentResponse:
    return stub.SubmitIntent(allocator_pb2.SubmitIntentRequest(intent=intent), timeout=5)


def _error(fn: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        fn()
    return err.value


def test_submit_get_list_delete(start: Start, stub_for: StubFor) -> None:
    running = start()
    stub = stub_for(running.address)
    web = _submit(stub, online_intent())
    assert web.intent.id.startswith("intent-") and not web.already_existed
    assert web.intent.priority == 500 and web.intent.node == "node-0"  # defaults visible
    job = _submit(stub, batch_intent(intent_id="job-1"))
    assert job.intent.id == "job-1"
    got = stub.GetIntent(allocator_pb2.GetIntentRequest(id=web.intent.id), timeout=5)
    assert got.intent == web.intent and not got.HasField("allocation")
    running.handle.loop.tick()
    got = stub.GetIntent(allocator_pb2.GetIntentRequest(id=web.intent.id), timeout=5)
    assert got.allocation.intent_id == web.intent.id and got.allocation.workers >= 1
    listed = stub.ListIntents(allocator_pb2.ListIntentsRequest(), timeout=5)
    assert [i.id for i in listed.intents] == [web.intent.id, "job-1"]
    batch_only = stub.ListIntents(
        allocator_pb2.ListIntentsRequest(workload_class=intent_pb2.WORKLOAD_CLASS_BATCH), timeout=5
    )
    assert [i.id for i in batch_only.intents] == ["job-1"]
    assert stub.DeleteIntent(allocator_pb2.DeleteIntentRequest(id="job-1"), timeout=5).deleted
    err = _error(
        lambda: stub.DeleteIntent(allocator_pb2.DeleteIntentRequest(id="job-1"), timeout=5)
    )
    assert err.code() == grpc.StatusCode.NOT_FOUND
    err = _error(lambda: stub.GetIntent(allocator_pb2.GetIntentRequest(id="job-1"), timeout=5))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    # the lists follow the store (each is serialized once per store version and filter)
    listed = stub.ListIntents(allocator_pb2.ListIntentsRequest(), timeout=5)
    assert [i.id for i in listed.intents] == [web.intent.id]
    batch_only = stub.ListIntents(
        allocator_pb2.ListIntentsRequest(workload_class=intent_pb2.WORKLOAD_CLASS_BATCH), timeout=5
    )
    assert list(batch_only.intents) == []
    job = _submit(stub, batch_intent(intent_id="job-2"))
    listed = stub.ListIntents(allocator_pb2.ListIntentsRequest(), timeout=5)
    assert list(listed.intents) == [web.intent, job.intent]
    # a held reply is for one store version: the next change drops it rather than keeping it
    # (one of 10,000 intents is a megabyte) until the next ListIntents
    assert running.handle.servicer._lists
    stub.DeleteIntent(allocator_pb2.DeleteIntentRequest(id="job-2"), timeout=5)
    assert not running.handle.servicer._lists


def test_idempotent_resubmission_and_conflict(start: Start, stub_for: StubFor) -> None:
    stub = stub_for(start().address)
    first = _submit(stub, online_intent(intent_id="web-1"))
    again = _submit(stub, online_intent(intent_id="web-1"))
    assert again.already_existed and again.intent == first.intent
    err = _error(lambda: _submit(stub, online_intent(intent_id="web-1", deadline_ms=80)))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    assert err.details().startswith("intent.id:")
    stored = stub.GetIntent(allocator_pb2.GetIntentRequest(id="web-1"), timeout=5).intent
    assert stored.slo.deadline_ms == 50


@pytest.mark.parametrize(
    ("intent", "details"),
    [
        (online_intent(deadline_ms=0), "intent.slo.deadline_ms: required for ONLINE (> 0)"),
        (online_intent(name="Bad Name"), "intent.name:"),
        (online_intent(gpu=intent_pb2.GpuIntent(share=2.0)), "intent.gpu.share:"),
        (online_intent(gpu=intent_pb2.GpuIntent(lane="mystery", share=0.5)), "intent.gpu.lane:"),
        (intent_pb2.ResourceIntent(name="x"), "intent.workload_class: required"),
    ],
)
def test_bad_input_is_invalid_argument_and_nothing_stored(
    start: Start, stub_for: StubFor, intent: intent_pb2.ResourceIntent, details: str
) -> None:
    running = start()
    stub = stub_for(running.address)
    err = _error(lambda: _submit(stub, intent))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith(details)
    assert len(running.handle.store) == 0


def test_request_level_errors(start: Start, stub_for: StubFor) -> None:
    stub = stub_for(start().address)
    err = _error(lambda: stub.SubmitIntent(allocator_pb2.SubmitIntentRequest(), timeout=5))
    assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "intent: required")
    err = _error(lambda: stub.GetIntent(allocator_pb2.GetIntentRequest(), timeout=5))
    assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "id: required")
    err = _error(
        lambda: stub.ListIntents(allocator_pb2.ListIntentsRequest(workload_class=42), timeout=5)
    )
    assert err.details().startswith("workload_class:")


def test_get_plan_staleness_and_telemetry_push(start: Start, stub_for: StubFor) -> None:
    running = start(cpu_units=0)
    stub = stub_for(running.address)
    _submit(stub, online_intent())
    empty = stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=5)
    assert (
        empty.node_stale and not empty.HasField("last_telemetry_at") and empty.policy == "parfusion"
    )
    reply = stub.ReportTelemetry(
        allocator_pb2.ReportTelemetryRequest(
            node=telemetry_pb2.NodeTelemetry(arena_cpus=[0, 1, 2])
        ),
        timeout=5,
    )
    assert reply.plan_generation == 0
    running.handle.loop.tick()
    plan = stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=5)
    assert not plan.node_stale and plan.HasField("last_telemetry_at")
    assert plan.node_plan.cpu_units == 3 and plan.node_plan.generation == 1
    assert plan.gpu_plan.generation == 1 and plan.policy == plan.node_plan.policy


def test_get_plan_with_the_generation_held_answers_unchanged_without_plans(
    start: Start, stub_for: StubFor
) -> None:
    running = start()
    stub = stub_for(running.address)
    assert stub.GetPlan(allocator_pb2.GetPlanRequest(known_generation=1), timeout=5).generation == 0
    _submit(stub, online_intent())
    running.handle.loop.tick()
    first = stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=5)
    assert first.generation == first.node_plan.generation >= 1 and not first.unchanged
    held = allocator_pb2.GetPlanRequest(known_generation=first.generation)
    same = stub.GetPlan(held, timeout=5)
    assert same.unchanged and same.generation == first.generation
    assert not same.HasField("node_plan") and not same.HasField("gpu_plan")
    assert same.policy == first.policy and same.node_stale == first.node_stale
    running.handle.loop.tick()
    newer = stub.GetPlan(held, timeout=5)  # a new plan since: sent whole
    assert not newer.unchanged and newer.generation == newer.node_plan.generation > first.generation
    assert len(newer.node_plan.allocations) == 1


def test_watch_plans_current_first_then_new_and_clean_end(start: Start, stub_for: StubFor) -> None:
    running = start()
    stub = stub_for(running.address)
    _submit(stub, online_intent())
    running.handle.loop.tick()
    stream = stub.WatchPlans(allocator_pb2.WatchPlansRequest(include_current=True), timeout=10)
    first = next(stream)
    assert first.node_plan.generation == 1
    deadline = time.monotonic() + 3
    while running.handle.loop.feed.subscriber_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    running.handle.loop.tick()
    running.handle.loop.tick()
    assert [next(stream).node_plan.generation for _ in range(2)] == [2, 3]
    collected: list[object] = []
    done = threading.Event()

    def drain() -> None:
        collected.extend(stream)  # ends without an error when the server shuts down cleanly
        done.set()

    threading.Thread(target=drain, daemon=True).start()
    running.stop(grace=1.0)
    assert done.wait(3)
    assert stream.code() == grpc.StatusCode.OK


def _wait_subscribers(running: RunningAllocator, count: int) -> None:
    deadline = time.monotonic() + 5
    while running.handle.loop.feed.subscriber_count() < count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert running.handle.loop.feed.subscriber_count() == count


def _by_id(plan: intent_pb2.NodePlan) -> dict[str, intent_pb2.Allocation]:
    return {a.intent_id: a for a in plan.allocations}


def test_watch_deltas_rebuild_the_whole_plan(start: Start, stub_for: StubFor) -> None:
    """A stream opened with `deltas` sends the whole plan first, then each plan as the
    allocations that changed and the intents that left; merged in order they are, plan after
    plan, what GetPlan answers whole."""
    running = start()
    stub = stub_for(running.address)
    loop = running.handle.loop
    for k in range(6):
        _submit(stub, online_intent(name=f"web-{k}", intent_id=f"web-{k}"))
    _submit(stub, batch_intent(intent_id="job-1"))
    for _ in range(3):  # the first ticks still move units (dwell, no telemetry yet)
        loop.tick()
    stream = stub.WatchPlans(
        allocator_pb2.WatchPlansRequest(include_current=True, deltas=True), timeout=20
    )
    mirror = PlanMirror()
    first = next(stream)
    assert first.base_generation == 0 and len(first.node_plan.allocations) == 7
    mirror.apply(first)
    _wait_subscribers(running, 1)

    def step(change: Callable[[], object]) -> allocator_pb2.WatchPlansResponse:
        held = mirror.generation
        change()
        loop.tick()
        reply = next(stream)
        assert reply.base_generation == held  # a delta on the plan sent before
        mirror.apply(reply)
        whole = stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=5)
        assert mirror.generation == whole.generation
        assert _by_id(mirror.node_plan()) == _by_id(whole.node_plan)
        assert mirror.node_plan().policy == whole.node_plan.policy == whole.policy
        assert mirror.gpu_plan == whole.gpu_plan
        return reply

    steady = step(lambda: None)  # nothing changed: the plan's own fields only
    assert len(steady.node_plan.allocations) == 0 and not steady.removed_intent_ids
    added = step(lambda: _submit(stub, online_intent(name="web-new", intent_id="web-new")))
    assert "web-new" in _by_id(added.node_plan) and len(added.node_plan.allocations) < 8
    gone = step(lambda: stub.DeleteIntent(allocator_pb2.DeleteIntentRequest(id="web-2")))
    assert list(gone.removed_intent_ids) == ["web-2"]
    step(lambda: stub.SetPolicy(allocator_pb2.SetPolicyRequest(name="fifo"), timeout=5))
    stream.cancel()


def test_get_plan_deltas_rebuild_the_whole_plan(start: Start, stub_for: StubFor) -> None:
    """A poller asking for deltas and naming the plan before the current one gets what
    changed since (the allocations and the intents that left), `unchanged` while the plan
    holds, and the whole plan when it is further behind or holds none; merged in order the
    replies are what GetPlan answers whole."""
    running = start()
    stub = stub_for(running.address)
    loop = running.handle.loop
    for k in range(6):
        _submit(stub, online_intent(name=f"web-{k}", intent_id=f"web-{k}"))
    for _ in range(3):  # the first ticks still move units (dwell, no telemetry yet)
        loop.tick()
    mirror = PlanMirror()

    def poll() -> allocator_pb2.GetPlanResponse:
        request = allocator_pb2.GetPlanRequest(known_generation=mirror.generation, deltas=True)
        reply = stub.GetPlan(request, timeout=5)
        mirror.apply(reply)
        whole = stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=5)
        assert reply.generation == whole.generation == mirror.generation
        assert _by_id(mirror.node_plan()) == _by_id(whole.node_plan)
        assert mirror.gpu_plan == whole.gpu_plan and reply.policy == whole.policy
        return reply

    first = poll()  # holds nothing: whole
    assert first.base_generation == 0 and len(first.node_plan.allocations) == 6
    assert poll().unchanged  # nothing new: no plans at all
    _submit(stub, online_intent(name="web-new", intent_id="web-new"))
    loop.tick()
    added = poll()
    assert added.base_generation == first.generation and not added.unchanged
    assert "web-new" in _by_id(added.node_plan) and len(added.node_plan.allocations) < 7
    stub.DeleteIntent(allocator_pb2.DeleteIntentRequest(id="web-2"), timeout=5)
    loop.tick()
    gone = poll()
    assert list(gone.removed_intent_ids) == ["web-2"] and gone.base_generation == added.generation
    loop.tick()
    loop.tick()  # two plans since the one held: whole again
    behind = poll()
    assert behind.base_generation == 0 and len(behind.node_plan.allocations) == 6
    # without `deltas` the plan before the current one still gets the whole plan
    loop.tick()
    request = allocator_pb2.GetPlanRequest(known_generation=behind.generation)
    plain = stub.GetPlan(request, timeout=5)
    assert plain.base_generation == 0 and len(plain.node_plan.allocations) == 6


def test_get_plan_without_allocations_gives_the_plans_own_fields(
    start: Start, stub_for: StubFor
) -> None:
    """`omit_allocations`: the NodePlan's own fields as the whole plan has them, no
    allocation, the GPU plan whole; the call's own fields as always."""
    running = start()
    stub = stub_for(running.address)
    for k in range(3):
        _submit(stub, online_intent(name=f"web-{k}", intent_id=f"web-{k}"))
    running.handle.loop.tick()
    whole = stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=5)
    own = stub.GetPlan(allocator_pb2.GetPlanRequest(omit_allocations=True), timeout=5)
    assert len(whole.node_plan.allocations) == 3 and not own.node_plan.allocations
    header = intent_pb2.NodePlan()
    header.CopyFrom(whole.node_plan)
    del header.allocations[:]
    assert own.node_plan == header and own.gpu_plan == whole.gpu_plan
    assert (own.generation, own.policy, own.node_stale) == (
        whole.generation, whole.policy, whole.node_stale
    )  # fmt: skip
    assert own.ByteSize() < whole.ByteSize()


def test_watch_deltas_resync_a_stream_that_fell_behind(start: Start, stub_for: StubFor) -> None:
    """A stream whose queue dropped plans gets the next one whole, never a delta on a plan it
    did not send; a stream without `deltas` gets whole plans only."""
    running = start(watch_queue=1)
    stub = stub_for(running.address)
    loop = running.handle.loop
    _submit(stub, online_intent(intent_id="web-0"))
    loop.tick()
    deltas = stub.WatchPlans(
        allocator_pb2.WatchPlansRequest(include_current=True, deltas=True), timeout=20
    )
    whole = stub.WatchPlans(allocator_pb2.WatchPlansRequest(include_current=True), timeout=20)
    assert next(deltas).base_generation == 0 and next(whole).base_generation == 0
    _wait_subscribers(running, 2)
    loop.tick()
    assert next(deltas).base_generation == 1
    first_whole = next(whole)
    assert first_whole.base_generation == 0 and len(first_whole.node_plan.allocations) == 1
    # bursts of ticks faster than this client reads; the stream's queue holds one plan, so
    # plans are dropped (how many depends on when the server's coroutine takes each one)
    last, resynced = 2, False
    for _ in range(20):
        for _ in range(4):
            loop.tick()
        current = loop.current()
        assert current is not None
        while last < current.generation:
            reply = next(deltas)
            generation = reply.node_plan.generation
            if generation == last + 1:
                assert reply.base_generation == last  # a delta on the plan it sent before
            else:  # some were dropped: whole, never a delta on a plan the stream did not send
                assert reply.base_generation == 0 and len(reply.node_plan.allocations) == 1
                resynced = True
            last = generation
        if resynced:
            break
    assert resynced
    loop.tick()
    assert next(deltas).base_generation == last
    deltas.cancel()
    whole.cancel()


def test_open_watch_streams_hold_no_thread(start: Start, stub_for: StubFor) -> None:
    """More open WatchPlans streams than the server has threads: submits, reads and a clean
    shutdown still go through (with one thread per stream, 16 streams left none for them)."""
    running = start()
    stub = stub_for(running.address)
    streams = [
        stub.WatchPlans(allocator_pb2.WatchPlansRequest(include_current=False), timeout=30)
        for _ in range(40)
    ]
    deadline = time.monotonic() + 10
    while running.handle.loop.feed.subscriber_count() < 40 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert running.handle.loop.feed.subscriber_count() == 40
    submitted = _submit(stub, online_intent())
    assert stub.GetIntent(allocator_pb2.GetIntentRequest(id=submitted.intent.id), timeout=2)
    running.handle.loop.tick()
    firsts = [next(stream).node_plan.generation for stream in streams]
    assert firsts == [1] * 40
    streams[0].cancel()  # a client that leaves is unsubscribed
    deadline = time.monotonic() + 5
    while running.handle.loop.feed.subscriber_count() > 39 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert running.handle.loop.feed.subscriber_count() == 39
    running.stop(grace=1.0)
    for stream in streams[1:]:
        assert list(stream) == [] and stream.code() == grpc.StatusCode.OK


def test_preview_applies_nothing(start: Start, stub_for: StubFor) -> None:
    running = start()
    stub = stub_for(running.address)
    _submit(stub, online_intent())
    _submit(stub, batch_intent())
    running.handle.loop.tick()
    before = stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=5)
    intents_before = stub.ListIntents(allocator_pb2.ListIntentsRequest(), timeout=5)
    req = allocator_pb2.PreviewPlanRequest(
        disturbance=telemetry_pb2.Disturbance(cpu_pressure=0.8, duration_s=10),
        arrival_rate_scale=2.0,
        policy="baseline",
    )
    preview = stub.PreviewPlan(req, timeout=5)
    assert preview.preview.policy == "baseline" and len(preview.preview.allocations) == 2
    assert preview.current == before.node_plan
    assert preview.preview_gpu.policy == "baseline"
    after = stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=5)
    assert after.node_plan == before.node_plan and after.policy == "parfusion"
    assert stub.ListIntents(allocator_pb2.ListIntentsRequest(), timeout=5) == intents_before
    err = _error(
        lambda: stub.PreviewPlan(allocator_pb2.PreviewPlanRequest(policy="nope"), timeout=5)
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith("policy:")
    bad = allocator_pb2.PreviewPlanRequest(disturbance=telemetry_pb2.Disturbance(cpu_pressure=3))
    assert (
        _error(lambda: stub.PreviewPlan(bad, timeout=5))
        .details()
        .startswith("disturbance.cpu_pressure:")
    )
    bad = allocator_pb2.PreviewPlanRequest(arrival_rate_scale=-1)
    assert (
        _error(lambda: stub.PreviewPlan(bad, timeout=5)).details().startswith("arrival_rate_scale:")
    )


def test_set_and_list_policies(start: Start, stub_for: StubFor) -> None:
    running = start()
    stub = stub_for(running.address)
    listing = stub.ListPolicies(allocator_pb2.ListPoliciesRequest(), timeout=5)
    names = [p.name for p in listing.policies]
    assert listing.active == "parfusion" and {"parfusion", "baseline"} <= set(names)
    assert all(p.kind in {"parfusion", "reference", "ablation"} for p in listing.policies)
    reply = stub.SetPolicy(allocator_pb2.SetPolicyRequest(name="baseline"), timeout=5)
    assert (reply.previous, reply.active) == ("parfusion", "baseline")
    _submit(stub, online_intent())
    running.handle.loop.tick()
    plan = stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=5)
    assert plan.policy == "baseline" and plan.node_plan.policy == "baseline"
    err = _error(lambda: stub.SetPolicy(allocator_pb2.SetPolicyRequest(name="nope"), timeout=5))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith("name:")
    assert stub.ListPolicies(allocator_pb2.ListPoliciesRequest(), timeout=5).active == "baseline"


def test_delete_removes_metric_series(start: Start, stub_for: StubFor) -> None:
    running = start()
    stub = stub_for(running.address)
    web = _submit(stub, online_intent("metric-web")).intent
    running.handle.loop.tick()
    labels = {"intent": "metric-web", "intent_id": web.id}
    assert PER_INTENT.get_sample_value("parfusion_dmug_units", labels) is not None
    stub.DeleteIntent(allocator_pb2.DeleteIntentRequest(id=web.id), timeout=5)
    assert PER_INTENT.get_sample_value("parfusion_dmug_units", labels) is None
    running.handle.loop.tick()
    assert PER_INTENT.get_sample_value("parfusion_dmug_units", labels) is None


def test_demo_intents_seed_an_empty_store_once(start: Start, stub_for: StubFor) -> None:
    running = start(seed_intents=True)
    stub = stub_for(running.address)
    ids = [i.id for i in stub.ListIntents(allocator_pb2.ListIntentsRequest(), timeout=5).intents]
    assert sorted(ids) == ["demo-batch-training", "demo-online-inference", "demo-robot-mission"]
    stub.DeleteIntent(allocator_pb2.DeleteIntentRequest(id="demo-robot-mission"), timeout=5)
    running.stop(0)
    again = start(seed_intents=True)
    ids = [
        i.id
        for i in stub_for(again.address)
        .ListIntents(allocator_pb2.ListIntentsRequest(), timeout=5)
        .intents
    ]
    assert sorted(ids) == ["demo-batch-training", "demo-online-inference"]  # not re-seeded


def _spawn(home: Path, port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PARFUSION_HOME": str(home),
        "PARFUSION_ALLOCATOR_SEED_INTENTS": "false",
        "PARFUSION_ALLOCATOR_NODEAGENT_ADDRESS": "",
        "PARFUSION_ALLOCATOR_GPULANE_ADDRESS": "",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("PARFUSION_API_TOKEN", None)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.allocator",
            "--port",
            str(port),
            "--metrics-port",
            str(free_port()),
        ],
        cwd=home,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait_ready(
    stub: allocator_pb2_grpc.AllocatorServiceStub, proc: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert proc.poll() is None, "allocator exited during start-up"
        try:
            stub.ListIntents(allocator_pb2.ListIntentsRequest(), timeout=0.5)
            return
        except grpc.RpcError:
            time.sleep(0.1)
    raise AssertionError("allocator did not start")


@pytest.mark.integration
@pytest.mark.slow
def test_restart_without_loss_after_kill_9(home: Path) -> None:
    port = free_port()
    proc = _spawn(home, port)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = allocator_pb2_grpc.AllocatorServiceStub(ch)
            _wait_ready(stub, proc)
            if ctypes.util.find_library("jemalloc"):  # re-executed on it: the same process
                assert "libjemalloc" in Path(f"/proc/{proc.pid}/maps").read_text()
            acked = [_submit(stub, online_intent(f"svc-{i}")).intent for i in range(20)]
            acked.append(_submit(stub, batch_intent(intent_id="job-kept")).intent)
        os.kill(proc.pid, signal.SIGKILL)  # no shutdown path runs: only what was committed survives
        proc.wait(timeout=10)
        proc = _spawn(home, port)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = allocator_pb2_grpc.AllocatorServiceStub(ch)
            _wait_ready(stub, proc)
            stored = list(stub.ListIntents(allocator_pb2.ListIntentsRequest(), timeout=5).intents)
            assert stored == acked
            assert _submit(stub, batch_intent(intent_id="job-kept")).already_existed
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert (home / "run" / "allocator.db").exists()


def test_preview_without_override_is_the_next_tick_and_a_disturbance_changes_it(
    start: Start, stub_for: StubFor
) -> None:
    running = start()
    stub = stub_for(running.address)
    _submit(stub, online_intent())
    _submit(stub, batch_intent())
    running.handle.loop.tick()
    same = stub.PreviewPlan(allocator_pb2.PreviewPlanRequest(), timeout=5).preview
    disturbed = stub.PreviewPlan(
        allocator_pb2.PreviewPlanRequest(disturbance=telemetry_pb2.Disturbance(cpu_pressure=0.9)),
        timeout=5,
    ).preview
    running.handle.loop.tick()
    nxt = stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=5).node_plan
    assert list(same.allocations) == list(nxt.allocations)
    assert [a.predicted_p99_ms for a in disturbed.allocations] != [
        a.predicted_p99_ms for a in nxt.allocations
    ]


def test_metrics_endpoint_serves_decision_and_loop_series(start: Start, stub_for: StubFor) -> None:
    running = start(metrics_port=0)
    stub = stub_for(running.address)
    web = _submit(stub, online_intent("scraped-web")).intent
    running.handle.loop.tick()
    url = f"http://127.0.0.1:{running.server.metrics_port}/metrics"
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    for series in (
        'parfusion_dmug_decision_duration_seconds_bucket{le="0.001",policy="parfusion"}',
        f'parfusion_dmug_units{{intent="scraped-web",intent_id="{web.id}"}}',
        f'parfusion_dmug_slack_seconds{{intent="scraped-web",intent_id="{web.id}"}}',
        f'parfusion_dmug_deadline_risk{{intent="scraped-web",intent_id="{web.id}"}}',
        f'parfusion_dmug_nmu{{intent="scraped-web",intent_id="{web.id}"}}',
        'parfusion_allocator_intents{workload_class="ONLINE"}',
        "parfusion_allocator_ticks_total",
        "parfusion_allocator_node_stale",
        "parfusion_dmug_degradations_total",
        "parfusion_dmug_preemptions_total",
        'parfusion_grpc_requests_total{code="OK",method="SubmitIntent",service="AllocatorService"}',
    ):
        assert series in body, series


def test_tune_interpreter_sets_the_switch_interval_and_the_young_threshold_only() -> None:
    """What main() sets for the allocator's process: the switch interval and the collector's
    youngest threshold; the older generations' thresholds are left as they were."""
    import gc
    import sys

    from services.allocator.server import (
        GC_YOUNG_THRESHOLD,
        GIL_SWITCH_INTERVAL_S,
        tune_interpreter,
    )

    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(700, 7, 9)
    try:
        tune_interpreter()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, 7, 9)
        assert sys.getswitchinterval() == pytest.approx(GIL_SWITCH_INTERVAL_S)
    finally:
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(interval)
