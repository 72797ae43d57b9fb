"""plan_tick (services/core/tick.py): observations reach the predictor the same way for every
caller, and the plan is the policy's plan on exactly those statistics."""

from __future__ import annotations

import math

from parfusion.v1 import telemetry_pb2
from services.core.formulas import LATENCY_CEILING_MS, observation_factor
from services.core.model import Decision, DmugConfig, IntentSpec, NodeState, PlanInput
from services.core.policies.registry import get_policy
from services.core.predictor import Predictor
from services.core.tick import Observation, observations, plan_tick

ONLINE = IntentSpec(
    id="on",
    name="on",
    workload_class="ONLINE",
    deadline_ms=50.0,
    base_service_ms=20.0,
    arrival_rate_per_s=5.0,
    degradation=("NORMAL", "FP16"),
)
BATCH = IntentSpec(id="b", name="b", workload_class="BATCH", base_service_ms=100.0)
NODE = NodeState(name="n", cpu_units=8, cpu_ids=tuple(range(8)), contention=0.4)


def test_observations_pair_samples_with_their_pools_workers():
    tel = telemetry_pb2.NodeTelemetry()
    tel.pools.add(intent_id="on", workers=3)
    tel.latencies.add(intent_id="on", recent_service_ms=[10.0, 12.0])
    tel.latencies.add(intent_id="b", recent_service_ms=[90.0])
    tel.latencies.add(intent_id="idle")  # no samples: nothing to observe
    assert observations(tel) == [
        Observation("on", (10.0, 12.0), 3),
        Observation("b", (90.0,), 0),
    ]


def test_a_node_that_states_its_samples_parallelism_overrides_the_pool_size():
    """The real pools serve each request on one single-threaded worker: their samples are
    times at parallelism 1 whatever the pool's size."""
    tel = telemetry_pb2.NodeTelemetry()
    tel.pools.add(intent_id="on", workers=2)
    tel.latencies.add(intent_id="on", recent_service_ms=[9.0], sample_parallelism=1)
    assert observations(tel) == [Observation("on", (9.0,), 1)]


def test_per_request_times_of_a_worker_pool_give_a_bounded_prediction():
    """A pool of two one-request workers at 111 req/s with 9 ms requests runs at utilisation
    0.5. Read at parallelism 1 the model sees that; read at the pool's two workers the same
    samples count as 18 ms of one-unit work per request and the model calls the pool saturated
    (the latency ceiling), which is what the co-run's predictions were before the node said
    which parallelism its samples ran at (docs/real-benchmark.md)."""
    spec = IntentSpec(
        id="on", name="on", workload_class="ONLINE", deadline_ms=60.0, base_service_ms=9.0,
        arrival_rate_per_s=111.0, min_units=1, max_units=2, parallel_fraction=1.0,
    )  # fmt: skip
    node = NodeState(name="n", cpu_units=2, cpu_ids=(0, 1))
    predicted = {}
    for parallelism in (1, 2):
        predictor = Predictor()
        seen = [Observation("on", (9.0,) * 40, parallelism)]
        plan = plan_tick(
            get_policy("parfusion"), predictor, [spec], node,
            previous={"on": Decision("on", 2)}, tick=2, seen=seen,
        )  # fmt: skip
        (decision,) = plan.decisions
        predicted[parallelism] = decision.predicted_p99_ms
    assert predicted[1] < spec.deadline_ms
    assert predicted[2] >= LATENCY_CEILING_MS


def test_samples_are_filtered_scaled_and_taken_at_the_units_they_ran_with():
    predictor = Predictor()
    previous = {"on": Decision("on", 2, degradation="FP16")}
    seen = [
        Observation("on", (10.0, math.nan, -1.0, math.inf, 12.0), 0),  # units: last allocation
        Observation("b", (90.0,), 5),
        Observation("gone", (1.0,), 1),  # not planned: ignored
    ]
    config = DmugConfig()
    plan_tick(
        get_policy("parfusion"), predictor, [ONLINE, BATCH], NODE, previous=previous,
        tick=4, config=config, seen=seen, allocated={"on": 2},
    )  # fmt: skip
    expected = Predictor()
    factor = observation_factor(ONLINE, NODE, config, "FP16")
    expected.observe_many("on", [10.0, 12.0], units=2, factor=factor)
    expected.observe_many("b", [90.0], units=5, factor=observation_factor(BATCH, NODE, config))
    assert predictor.snapshot() == expected.snapshot()
    assert "gone" not in predictor.snapshot()


def test_the_plan_is_the_policys_plan_on_the_predictors_statistics():
    predictor = Predictor()
    for _ in range(20):
        predictor.observe("on", 30.0, units=2)
    previous = {"on": Decision("on", 2)}
    got = plan_tick(get_policy("parfusion"), predictor, [ONLINE, BATCH], NODE,
                    previous=previous, tick=3)  # fmt: skip
    state = PlanInput(
        intents=[ONLINE, BATCH], node=NODE, stats=predictor.snapshot(), previous=previous, tick=3
    )
    assert got == get_policy("parfusion").allocate(state)
    # without a predictor: no statistics, the base service times
    bare = plan_tick(get_policy("parfusion"), None, [ONLINE, BATCH], NODE)
    assert bare == get_policy("parfusion").allocate(PlanInput(intents=[ONLINE, BATCH], node=NODE))
    assert bare != got
