"""What the guided demo changed, and putting it back when the demo stops or finishes.

The demo records each change as it makes it (the policy that was active before its first
SetPolicy, the mission it started, the disturbance the node accepted). :func:`restore` undoes
exactly those, through the same service APIs, and returns one line per change saying what the
services report afterwards; a change the demo did not make is never touched (a mission someone
else started keeps running).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.dashboard.clients import ActionError, ServiceClients

# Robot states in which the demo's mission still holds the robot (bridge statemachine).
MISSION_HELD = {"RUNNING", "CHECKPOINTING", "PREEMPTED", "RESUMING", "COMPENSATING"}
URGENT = "URGENT_TASK_RUNNING"
# A zero-pressure disturbance this short replaces the demo's and is gone at once.
CLEAR_S = 0.01


@dataclass
class DemoChanges:
    policy_before: str = ""  # active before the demo's first SetPolicy ("" = none made)
    mission_id: str = ""  # the mission the demo started ("" = none)
    disturbance: bool = False  # the node accepted the demo's disturbance

    @property
    def any(self) -> bool:
        return bool(self.policy_before or self.mission_id or self.disturbance)


async def restore(clients: ServiceClients, changes: DemoChanges, urgent_ticks: int) -> list[str]:
    """Undo ``changes``; ``urgent_ticks`` bounds the ticks spent letting an urgent task finish."""
    lines: list[str] = []
    if changes.disturbance:
        lines.append(await _clear_disturbance(clients))
    if changes.mission_id:
        lines.append(await _end_mission(clients, changes.mission_id, urgent_ticks))
    if changes.policy_before:
        lines.append(await _restore_policy(clients, changes.policy_before))
    return [f"restored: {line}" for line in lines]


async def _disturbance_left(clients: ServiceClients) -> float | None:
    reading = await clients.node_telemetry()
    if not reading.ok or reading.value is None:
        return None
    return float(reading.value.telemetry.disturbance_remaining_s)


async def _clear_disturbance(clients: ServiceClients) -> str:
    left = await _disturbance_left(clients)
    if left is not None and left <= 0:
        return "disturbance over (the node reports none active)"
    try:
        await clients.inject_disturbance(
            cpu=0.0, gpu=0.0, network=0.0, duration_s=CLEAR_S, source="guided-demo-restore"
        )
    except ActionError as exc:
        return f"disturbance not cleared: {exc}"
    left = await _disturbance_left(clients)
    if left is None:
        return "disturbance cleared; the node did not answer the check"
    if left > CLEAR_S:
        return f"disturbance still active: the node reports {left:.1f} s left"
    return "disturbance cleared (the node reports none active)"


def _mission(state: Any) -> dict[str, Any]:
    mission = state.get("mission") if isinstance(state, dict) else None
    return mission if isinstance(mission, dict) else {}


def _steps(mission: dict[str, Any]) -> str:
    return f"step {mission.get('step')} of {(mission.get('spec') or {}).get('steps')}"


async def _end_mission(clients: ServiceClients, mission_id: str, urgent_ticks: int) -> str:
    reading = await clients.bridge_state()
    if not reading.ok or not isinstance(reading.value, dict):
        return f"mission not checked: {reading.error}"
    state = reading.value
    # An urgent task is never cut short: tick until it is done, then the robot can let go.
    for _ in range(urgent_ticks):
        if state.get("state") != URGENT and not (state.get("urgent") or {}).get("queue"):
            break
        try:
            state = await clients.bridge_post("/api/tick", {})
        except ActionError as exc:
            return f"mission kept: the urgent task could not finish ({exc})"
    mission = _mission(state)
    if mission.get("id") != mission_id:
        return "mission: the bridge holds another mission now, left as it is"
    steps = _steps(mission)
    robot = state.get("state")
    if robot == URGENT:
        return f"mission kept at {steps}: the urgent task still runs after {urgent_ticks} ticks"
    if robot not in MISSION_HELD:
        return f"mission ended by itself ({robot}, {steps})"
    try:
        ended = await clients.bridge_delete("/api/mission")
    except ActionError as exc:
        return f"mission still {robot} at {steps}: cancel failed ({exc})"
    return f"mission cancelled at {steps}; robot {ended.get('state', '?')}"


async def _restore_policy(clients: ServiceClients, before: str) -> str:
    listing = await clients.list_policies()
    active = listing.value.active if listing.ok and listing.value is not None else ""
    if active == before:
        return f"policy {before}, as before the demo"
    try:
        reply = await clients.set_policy(before)
    except ActionError as exc:
        return f"policy {active or '?'} kept: SetPolicy {before} failed ({exc})"
    return f"policy {reply.active} (was {reply.previous or 'none'})"


async def observed_recovery(clients: ServiceClients) -> list[str]:
    """What the node and the bridge report as the recovery stage begins (no claims)."""
    lines: list[str] = []
    left = await _disturbance_left(clients)
    if left is None:
        lines.append("node agent did not answer: disturbance state unknown")
    elif left > 0:
        lines.append(f"node reports the disturbance active for {left:.1f} s more")
    else:
        lines.append("node reports no disturbance active")
    reading = await clients.bridge_state()
    if not reading.ok or not isinstance(reading.value, dict):
        lines.append(f"robot state unknown: {reading.error}")
        return lines
    mission = _mission(reading.value)
    detail = ""
    if mission:
        detail = f", mission {_steps(mission)}"
        if mission.get("steps_redone"):
            detail += f" ({mission['steps_redone']} steps redone after the checkpoint)"
    lines.append(f"robot {reading.value.get('state')}{detail}")
    return lines
