"""The modeled node: work is conserved, runs are seeded, the queue is an exact FIFO with timeouts."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from parfusion.v1 import telemetry_pb2
from services.common.config import ConfigError
from services.common.errors import InvalidArgument
from services.sim.disturbance import DisturbanceSpec, disturbance_from_proto
from services.sim.node import ModeledNode
from services.sim.params import load_model_params, parse_model_params
from services.sim.queue import RequestQueue
from services.sim.workload import Assignment, WorkloadProfile

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def params():
    return load_model_params(ROOT / "configs" / "model.yaml")


def online(params, intent_id="on", rate=150.0, deadline=53.0, arrivals="poisson"):
    return WorkloadProfile(
        intent_id=intent_id,
        name=intent_id,
        workload_class="ONLINE",
        base_service_ms=10.6,
        parallel_fraction=0.9,
        deadline_ms=deadline,
        arrival_rate_per_s=rate,
        arrivals=arrivals,
        mix=params.mix_for("ONLINE"),
    )


def batch(params):
    return WorkloadProfile(
        intent_id="b",
        name="b",
        workload_class="BATCH",
        base_service_ms=10.0,
        parallel_fraction=0.95,
        arrivals="backlog",
        work_units=math.inf,
        mix=params.mix_for("BATCH"),
    )


def run(params, seed, plans):
    node = ModeledNode(params, seed=seed, keep_history=True)
    node.set_profiles([online(params), batch(params)])
    for units, seconds in plans:
        node.apply({"on": Assignment(units=units), "b": Assignment(units=4)}, True)
        node.advance(seconds)
    return node


def test_work_is_conserved_through_overload_starvation_and_deletion(params):
    node = run(params, 3, [(4, 5.0), (1, 5.0), (0, 3.0), (6, 4.0)])
    arrived, completed, dropped, queued = node.conservation()
    assert arrived > 2000
    assert dropped > 0  # starvation made clients time out
    assert arrived == completed + dropped + queued
    stats = node.runs["on"].stats
    assert stats.completed == completed and stats.dropped == dropped
    assert stats.all_latencies().size == completed
    node.set_profiles([batch(params)])  # the online intent is deleted: its queue drops
    arrived2, completed2, dropped2, queued2 = node.conservation()
    assert (arrived2, completed2) == (arrived, completed)
    assert queued2 == 0 and dropped2 == dropped + queued


def test_same_seed_same_requests_other_seed_different(params):
    a = run(params, 7, [(4, 6.0), (2, 6.0)])
    b = run(params, 7, [(4, 6.0), (2, 6.0)])
    c = run(params, 8, [(4, 6.0), (2, 6.0)])
    la, lb, lc = (n.runs["on"].stats.all_latencies() for n in (a, b, c))
    assert np.array_equal(la, lb)
    assert la.size != lc.size or not np.array_equal(la, lc)


def test_more_units_serve_faster_and_batch_gains_throughput(params):
    slow = run(params, 1, [(2, 10.0)])
    fast = run(params, 1, [(6, 10.0)])
    assert np.percentile(fast.runs["on"].stats.all_latencies(), 99) < np.percentile(
        slow.runs["on"].stats.all_latencies(), 99
    )
    assert slow.runs["b"].stats.items_done == pytest.approx(
        fast.runs["b"].stats.items_done, rel=0.3
    )


def exact_fifo(arrival, service, busy, t1, timeout):
    """Reference: one request at a time, reneging after `timeout`."""
    lat, dropped, i = [], 0, 0
    while i < len(arrival):
        start = max(arrival[i], busy)
        if start - arrival[i] > timeout:
            if arrival[i] + timeout >= t1:
                break
            dropped += 1
            i += 1
            continue
        if start >= t1:
            break
        busy = start + service[i]
        lat.append(busy - arrival[i])
        i += 1
    return lat, dropped, len(arrival) - i


@pytest.mark.parametrize("mean_service", [0.002, 0.008, 0.03])
def test_vectorised_queue_matches_the_exact_fifo(mean_service):
    rng = np.random.default_rng(11)
    q = RequestQueue(rng, sigma=0.3)
    q.arrive(0.0, 1.0, 150.0, periodic=False)
    arrival, work = q._arrival.copy(), q._work.copy()
    out = q.serve(1.0, mean_service, timeout_s=0.05)
    lat, dropped, left = exact_fifo(arrival, work * mean_service, 0.0, 1.0, 0.05)
    assert np.allclose(out.latency_ms, np.array(lat) * 1000.0)
    assert out.dropped == dropped and q.queued == left


def test_requests_waiting_through_a_step_without_workers_start_after_it():
    # Arrivals in [0, 0.25) while the pool has no units; units from 0.25 on: nothing may
    # start before 0.25, so every latency is at least the wait to 0.25 plus the service.
    q = RequestQueue(np.random.default_rng(0), sigma=0.0)
    q.arrive(0.0, 0.25, 20.0, periodic=True)
    assert q.serve(0.25, math.inf, timeout_s=10.0).latency_ms.size == 0
    out = q.serve(0.5, 0.01, timeout_s=10.0)
    assert out.latency_ms.size == 5
    starts = out.arrival_s + (out.latency_ms - out.service_ms) / 1000.0
    assert starts.min() >= 0.25 - 1e-12
    assert out.latency_ms[0] == pytest.approx(260.0)


def test_periodic_arrivals_keep_their_period_across_steps():
    q = RequestQueue(np.random.default_rng(0), sigma=0.0)
    for k in range(8):
        q.arrive(k * 0.25, (k + 1) * 0.25, 20.0, periodic=True)
    assert q.arrived == 40
    assert np.allclose(np.diff(q._arrival), 0.05)


def test_disturbance_slows_service_and_expires(params):
    node = ModeledNode(params, seed=0)
    node.set_profiles([online(params)])
    node.apply({"on": Assignment(units=4)}, True)
    node.advance(1.0)
    quiet = node.runs["on"].mean_service_ms
    node.inject(DisturbanceSpec(cpu=0.5, gpu=0.5, network=0.5, duration_s=2.0))
    node.advance(1.0)
    loud = node.runs["on"].mean_service_ms
    assert loud > 1.5 * quiet
    node.advance(1.5)
    assert node.active_disturbance() is None
    assert node.runs["on"].mean_service_ms == pytest.approx(quiet)


def test_isolation_and_lanes_reduce_interference(params):
    def service(on: Assignment, b: Assignment) -> float:
        node = ModeledNode(params, seed=0)
        node.set_profiles([online(params), batch(params)])
        node.apply({"on": on, "b": b}, True)
        node.advance(0.5)
        return node.runs["on"].mean_service_ms

    shared = service(Assignment(units=4), Assignment(units=8))
    niced = service(Assignment(units=4), Assignment(units=8, nice=19))
    pinned = service(
        Assignment(units=4, cpu_set=(0, 1, 2, 3), gpu_indexes=(0, 1), stream_priority=1),
        Assignment(units=8, cpu_set=tuple(range(4, 12)), gpu_indexes=(2, 3, 4, 5)),
    )
    assert shared > niced > pinned


def test_degradation_shortens_service(params):
    times = {}
    for level in ("NORMAL", "FP16", "INT8"):
        node = ModeledNode(params, seed=0)
        node.set_profiles([online(params)])
        node.apply({"on": Assignment(units=2, degradation=level)}, True)
        node.advance(0.5)
        times[level] = node.runs["on"].mean_service_ms
    assert times["NORMAL"] > times["FP16"] > times["INT8"]


def test_disturbance_validation_names_the_field():
    ok = disturbance_from_proto(telemetry_pb2.Disturbance(cpu_pressure=0.4, duration_s=5))
    assert ok.cpu == 0.4 and ok.source == "api"
    with pytest.raises(InvalidArgument, match="disturbance.gpu_pressure"):
        disturbance_from_proto(telemetry_pb2.Disturbance(gpu_pressure=1.5, duration_s=5))
    with pytest.raises(InvalidArgument, match="disturbance.duration_s"):
        disturbance_from_proto(telemetry_pb2.Disturbance(cpu_pressure=0.1))


def test_params_reject_bad_values(params):
    import yaml

    doc = yaml.safe_load((ROOT / "configs" / "model.yaml").read_text())
    doc["mix"]["ONLINE"]["gpu_fraction"] = 0.95
    with pytest.raises(ConfigError, match="mix.ONLINE"):
        parse_model_params(doc)
    doc = yaml.safe_load((ROOT / "configs" / "model.yaml").read_text())
    doc["degradation"]["gpu"].pop("INT8")
    with pytest.raises(ConfigError, match="degradation.gpu"):
        parse_model_params(doc)
    assert replace(params, cpu_units=4).cpu_units == 4


def test_an_idle_class_pool_gets_only_the_cores_others_leave(params):
    """SCHED_IDLE batch on cores a busy online pool uses runs slower than on idle cores, and
    does not slow the online pool more than batch at nice 19 would."""

    def run(on: Assignment, b: Assignment) -> tuple[float, float]:
        node = ModeledNode(params, seed=0)
        node.set_profiles([online(params), batch(params)])
        node.apply({"on": on, "b": b}, True)
        node.advance(0.5)
        return node.runs["on"].mean_service_ms, node.runs["b"].mean_service_ms

    cores = tuple(range(4))
    alone_batch = run(Assignment(units=0), Assignment(units=4, cpu_set=cores, sched_policy="idle"))
    shared = run(
        Assignment(units=4, cpu_set=cores),
        Assignment(units=4, cpu_set=cores, sched_policy="idle", nice=19),
    )
    niced = run(Assignment(units=4, cpu_set=cores), Assignment(units=4, cpu_set=cores, nice=19))
    assert shared[1] > alone_batch[1]  # fewer cores left for batch
    assert shared[1] > niced[1]  # idle time only: slower than a pool that competes at nice 19
    assert shared[0] <= niced[0]


def test_runs_table_is_rebuilt_after_most_intents_leave(params):
    node = ModeledNode(params, seed=0)
    profiles = [online(params, intent_id=f"on-{k}", rate=1.0) for k in range(2000)]
    node.set_profiles(profiles)
    peak = sys.getsizeof(node.runs)
    kept = node.runs["on-5"]
    node.change([], [p.intent_id for p in profiles if p.intent_id != "on-5"], True)
    assert list(node.runs) == ["on-5"] and node.runs["on-5"] is kept
    assert sys.getsizeof(node.runs) <= sys.getsizeof(dict.fromkeys(range(8))) < peak


def _first_arrivals(node: ModeledNode, intent_id: str) -> list[float]:
    return [float(node.runs[intent_id].rng.random()) for _ in range(3)]


def test_a_resubmitted_id_gets_a_stream_of_its_own_and_departed_ids_are_bounded(
    params, monkeypatch
):
    monkeypatch.setattr("services.sim.node.LEFT_IDS_KEPT", 8)
    node = ModeledNode(params, seed=0)
    node.set_profiles([online(params, "on")])
    first = _first_arrivals(node, "on")
    node.set_profiles([])
    node.set_profiles([online(params, "on")])  # back: not its first life's stream
    second = _first_arrivals(node, "on")
    assert second != first
    node.set_profiles([])
    for i in range(20):  # 20 other ids come and go
        node.set_profiles([online(params, f"other-{i}")])
    node.set_profiles([])
    assert len(node._left) == 8  # only the last 8 departed ids are remembered
    node.set_profiles([online(params, "on")])  # forgotten: starts over from its first stream
    assert _first_arrivals(node, "on") == first
    fresh = ModeledNode(params, seed=0)
    fresh.set_profiles([online(params, "other-19"), online(params, "on")])
    node.set_profiles([online(params, "other-19"), online(params, "on")])
    assert _first_arrivals(node, "other-19") != _first_arrivals(fresh, "other-19")  # remembered
