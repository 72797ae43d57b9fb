"""The robot's mission state machine: one transition table and the one place that checks it.

Every state change in the bridge (a mission arriving, a step, a safe point reached, an urgent
task starting or finishing, a resume after restart) is an :class:`Event` fired through
:meth:`StateMachine.fire`. A (state, event) pair that is not in :data:`TRANSITIONS` raises
:class:`IllegalTransition`, which the HTTP layer answers 409 with the current state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from services.common.errors import FailedPrecondition


class State(StrEnum):
    IDLE = "IDLE"
    RUNNING = "RUNNING"
    CHECKPOINTING = "CHECKPOINTING"
    PREEMPTED = "PREEMPTED"
    URGENT_TASK_RUNNING = "URGENT_TASK_RUNNING"
    RESUMING = "RESUMING"
    COMPENSATING = "COMPENSATING"
    COMPLETED = "COMPLETED"


class Event(StrEnum):
    START_MISSION = "start_mission"  # a mission was accepted
    STEP = "step"  # the mission advanced one step
    PREEMPT = "preempt"  # an urgent event is pending and the mission may stop here
    COMPLETE = "complete"  # the mission's last step is done
    CANCEL = "cancel"  # the operator aborted the mission (not while an urgent task has the robot)
    CHECKPOINT_SAVED = "checkpoint_saved"  # the checkpoint is durable on disk
    START_URGENT = "start_urgent"  # the most urgent queued event got the robot
    URGENT_STEP = "urgent_step"  # the urgent task did one unit of its work
    URGENT_DONE = "urgent_done"  # urgent task finished; a preempted mission is parked
    URGENT_DONE_IDLE = "urgent_done_idle"  # urgent task finished; no mission to go back to
    RESUME = "resume"  # no urgent work left; bring the parked mission back
    RESTORE = "restore"  # the bridge (re)started and found a mission checkpoint
    RESTORED = "restored"  # the mission's checkpoint is loaded
    COMPENSATED = "compensated"  # lost progress is re-planned; the mission runs again


# (current state, event) -> next state. The only definition of what may happen when.
TRANSITIONS: dict[tuple[State, Event], State] = {
    (State.IDLE, Event.START_MISSION): State.RUNNING,
    (State.COMPLETED, Event.START_MISSION): State.RUNNING,
    (State.RUNNING, Event.STEP): State.RUNNING,
    (State.RUNNING, Event.PREEMPT): State.CHECKPOINTING,
    (State.RUNNING, Event.COMPLETE): State.COMPLETED,
    (State.RUNNING, Event.CANCEL): State.IDLE,
    (State.CHECKPOINTING, Event.CANCEL): State.IDLE,
    (State.PREEMPTED, Event.CANCEL): State.IDLE,
    (State.RESUMING, Event.CANCEL): State.IDLE,
    (State.COMPENSATING, Event.CANCEL): State.IDLE,
    (State.CHECKPOINTING, Event.CHECKPOINT_SAVED): State.PREEMPTED,
    (State.PREEMPTED, Event.START_URGENT): State.URGENT_TASK_RUNNING,
    (State.IDLE, Event.START_URGENT): State.URGENT_TASK_RUNNING,
    (State.COMPLETED, Event.START_URGENT): State.URGENT_TASK_RUNNING,
    (State.URGENT_TASK_RUNNING, Event.URGENT_STEP): State.URGENT_TASK_RUNNING,
    (State.URGENT_TASK_RUNNING, Event.URGENT_DONE): State.PREEMPTED,
    (State.URGENT_TASK_RUNNING, Event.URGENT_DONE_IDLE): State.IDLE,
    (State.PREEMPTED, Event.RESUME): State.RESUMING,
    (State.IDLE, Event.RESTORE): State.RESUMING,
    (State.RESUMING, Event.RESTORED): State.COMPENSATING,
    (State.COMPENSATING, Event.COMPENSATED): State.RUNNING,
}

# States in which the robot is doing (or about to do) a mission's work; a new mission is refused.
MISSION_ACTIVE = frozenset(
    {
        State.RUNNING,
        State.CHECKPOINTING,
        State.PREEMPTED,
        State.RESUMING,
        State.COMPENSATING,
    }
)


class IllegalTransition(FailedPrecondition):
    """The request does not fit the current state (HTTP 409, body names the state)."""

    def __init__(self, state: State, event: Event, message: str | None = None) -> None:
        self.state = state
        self.event = event
        super().__init__(message or f"{event.value} is not allowed in state {state.value}")


@dataclass(frozen=True, slots=True)
class Transition:
    source: State
    event: Event
    target: State
    at: float


Listener = Callable[[Transition], None]


class StateMachine:
    """Holds the current state and the recent transitions; callers serialize access."""

    def __init__(self, clock: Callable[[], float], history: int = 64) -> None:
        self._state = State.IDLE
        self._clock = clock
        self.history: deque[Transition] = deque(maxlen=history)
        self._listeners: list[Listener] = []

    @property
    def state(self) -> State:
        return self._state

    def allows(self, event: Event) -> bool:
        return (self._state, event) in TRANSITIONS

    def check(self, event: Event, message: str | None = None) -> State:
        """The state ``event`` would lead to; IllegalTransition if the table has no such row."""
        target = TRANSITIONS.get((self._state, event))
        if target is None:
            raise IllegalTransition(self._state, event, message)
        return target

    def fire(self, event: Event) -> Transition:
        target = self.check(event)
        transition = Transition(self._state, event, target, self._clock())
        self._state = target
        if event not in (Event.STEP, Event.URGENT_STEP):
            self.history.append(transition)
        for listener in self._listeners:
            listener(transition)
        return transition

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)


def legal_events(state: State) -> list[Event]:
    return [event for (source, event) in TRANSITIONS if source == state]
