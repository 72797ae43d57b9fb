"""What the dashboard remembers between polls: latency samples, events, robot state transitions.

The observer turns each poll into an :class:`Observation` (plain data) and hands it to
:meth:`Timeline.update`, which appends a latency sample and records every change worth marking on
the chart: policy (mode) changes, degradation steps, disturbances starting and ending, robot state
transitions, allocations preempted, services going down and coming back. The guided demo and the
manual buttons add their own events with :meth:`Timeline.note`. Bounded deques, no I/O, no clock
of its own (times are passed in), so tests drive it directly.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class OnlinePoint:
    """One online intent at one poll: observed tail latency (or the prediction before any)."""

    name: str
    p99_ms: float
    predicted_p99_ms: float
    deadline_ms: float
    completed: int = 0
    misses: int = 0
    degradation: str = "NORMAL"
    observed: bool = False


@dataclass(frozen=True, slots=True)
class Observation:
    policy: str | None = None
    online: tuple[OnlinePoint, ...] = ()
    contention: float | None = None
    disturbance: tuple[float, float, float] | None = None  # cpu, gpu, network while active
    robot_state: str | None = None
    # (at, from, to) as the bridge recorded them: exact even when a state lasts less than a poll
    robot_transitions: tuple[tuple[float, str, str], ...] = ()
    services_up: dict[str, bool] = field(default_factory=dict)
    allocation_states: dict[str, str] = field(default_factory=dict)
    # every online intent, where `online` holds only the charted ones: its degradation level,
    # and its (completed, missed) counters once observed
    levels: dict[str, str] = field(default_factory=dict)
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)
    online_total: int = 0  # online intents on the node (`online` may chart fewer)


@dataclass(frozen=True, slots=True)
class Sample:
    t: float
    online: tuple[OnlinePoint, ...]
    contention: float | None
    # requests completed and deadlines missed since the sample before, over every online
    # intent (charted or not); an intent whose counters went back (restarted) adds nothing
    done: int = 0
    missed: int = 0


@dataclass(frozen=True, slots=True)
class Event:
    t: float
    kind: str  # policy, stage, urgent, disturbance, degradation, robot, preemption, service, action
    label: str


@dataclass(frozen=True, slots=True)
class RobotSpan:
    state: str
    start: float


class Timeline:
    def __init__(self, *, max_samples: int = 600, max_events: int = 300) -> None:
        self._lock = threading.Lock()
        self.samples: deque[Sample] = deque(maxlen=max_samples)
        self.events: deque[Event] = deque(maxlen=max_events)
        self.robot: deque[RobotSpan] = deque(maxlen=max_events)
        self._last: Observation | None = None
        self._last_transition_at = 0.0

    def note(self, t: float, kind: str, label: str) -> Event:
        event = Event(t, kind, label)
        with self._lock:
            self.events.append(event)
        return event

    def update(self, t: float, obs: Observation) -> list[Event]:
        """Append a sample and return the events this observation revealed (already recorded)."""
        with self._lock:
            prev = self._last
            self._last = obs
            if obs.online or obs.contention is not None:
                done, missed = _progress(prev, obs)
                self.samples.append(Sample(t, obs.online, obs.contention, done, missed))
            found = list(self._changes(t, prev, obs))
            found.extend(self._robot(t, prev, obs))
            found.sort(key=lambda e: e.t)
            self.events.extend(found)
        return found

    def _robot(self, t: float, prev: Observation | None, obs: Observation) -> list[Event]:
        out: list[Event] = []
        fresh = [tr for tr in obs.robot_transitions if tr[0] > self._last_transition_at]
        if fresh:
            for at, source, target in sorted(fresh):
                self._last_transition_at = at
                if source == target:
                    continue
                if not self.robot or self.robot[-1].state != source:
                    self.robot.append(RobotSpan(source, min(at, t)))
                self.robot.append(RobotSpan(target, at))
                out.append(Event(at, "robot", f"robot {source} -> {target}"))
        elif (
            obs.robot_state
            and not obs.robot_transitions
            and prev
            and prev.robot_state
            and prev.robot_state != obs.robot_state
        ):
            out.append(Event(t, "robot", f"robot {prev.robot_state} -> {obs.robot_state}"))
        if obs.robot_state and (not self.robot or self.robot[-1].state != obs.robot_state):
            self.robot.append(RobotSpan(obs.robot_state, t))
        return out

    @staticmethod
    def _changes(t: float, prev: Observation | None, obs: Observation) -> list[Event]:
        out: list[Event] = []
        if prev is None:
            if obs.policy:
                out.append(Event(t, "policy", f"policy {obs.policy}"))
            return out
        if obs.policy and prev.policy and obs.policy != prev.policy:
            out.append(Event(t, "policy", f"policy {prev.policy} -> {obs.policy}"))
        before = prev.levels
        moved = [
            f"{name} {before[name]} -> {level}"
            for name, level in obs.levels.items()
            if before.get(name) and before[name] != level
        ]
        out.extend(_named(t, "degradation", moved, "changed level"))
        if obs.disturbance and not prev.disturbance:
            cpu, gpu, net = obs.disturbance
            out.append(
                Event(t, "disturbance", f"disturbance cpu {cpu:.0%} gpu {gpu:.0%} net {net:.0%}")
            )
        elif prev.disturbance and not obs.disturbance:
            out.append(Event(t, "disturbance", "disturbance over"))
        preempted = [
            f"{name} preempted"
            for name, state in obs.allocation_states.items()
            if state == "PREEMPTED" and prev.allocation_states.get(name) not in (None, "PREEMPTED")
        ]
        out.extend(_named(t, "preemption", preempted, "preempted"))
        for service, up in obs.services_up.items():
            was = prev.services_up.get(service)
            if was is True and not up:
                out.append(Event(t, "service", f"{service} down"))
            elif was is False and up:
                out.append(Event(t, "service", f"{service} back"))
        return out

    def window(
        self, now: float, seconds: float
    ) -> tuple[list[Sample], list[Event], list[RobotSpan]]:
        """Samples, events and robot spans within the last ``seconds`` (spans clipped at start)."""
        start = now - seconds
        with self._lock:
            samples = [s for s in self.samples if s.t >= start]
            events = sorted((e for e in self.events if e.t >= start), key=lambda e: e.t)
            spans = sorted(self.robot, key=lambda s: s.start)
        visible = [s for s in spans if s.start >= start]
        earlier = [s for s in spans if s.start < start]
        if earlier:
            visible.insert(0, RobotSpan(earlier[-1].state, start))
        return samples, events, visible

    def last(self) -> Observation | None:
        """The latest observation."""
        with self._lock:
            return self._last

    def recent_events(self, limit: int = 40) -> list[Event]:
        with self._lock:
            return list(self.events)[-limit:][::-1]

    def miss_ratio(self, now: float, seconds: float) -> float | None:
        """Deadline misses over completions across online intents in the last ``seconds``
        (the progress of each sample after the window's first)."""
        with self._lock:
            window = [s for s in self.samples if s.t >= now - seconds and s.online]
        if len(window) < 2:
            return None
        done = sum(s.done for s in window[1:])
        missed = sum(s.missed for s in window[1:])
        return missed / done if done else None


NAMED_EVENTS = 5  # events naming an intent per kind and poll; the rest are one counted event


def _named(t: float, kind: str, labels: list[str], what: str) -> list[Event]:
    """One event per label, at most NAMED_EVENTS, then one for the rest: on a node with
    thousands of intents one poll must not push every other event out of the timeline."""
    out = [Event(t, kind, label) for label in labels[:NAMED_EVENTS]]
    rest = len(labels) - NAMED_EVENTS
    if rest > 0:
        out.append(Event(t, kind, f"{rest:,} more intents {what}"))
    return out


def _progress(prev: Observation | None, obs: Observation) -> tuple[int, int]:
    """Requests completed and deadlines missed between two observations, summed over the
    online intents observed in both."""
    if prev is None:
        return 0, 0
    before = prev.counts
    done = missed = 0
    for name, (completed, misses) in obs.counts.items():
        base = before.get(name)
        if base is None or completed < base[0]:
            continue
        done += completed - base[0]
        missed += max(0, misses - base[1])
    return done, missed
