"""The bridge's state as the documents GET /state and the dashboard show (plain functions)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from services.bridge.mission import Mission, UrgentEvent
from services.bridge.statemachine import MISSION_ACTIVE, State, Transition

RECENT_TRANSITIONS = 16  # transitions the state document lists, newest last


def mission_view(mission: Mission | None, state: State, now: float) -> dict[str, Any] | None:
    """The mission's document with whether it runs now, its progress and its elapsed time."""
    if mission is None:
        return None
    view = mission.to_doc()
    view["active"] = mission.live and state in MISSION_ACTIVE | {State.URGENT_TASK_RUNNING}
    view["progress"] = round(mission.step / mission.spec.steps, 4)
    end = mission.ended_at if mission.ended_at is not None else now
    view["elapsed_ms"] = round((end - mission.started_at) * 1000.0, 3)
    return view


def urgent_view(event: UrgentEvent) -> dict[str, Any]:
    """An urgent event's document with its deadline and, once finished, its completion time."""
    view = event.to_doc()
    view["deadline_at"] = event.deadline_at
    if event.finished_at is not None:
        view["completion_ms"] = round((event.finished_at - event.arrived_at) * 1000.0, 3)
    return view


def transitions_view(history: Iterable[Transition]) -> list[dict[str, Any]]:
    """The last RECENT_TRANSITIONS state transitions, oldest first."""
    return [
        {"from": t.source.value, "event": t.event.value, "to": t.target.value, "at": t.at}
        for t in list(history)[-RECENT_TRANSITIONS:]
    ]
