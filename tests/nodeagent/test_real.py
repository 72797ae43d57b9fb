"""The real backend's caps and checks: worker cap, load cap, kernel sizing, stress opt-in, lost workers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parfusion.v1 import intent_pb2, telemetry_pb2
from services.common.errors import InvalidArgument
from services.nodeagent.backend import BackendOptions
from services.nodeagent.real import ONLINE_N, RealBackend

pytestmark = pytest.mark.integration


def _backend(tmp_path: Path, generate: bool = False, **opts: object) -> RealBackend:
    options = BackendOptions(run_dir=tmp_path / "run", **opts)  # type: ignore[arg-type]
    return RealBackend(options, arena=(0,), generate_arrivals=generate)


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[RealBackend]:
    b = _backend(tmp_path, max_workers=3, max_load_fraction=0.5)
    yield b
    b.stop()


def _alloc(intent_id: str, cls: int, workers: int, **kw: object) -> intent_pb2.Allocation:
    return intent_pb2.Allocation(intent_id=intent_id, workload_class=cls, workers=workers, **kw)  # type: ignore[arg-type]


def test_worker_cap_keeps_deadline_work_first_and_says_so(tmp_path: Path) -> None:
    backend = _backend(tmp_path, generate=True, max_workers=3, max_load_fraction=0.5)
    try:
        _check_caps(backend)
    finally:
        backend.stop()


def _check_caps(backend: RealBackend) -> None:
    plan = intent_pb2.NodePlan(
        generation=1,
        allocations=[
            _alloc("train", intent_pb2.WORKLOAD_CLASS_BATCH, 3),
            _alloc(
                "web",
                intent_pb2.WORKLOAD_CLASS_ONLINE,
                2,
                arrival_rate_per_s=1000.0,
                base_service_ms=10.0,
            ),
        ],
    )
    applied = {a.intent_id: a for a in backend.apply(plan)}
    assert applied["web"].workers == 2 and applied["train"].workers == 1
    assert "capped to 1 workers by nodeagent.max_workers" in applied["train"].note
    # 1000 req/s x 10 ms = 10 cores offered on a 1-core arena capped at 0.5: the rate is scaled.
    assert "arrival rate scaled" in applied["web"].note
    runtime = backend._intents["web"]
    assert backend.arrival_rate(runtime) == pytest.approx(50.0)
    assert runtime.pool.reps == max(1, round(10.0 / backend._rep_ms[ONLINE_N]))
    assert backend._intents["train"].pool.duty == pytest.approx(
        0.05
    )  # the online load takes the whole cap


def test_degraded_level_shrinks_the_kernel(backend: RealBackend) -> None:
    normal = _alloc("web", intent_pb2.WORKLOAD_CLASS_ONLINE, 1, base_service_ms=10.0)
    backend.apply(intent_pb2.NodePlan(generation=1, allocations=[normal]))
    reps_normal = backend._intents["web"].pool.reps
    int8 = _alloc(
        "web",
        intent_pb2.WORKLOAD_CLASS_ONLINE,
        1,
        base_service_ms=10.0,
        degradation=intent_pb2.DEGRADATION_LEVEL_INT8,
    )
    backend.apply(intent_pb2.NodePlan(generation=2, allocations=[int8]))
    assert backend._intents["web"].pool.reps == pytest.approx(reps_normal * 0.4, abs=1)


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("cpu_set", {"cpu_set": [4096]}),
        ("sched_policy", {"sched_policy": "fifo"}),
        ("workload_class", {"workload_class": 0}),
        ("parallel_fraction", {"parallel_fraction": 1.5}),
        ("arrival_rate_per_s", {"arrival_rate_per_s": -1.0}),
    ],
)
def test_invalid_allocations_name_the_field(backend: RealBackend, field: str, change: dict) -> None:  # type: ignore[type-arg]
    base = {"intent_id": "web", "workload_class": intent_pb2.WORKLOAD_CLASS_ONLINE, "workers": 1}
    base.update(change)
    with pytest.raises(InvalidArgument, match=rf"allocations\[0\]\.{field}"):
        backend.apply(intent_pb2.NodePlan(allocations=[intent_pb2.Allocation(**base)]))  # type: ignore[arg-type]
    assert backend.pool_sizes() == {}


def test_lost_worker_is_replaced_on_the_next_plan(backend: RealBackend) -> None:
    plan = intent_pb2.NodePlan(
        generation=1,
        allocations=[_alloc("web", intent_pb2.WORKLOAD_CLASS_ONLINE, 1, base_service_ms=1.0)],
    )
    backend.apply(plan)
    victim = backend._intents["web"].pool.pids()[0]
    psutil.Process(victim).kill()
    backend.request_source("web").schedule(
        [time.monotonic()]
    )  # the feeder notices on its next task
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and backend.pool_sizes()["web"] == 1:
        time.sleep(0.02)
    assert backend.pool_sizes()["web"] == 0
    backend.apply(plan)
    assert backend.pool_sizes()["web"] == 1 and victim not in backend.owned_pids()


@pytest.mark.slow
def test_real_stress_runs_only_when_allowed_and_ends_by_itself(tmp_path: Path) -> None:
    b = _backend(tmp_path, allow_real_stress=True, max_workers=2)
    try:
        accepted, expires = b.inject_disturbance(
            telemetry_pb2.Disturbance(cpu_pressure=1.0, duration_s=0.6, source="test")
        )
        assert accepted and expires == pytest.approx(0.6)
        stress = b.owned_pids()
        assert len(stress) == 1
        tel = b.telemetry()
        assert tel.active_disturbance.cpu_pressure == 1.0 and tel.disturbance_remaining_s > 0
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and b.owned_pids():
            time.sleep(0.05)
        assert not b.owned_pids()
        with pytest.raises(InvalidArgument, match="duration_s"):
            b.inject_disturbance(telemetry_pb2.Disturbance(cpu_pressure=0.5, duration_s=0))
    finally:
        b.stop()


def _mixed_plan(generation: int, n: int, shift: int = 0) -> intent_pb2.NodePlan:
    """n intents of every class; the first few ask for workers (more than the cap allows)."""
    classes = (
        intent_pb2.WORKLOAD_CLASS_ONLINE,
        intent_pb2.WORKLOAD_CLASS_BATCH,
        intent_pb2.WORKLOAD_CLASS_ROBOT,
        intent_pb2.WORKLOAD_CLASS_URGENT,
    )
    return intent_pb2.NodePlan(
        generation=generation,
        allocations=[
            _alloc(
                f"i{k:03d}",
                classes[k % 4],
                1 if k < 4 else 0,
                arrival_rate_per_s=40.0 + k + shift,
                base_service_ms=5.0 + (k + shift) % 7,
                nice=(k + shift) % 5,
            )
            for k in range(n)
        ],
    )


def _state(backend: RealBackend) -> dict[str, tuple[object, ...]]:
    """What a plan decides about every pool (spec with caps and notes, workers) and, for those
    that run, their arrival rate, duty and knobs (the kernel's repetitions follow each backend's
    own measurement of a product)."""
    state: dict[str, tuple[object, ...]] = {}
    for intent_id, size in backend.pool_sizes().items():
        state[intent_id] = (backend.planned(intent_id), size)
        if size:
            r = backend._intents[intent_id]
            state[intent_id] += (backend.arrival_rate(r), r.pool.duty, r.pool.knobs)
    return state


def test_a_delta_leaves_the_pools_a_whole_plan_would(tmp_path: Path) -> None:
    """apply_changes (changed allocations and removed intents) ends where apply of the merged
    whole plan ends: same pools, caps, notes, arrival rates, batch duty and knobs."""
    opts = {"max_workers": 2, "max_load_fraction": 0.5}
    delta_side = _backend(tmp_path / "a", generate=True, **opts)
    whole_side = _backend(tmp_path / "b", generate=True, **opts)
    try:
        first = _mixed_plan(1, 40)
        delta_side.apply(first)
        later = _mixed_plan(2, 40, shift=3)  # every allocation moved: take a few of them
        changed = [later.allocations[k] for k in (0, 1, 5, 17)]
        removed = ["i002", "i030"]
        added = _alloc("new", intent_pb2.WORKLOAD_CLASS_URGENT, 1, arrival_rate_per_s=5.0)
        delta = intent_pb2.NodePlan(generation=2, allocations=[*changed, added])
        applied = delta_side.apply_changes(delta, removed)
        merged = {a.intent_id: a for a in first.allocations}
        for intent_id in removed:
            del merged[intent_id]
        merged.update({a.intent_id: a for a in delta.allocations})
        whole = whole_side.apply(intent_pb2.NodePlan(generation=2, allocations=merged.values()))
        assert _state(delta_side) == _state(whole_side)
        assert len(delta_side.pool_sizes()) == 39
        # only pools given workers run: the others are their spec, nothing started for them
        assert set(whole_side._intents) == {i for i, n in whole_side.pool_sizes().items() if n}
        # the reply covers the changed allocations only, as the whole plan's reply tells them
        by_id = {a.intent_id: a for a in whole}
        assert [a.intent_id for a in applied] == ["i000", "i001", "i005", "i017", "new"]
        for a in applied:
            assert a == by_id[a.intent_id]
        # the cap kept the urgent intent's worker and says so where it cut
        assert delta_side.pool_sizes()["new"] == 1
        assert any("capped to 0 workers" in a.note for a in whole)
    finally:
        delta_side.stop()
        whole_side.stop()


def test_telemetry_for_the_loop_reports_the_pools_that_moved(tmp_path: Path) -> None:
    """changed_pools_only reports the pools a plan touched since the loop's last read and the
    pools with workers, not the idle ones nothing changed; a lost worker is replaced by the next
    delta, even one about another intent."""
    backend = _backend(tmp_path, max_workers=1)
    try:
        backend.apply(_mixed_plan(1, 30))
        full = backend.telemetry(sampled_only=True, changed_pools_only=True)
        assert len(full.pools) == 30  # everything was new
        quiet = backend.telemetry(sampled_only=True, changed_pools_only=True)
        assert [p.intent_id for p in quiet.pools] == ["i003"]  # the one pool with a worker (urgent)
        nicer = _alloc("i007", intent_pb2.WORKLOAD_CLASS_BATCH, 0, nice=19)
        backend.apply_changes(intent_pb2.NodePlan(generation=2, allocations=[nicer]), [])
        moved = backend.telemetry(sampled_only=True, changed_pools_only=True)
        assert {p.intent_id: p.nice for p in moved.pools} == {"i003": 3, "i007": 19}
        victim = backend._intents["i003"].pool.pids()[0]
        psutil.Process(victim).kill()
        backend.request_source("i003").schedule([time.monotonic()])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and backend.pool_sizes()["i003"] == 1:
            time.sleep(0.02)
        assert backend.pool_sizes()["i003"] == 0
        other = _alloc("i009", intent_pb2.WORKLOAD_CLASS_BATCH, 0, nice=3)
        backend.apply_changes(intent_pb2.NodePlan(generation=3, allocations=[other]), ["i029"])
        assert backend.pool_sizes()["i003"] == 1 and victim not in backend.owned_pids()
        assert "i029" not in backend.pool_ids()
    finally:
        backend.stop()


_CLASSES = (
    intent_pb2.WORKLOAD_CLASS_ONLINE,
    intent_pb2.WORKLOAD_CLASS_BATCH,
    intent_pb2.WORKLOAD_CLASS_ROBOT,
    intent_pb2.WORKLOAD_CLASS_URGENT,
)
_allocations = st.builds(
    lambda k, cls, workers, rate, service, nice: _alloc(
        f"i{k}", cls, workers, arrival_rate_per_s=rate, base_service_ms=service, nice=nice
    ),
    st.integers(0, 9),
    st.sampled_from(_CLASSES),
    st.integers(0, 2),
    st.floats(0.0, 500.0),
    st.floats(1.0, 40.0),
    st.integers(0, 19),
)
_plans = st.lists(_allocations, max_size=8, unique_by=lambda a: a.intent_id)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealBackend, RealBackend]]:
    """Two backends with the same caps (one worker: few processes start) for the whole module."""
    opts = {"max_workers": 1, "max_load_fraction": 0.5}
    a = _backend(tmp_path_factory.mktemp("delta"), generate=True, **opts)
    b = _backend(tmp_path_factory.mktemp("whole"), generate=True, **opts)
    yield a, b
    a.stop()
    b.stop()


@pytest.mark.slow
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(first=_plans, changed=_plans, data=st.data())
def test_any_delta_leaves_the_pools_a_whole_plan_would(
    pair: tuple[RealBackend, RealBackend],
    first: list[intent_pb2.Allocation],
    changed: list[intent_pb2.Allocation],
    data: st.DataObject,
) -> None:
    """Whatever the plan in force and the delta (allocations changed, added, intents removed),
    apply_changes ends where apply of the merged whole plan ends."""
    delta_side, whole_side = pair
    delta_side.apply(intent_pb2.NodePlan(allocations=first))
    held = [a.intent_id for a in first if a.intent_id not in {c.intent_id for c in changed}]
    removed = data.draw(st.lists(st.sampled_from(held), unique=True) if held else st.just([]))
    delta_side.apply_changes(intent_pb2.NodePlan(allocations=changed), removed)
    merged = {a.intent_id: a for a in first if a.intent_id not in removed}
    merged.update({a.intent_id: a for a in changed})
    whole_side.apply(intent_pb2.NodePlan(allocations=merged.values()))
    assert _state(delta_side) == _state(whole_side)
