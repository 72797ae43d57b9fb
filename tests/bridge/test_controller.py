"""The control loop, tick by tick: missions, urgent cycles, rollbacks, EDF order, restarts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.bridge.allocator_client import AllocatorOutcome, PlannedAllocation, intent_id_for
from services.bridge.controller import RobotBridge
from services.bridge.statemachine import TRANSITIONS, Event, IllegalTransition, State
from services.bridge.validation import MissionSpec, UrgentSpec
from tests.bridge.conftest import Clock, make_bridge, run_ticks


def mission(steps: int = 20, interval: int = 5, deadline_ms: float = 0.0) -> MissionSpec:
    return MissionSpec(
        name="patrol", steps=steps, safe_point_interval=interval, deadline_ms=deadline_ms
    )


def urgent(name: str = "fall-detected", deadline_ms: float = 10_000.0, work: int = 3) -> UrgentSpec:
    return UrgentSpec(name=name, deadline_ms=deadline_ms, work=work)


def sample(bridge: RobotBridge, name: str, labels: dict[str, str] | None = None) -> float:
    value = bridge.metrics.registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def record_rows(bridge: RobotBridge, rows: set[tuple[State, Event]]) -> None:
    bridge.subscribe(lambda t: rows.add((t.source, t.event)))


def test_a_mission_runs_to_completion_with_durable_safe_points(
    checkpoint_path: Path, clock: Clock
) -> None:
    bridge = make_bridge(checkpoint_path, clock)
    bridge.start_mission(mission(steps=12, interval=5, deadline_ms=60_000))
    states = run_ticks(bridge, clock, 12)
    assert states[:-1] == ["RUNNING"] * 11 and states[-1] == "COMPLETED"
    assert bridge.mission is not None and bridge.mission.outcome == "met"
    assert bridge.mission.checkpoint_step == 10
    stored = json.loads(checkpoint_path.read_text())
    assert stored["mission"]["outcome"] == "met" and stored["mission"]["step"] == 12
    assert sample(bridge, "parfusion_bridge_checkpoints_total", {"reason": "safe_point"}) == 2
    assert sample(bridge, "parfusion_bridge_missions_total", {"outcome": "met"}) == 1
    run_ticks(bridge, clock, 3)
    assert bridge.machine.state is State.COMPLETED  # nothing to do: ticks are no-ops


def test_a_mission_that_outlives_its_deadline_counts_as_missed(
    checkpoint_path: Path, clock: Clock
) -> None:
    bridge = make_bridge(checkpoint_path, clock)
    bridge.start_mission(
        mission(steps=10, interval=5, deadline_ms=1_000)
    )  # 10 ticks of 0.2 s = 2 s
    run_ticks(bridge, clock, 10)
    assert bridge.mission is not None and bridge.mission.outcome == "missed"
    assert sample(bridge, "parfusion_bridge_missions_total", {"outcome": "missed"}) == 1


def test_urgent_event_preempts_at_the_next_safe_point_and_the_mission_resumes(
    checkpoint_path: Path, clock: Clock
) -> None:
    bridge = make_bridge(checkpoint_path, clock)
    bridge.start_mission(mission(steps=20, interval=5))
    run_ticks(bridge, clock, 2)
    event = bridge.submit_urgent(urgent(work=3))
    states = run_ticks(bridge, clock, 12)
    assert states == [
        "RUNNING",  # step 3
        "RUNNING",  # step 4
        "CHECKPOINTING",  # step 5 is a safe point: stop there
        "PREEMPTED",  # checkpoint durable
        "URGENT_TASK_RUNNING",
        "URGENT_TASK_RUNNING",
        "URGENT_TASK_RUNNING",
        "PREEMPTED",  # work 3 done
        "RESUMING",
        "COMPENSATING",
        "RUNNING",
        "RUNNING",
    ]
    assert bridge.mission is not None and bridge.mission.step == 6
    assert bridge.mission.steps_redone == 0 and bridge.mission.preemptions == 1
    assert event.outcome == "met" and event.allocator == "disabled"
    # arrival, three mission steps to the safe point
    assert sample(bridge, "parfusion_bridge_time_to_safe_point_seconds_sum") == pytest.approx(0.6)
    # ... then checkpoint and hand-over
    assert sample(bridge, "parfusion_bridge_preemption_latency_seconds_sum") == pytest.approx(1.0)
    assert sample(bridge, "parfusion_bridge_urgent_completion_seconds_sum") == pytest.approx(1.6)
    assert sample(bridge, "parfusion_bridge_resume_latency_seconds_sum") == pytest.approx(0.6)
    assert sample(bridge, "parfusion_bridge_replan_seconds_count") == 1
    assert sample(bridge, "parfusion_bridge_urgent_completed_total", {"outcome": "met"}) == 1
    assert sample(bridge, "parfusion_bridge_checkpoints_total", {"reason": "preemption"}) == 1
    stored = json.loads(checkpoint_path.read_text())
    assert stored["mission"]["checkpoint_step"] == 5


def test_a_tight_deadline_stops_the_mission_at_once_and_the_lost_steps_are_redone(
    checkpoint_path: Path, clock: Clock
) -> None:
    bridge = make_bridge(checkpoint_path, clock)
    bridge.start_mission(mission(steps=20, interval=10))
    run_ticks(bridge, clock, 3)  # step 3; the last safe point is step 0
    # waiting 7 steps + hand-over + work = 2.0 s > 1.0 s deadline; stopping now = 0.6 s fits
    bridge.submit_urgent(urgent(deadline_ms=1_000, work=1))
    states = run_ticks(bridge, clock, 7)
    assert states == [
        "CHECKPOINTING",
        "PREEMPTED",
        "URGENT_TASK_RUNNING",
        "PREEMPTED",
        "RESUMING",
        "COMPENSATING",
        "RUNNING",
    ]
    assert bridge.preemption_reason == "rollback"
    assert bridge.mission is not None
    assert bridge.mission.steps_redone == 3
    assert bridge.mission.step == 0  # back at the safe point before the lost steps
    assert bridge.finished[0].outcome == "met"
    assert sample(bridge, "parfusion_bridge_steps_redone_total") == 3
    run_ticks(bridge, clock, 20)
    assert bridge.mission.outcome == "met" and bridge.mission.step == 20


def test_waiting_is_kept_when_even_stopping_now_would_miss(
    checkpoint_path: Path, clock: Clock
) -> None:
    bridge = make_bridge(checkpoint_path, clock)
    bridge.start_mission(mission(steps=20, interval=10))
    run_ticks(bridge, clock, 3)
    event = bridge.submit_urgent(urgent(deadline_ms=300, work=1))  # 0.6 s even if stopped now
    states = run_ticks(bridge, clock, 8)
    assert states[:7] == ["RUNNING"] * 6 + ["CHECKPOINTING"]  # waited for step 10: no progress lost
    run_ticks(bridge, clock, 6)
    assert bridge.mission is not None and bridge.mission.steps_redone == 0
    assert event.outcome == "missed"
    assert sample(bridge, "parfusion_bridge_urgent_deadline_misses_total") == 1
    assert sample(bridge, "parfusion_bridge_urgent_completed_total", {"outcome": "missed"}) == 1


def test_urgent_events_are_served_earliest_deadline_first_back_to_back(
    checkpoint_path: Path, clock: Clock
) -> None:
    bridge = make_bridge(checkpoint_path, clock)
    bridge.start_mission(mission(steps=20, interval=5))
    run_ticks(bridge, clock, 1)
    for name, deadline in (("late", 30_000), ("first", 10_000), ("middle", 20_000)):
        bridge.submit_urgent(urgent(name=name, deadline_ms=deadline, work=2))
    assert [e.spec.name for _, _, e in sorted(bridge.queue)] == ["first", "middle", "late"]
    states = run_ticks(bridge, clock, 4 + 1 + 1 + 3 * 3)
    order = [e.spec.name for e in reversed(bridge.finished)]
    assert order == ["first", "middle", "late"]
    # one preemption for all three: PREEMPTED hands the robot straight to the next event
    assert states.count("CHECKPOINTING") == 1
    assert states.count("RESUMING") == 1
    assert bridge.mission is not None and bridge.mission.preemptions == 1


def test_an_urgent_event_arriving_during_an_urgent_task_is_queued(
    checkpoint_path: Path, clock: Clock
) -> None:
    bridge = make_bridge(checkpoint_path, clock)
    bridge.submit_urgent(urgent(name="first", work=3))
    assert run_ticks(bridge, clock, 1) == ["URGENT_TASK_RUNNING"]
    bridge.submit_urgent(urgent(name="second", deadline_ms=1_000, work=1))
    assert bridge.active is not None and bridge.active.spec.name == "first"
    assert len(bridge.queue) == 1
    with pytest.raises(IllegalTransition) as info:
        bridge.start_mission(mission())
    assert info.value.state is State.URGENT_TASK_RUNNING
    states = run_ticks(bridge, clock, 5)
    assert states == [
        "URGENT_TASK_RUNNING",
        "URGENT_TASK_RUNNING",
        "IDLE",
        "URGENT_TASK_RUNNING",
        "IDLE",
    ]
    assert [e.spec.name for e in bridge.finished] == ["second", "first"]


def test_urgent_after_a_completed_mission_and_a_new_mission_after_it(
    checkpoint_path: Path, clock: Clock
) -> None:
    bridge = make_bridge(checkpoint_path, clock)
    bridge.start_mission(mission(steps=2, interval=1))
    run_ticks(bridge, clock, 2)
    bridge.submit_urgent(urgent(work=1))
    assert run_ticks(bridge, clock, 2) == ["URGENT_TASK_RUNNING", "IDLE"]
    bridge.start_mission(mission(steps=3, interval=1))
    assert bridge.machine.state is State.RUNNING


def test_a_new_mission_is_refused_while_one_is_active(checkpoint_path: Path, clock: Clock) -> None:
    bridge = make_bridge(checkpoint_path, clock)
    bridge.start_mission(mission())
    for expected in ("RUNNING", "CHECKPOINTING", "PREEMPTED", "URGENT_TASK_RUNNING"):
        if expected == "CHECKPOINTING":
            bridge.submit_urgent(urgent(work=1))
            run_ticks(bridge, clock, 1)
        elif expected != "RUNNING":
            run_ticks(bridge, clock, 1)
        assert bridge.machine.state.value == expected
        with pytest.raises(IllegalTransition):
            bridge.start_mission(mission())


def test_the_urgent_queue_is_bounded(checkpoint_path: Path, clock: Clock) -> None:
    bridge = make_bridge(checkpoint_path, clock, queue_limit=2)
    bridge.submit_urgent(urgent(name="a"))
    bridge.submit_urgent(urgent(name="b"))
    with pytest.raises(IllegalTransition, match="queue is full"):
        bridge.submit_urgent(urgent(name="c"))


def walk_to(bridge: RobotBridge, clock: Clock, target: State) -> None:
    """Start a mission with one urgent event pending and tick until ``target``."""
    bridge.start_mission(mission(steps=10, interval=5))
    bridge.submit_urgent(urgent(work=1))
    for _ in range(10):
        if bridge.machine.state is target:
            return
        run_ticks(bridge, clock, 1)
    raise AssertionError(f"never reached {target}")


@pytest.mark.parametrize(
    "target",
    [State.RUNNING, State.CHECKPOINTING, State.PREEMPTED, State.RESUMING, State.COMPENSATING],
)
def test_a_mission_can_be_cancelled_unless_an_urgent_task_has_the_robot(
    checkpoint_path: Path, clock: Clock, target: State
) -> None:
    bridge = make_bridge(checkpoint_path, clock)
    if target is State.RUNNING:
        bridge.start_mission(mission())
    else:
        walk_to(bridge, clock, target)
    bridge.cancel_mission()
    assert bridge.machine.state is State.IDLE
    assert bridge.mission is not None and bridge.mission.outcome == "cancelled"
    run_ticks(bridge, clock, 3)  # a pending urgent event still gets the robot, then it idles
    assert bridge.machine.state in (State.IDLE, State.URGENT_TASK_RUNNING)


def test_cancel_is_refused_while_an_urgent_task_runs(checkpoint_path: Path, clock: Clock) -> None:
    bridge = make_bridge(checkpoint_path, clock)
    walk_to(bridge, clock, State.URGENT_TASK_RUNNING)
    with pytest.raises(IllegalTransition) as info:
        bridge.cancel_mission()
    assert info.value.state is State.URGENT_TASK_RUNNING


class FlakyAllocator:
    """An AllocatorPort whose deletes fail a given number of times (the gRPC path is tested elsewhere)."""

    address = "flaky"

    def __init__(self, failing_deletes: int) -> None:
        self.failing_deletes = failing_deletes
        self.submitted: list[str] = []
        self.deleted: list[str] = []

    def submit_urgent(self, event_id: str, name: str, deadline_ms: float) -> AllocatorOutcome:
        self.submitted.append(event_id)
        return AllocatorOutcome(True, intent_id_for(event_id))

    def delete_urgent(self, event_id: str) -> AllocatorOutcome:
        if self.failing_deletes > 0:
            self.failing_deletes -= 1
            return AllocatorOutcome(
                False, intent_id_for(event_id), "connection refused", "UNAVAILABLE"
            )
        self.deleted.append(event_id)
        return AllocatorOutcome(True, intent_id_for(event_id))

    def allocation(self, event_id: str) -> PlannedAllocation | None:
        return self.planned

    planned: PlannedAllocation | None = None


def test_the_bridge_reports_the_allocation_the_plan_made_not_the_submit(
    checkpoint_path: Path, clock: Clock
) -> None:
    allocator = FlakyAllocator(failing_deletes=0)
    bridge = make_bridge(checkpoint_path, clock, allocator)
    event = bridge.submit_urgent(urgent(work=3))
    run_ticks(bridge, clock, 1)  # submitted; the allocator has not planned it yet
    assert event.allocator == "submitted" and event.allocation is None
    allocator.planned = PlannedAllocation(0, 0, "THROTTLED", "needs 1 units, 0 free", 1e9)
    run_ticks(bridge, clock, 1)
    assert event.allocator == "throttled"
    assert event.allocation is not None and event.allocation["reason"] == "needs 1 units, 0 free"
    assert sample(bridge, "parfusion_bridge_urgent_allocated_units", {}) == 0
    assert sample(bridge, "parfusion_bridge_urgent_allocations_total", {"state": "THROTTLED"}) == 1
    allocator.planned = PlannedAllocation(1, 1, "ADMITTED", "meets its deadline", 20.0)
    run_ticks(bridge, clock, 1)
    assert event.allocator == "granted" and event.allocation["units"] == 1
    assert sample(bridge, "parfusion_bridge_urgent_allocated_units", {}) == 1
    run_ticks(bridge, clock, 1)  # done: the intent is deleted whatever its plan said
    assert allocator.deleted == [event.id]
    assert sample(bridge, "parfusion_bridge_urgent_allocated_units", {}) == 0


def test_an_intent_the_allocator_did_not_take_back_is_deleted_later_even_after_a_restart(
    checkpoint_path: Path, clock: Clock
) -> None:
    allocator = FlakyAllocator(failing_deletes=2)
    bridge = make_bridge(checkpoint_path, clock, allocator)
    event = bridge.submit_urgent(urgent(work=1))
    run_ticks(bridge, clock, 2)  # start (submit), done (delete fails)
    assert event.intent_deleted is False and bridge.undeleted == [event.id]
    assert (
        sample(
            bridge,
            "parfusion_bridge_allocator_failures_total",
            {"operation": "delete", "reason": "unreachable"},
        )
        == 1
    )
    restarted = make_bridge(checkpoint_path, clock, allocator)
    restarted.restore()
    assert restarted.undeleted == [event.id]
    run_ticks(restarted, clock, 1)  # retried at once after the restart: fails again
    assert allocator.failing_deletes == 0 and restarted.undeleted == [event.id]
    run_ticks(restarted, clock, 1)  # next retry not due for 2 s
    assert not allocator.deleted
    clock.advance(2.0)
    run_ticks(restarted, clock, 1)
    assert allocator.deleted == [event.id] and not restarted.undeleted
    assert restarted.snapshot()["allocator"]["undeleted_intents"] == 0


def test_cancel_only_from_running(checkpoint_path: Path, clock: Clock) -> None:
    bridge = make_bridge(checkpoint_path, clock)
    with pytest.raises(IllegalTransition):
        bridge.cancel_mission()
    bridge.start_mission(mission())
    run_ticks(bridge, clock, 2)
    bridge.cancel_mission()
    assert bridge.machine.state is State.IDLE
    assert bridge.mission is not None and bridge.mission.outcome == "cancelled"
    assert not make_bridge(
        checkpoint_path, clock
    ).restore()  # a cancelled mission is not brought back


def test_restart_mid_mission_resumes_from_the_checkpoint(
    checkpoint_path: Path, clock: Clock
) -> None:
    first = make_bridge(checkpoint_path, clock)
    started = first.start_mission(mission(steps=20, interval=5))
    run_ticks(first, clock, 7)  # step 7; checkpoint at 5
    del first  # the process dies: only the file remains

    second = make_bridge(checkpoint_path, clock)
    assert second.restore()
    assert second.machine.state is State.RESUMING
    assert run_ticks(second, clock, 3) == ["COMPENSATING", "RUNNING", "RUNNING"]
    assert second.mission is not None and second.mission.id == started.id
    assert second.mission.steps_redone == 2 and second.mission.restarts == 1
    assert second.mission.step == 6  # resumed at 5, one step done since
    assert sample(second, "parfusion_bridge_steps_redone_total") == 2
    assert sample(second, "parfusion_bridge_resume_latency_seconds_sum") == pytest.approx(0.4)
    run_ticks(second, clock, 14)
    assert second.mission.outcome == "met" and second.mission.step == 20


def test_restart_during_an_urgent_task_runs_it_again_after_the_restore(
    checkpoint_path: Path, clock: Clock
) -> None:
    first = make_bridge(checkpoint_path, clock)
    first.start_mission(mission(steps=20, interval=5))
    first.submit_urgent(urgent(work=3))
    run_ticks(first, clock, 4)  # preempt at 0, checkpoint, hand-over, one unit of work
    assert first.machine.state is State.URGENT_TASK_RUNNING

    second = make_bridge(checkpoint_path, clock)
    assert second.restore()
    assert len(second.queue) == 1 and second.queue[0][2].done == 0
    states = run_ticks(second, clock, 2 + 4 + 3 + 3)
    assert states[:6] == [
        "COMPENSATING",
        "RUNNING",
        "CHECKPOINTING",
        "PREEMPTED",
        "URGENT_TASK_RUNNING",
        "URGENT_TASK_RUNNING",
    ]
    assert second.finished and second.finished[0].outcome == "met"
    assert second.machine.state is State.RUNNING


def test_a_corrupt_checkpoint_is_ignored(checkpoint_path: Path, clock: Clock) -> None:
    checkpoint_path.parent.mkdir(parents=True)
    checkpoint_path.write_text("{not json")
    bridge = make_bridge(checkpoint_path, clock)
    assert not bridge.restore()
    assert bridge.machine.state is State.IDLE


def test_the_scenarios_together_exercise_every_row_of_the_table(
    checkpoint_path: Path, clock: Clock, tmp_path: Path
) -> None:
    rows: set[tuple[State, Event]] = set()
    bridge = make_bridge(checkpoint_path, clock)
    record_rows(bridge, rows)
    bridge.start_mission(mission(steps=10, interval=5))
    bridge.submit_urgent(urgent(work=1))
    run_ticks(bridge, clock, 20)  # urgent cycle, then completion
    bridge.submit_urgent(urgent(work=1))
    run_ticks(bridge, clock, 2)  # from COMPLETED
    bridge.submit_urgent(urgent(work=1))
    run_ticks(bridge, clock, 2)  # from IDLE
    bridge.start_mission(mission(steps=2, interval=1))
    run_ticks(bridge, clock, 2)
    bridge.start_mission(mission(steps=10, interval=5))  # from COMPLETED
    run_ticks(bridge, clock, 2)
    bridge.cancel_mission()

    for target in (State.CHECKPOINTING, State.PREEMPTED, State.RESUMING, State.COMPENSATING):
        cancelled = make_bridge(tmp_path / f"cancel-{target.value}.json", clock)
        record_rows(cancelled, rows)
        walk_to(cancelled, clock, target)
        cancelled.cancel_mission()

    restart_path = tmp_path / "restart.json"
    crashed = make_bridge(restart_path, clock)
    crashed.start_mission(mission(steps=10, interval=5))
    run_ticks(crashed, clock, 3)
    restarted = make_bridge(restart_path, clock)
    record_rows(restarted, rows)
    restarted.restore()
    run_ticks(restarted, clock, 2)
    assert rows == set(TRANSITIONS)
