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


@dataclass(frozen=True, slots=True)
class Sample:
    t: float
    online: tuple[OnlinePoint, ...]
    contention: float | None


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
                self.samples.append(Sample(t, obs.online, obs.contention))
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
        before = {p.name: p.degradation for p in prev.online}
        for point in obs.online:
            old = before.get(point.name)
            if old and old != point.degradation:
                out.append(Event(t, "degradation", f"{point.name} {old} -> {point.degradation}"))
        if obs.disturbance and not prev.disturbance:
            cpu, gpu, net = obs.disturbance
            out.append(
                Event(t, "disturbance", f"disturbance cpu {cpu:.0%} gpu {gpu:.0%} net {net:.0%}")
            )
        elif prev.disturbance and not obs.disturbance:
            out.append(Event(t, "disturbance", "disturbance over"))
        for name, state in obs.allocation_states.items():
            old = prev.allocation_states.get(name)
            if state == "PREEMPTED" and old not in (None, "PREEMPTED"):
                out.append(Event(t, "preemption", f"{name} preempted"))
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

    def recent_events(self, limit: int = 40) -> list[Event]:
        with self._lock:
            return list(self.events)[-limit:][::-1]

    def miss_ratio(self, now: float, seconds: float) -> float | None:
        """Deadline misses over completions across online intents in the last ``seconds``."""
        with self._lock:
            window = [s for s in self.samples if s.t >= now - seconds and s.online]
        if len(window) < 2:
            return None
        first = {p.name: p for p in window[0].online if p.observed}
        last = {p.name: p for p in window[-1].online if p.observed}
        done = missed = 0
        for name, point in last.items():
            base = first.get(name)
            if base is None or point.completed < base.completed:
                continue
            done += point.completed - base.completed
            missed += max(0, point.misses - base.misses)
        return missed / done if done else None
