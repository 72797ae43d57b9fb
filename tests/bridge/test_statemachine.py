"""The transition table is the only source of truth: every row fires, every other pair is refused."""

from __future__ import annotations

import itertools

import pytest

from services.bridge.statemachine import (
    TRANSITIONS,
    Event,
    IllegalTransition,
    State,
    StateMachine,
    legal_events,
)

ILLEGAL = [pair for pair in itertools.product(State, Event) if pair not in TRANSITIONS]


def machine_in(state: State) -> StateMachine:
    machine = StateMachine(clock=lambda: 0.0)
    machine._state = state  # place the machine directly: these tests are about the table alone
    return machine


@pytest.mark.parametrize(("source", "event"), list(TRANSITIONS), ids=lambda v: v.value)
def test_every_row_of_the_table_fires_to_its_target(source: State, event: Event) -> None:
    machine = machine_in(source)
    seen = []
    machine.subscribe(seen.append)
    transition = machine.fire(event)
    assert machine.state is TRANSITIONS[(source, event)]
    assert (transition.source, transition.event, transition.target) == (
        source,
        event,
        machine.state,
    )
    assert seen == [transition]


@pytest.mark.parametrize(("source", "event"), ILLEGAL, ids=lambda v: v.value)
def test_every_pair_outside_the_table_is_refused_and_changes_nothing(
    source: State, event: Event
) -> None:
    machine = machine_in(source)
    with pytest.raises(IllegalTransition) as info:
        machine.fire(event)
    assert info.value.state is source
    assert info.value.event is event
    assert machine.state is source
    assert not machine.history


def test_the_urgent_cycle_is_a_path_through_the_table() -> None:
    machine = StateMachine(clock=lambda: 0.0)
    path = [
        Event.START_MISSION,
        Event.PREEMPT,
        Event.CHECKPOINT_SAVED,
        Event.START_URGENT,
        Event.URGENT_DONE,
        Event.RESUME,
        Event.RESTORED,
        Event.COMPENSATED,
        Event.COMPLETE,
    ]
    states = [machine.fire(event).target for event in path]
    assert states == [
        State.RUNNING,
        State.CHECKPOINTING,
        State.PREEMPTED,
        State.URGENT_TASK_RUNNING,
        State.PREEMPTED,
        State.RESUMING,
        State.COMPENSATING,
        State.RUNNING,
        State.COMPLETED,
    ]


def test_every_state_has_a_way_out_and_every_state_is_reachable() -> None:
    assert all(legal_events(state) for state in State)
    targets = {target for target in TRANSITIONS.values()} | {State.IDLE}
    assert targets == set(State)


def test_step_events_stay_out_of_the_history() -> None:
    machine = StateMachine(clock=lambda: 0.0)
    machine.fire(Event.START_MISSION)
    machine.fire(Event.STEP)
    assert [t.event for t in machine.history] == [Event.START_MISSION]
