"""How stable a plan is: changes of units and degradation level, and the ones that flap.

A flap is a change of an intent's units or level that comes less than a stability window (5 s
by default) after its previous change. Every caller that ticks a policy counts them the same
way from two consecutive plans (the Decisions' since_tick / level_since_tick say when each
intent's units and level last changed): the allocator's loop as Prometheus counters, the
modeled experiments and the stability run in their reports. Pure: ticks, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from services.core.model import Decision

STABLE_S = 5.0  # no intent should change its units or level more than once in this long


@dataclass(frozen=True, slots=True)
class PlanChanges:
    units: int = 0  # intents whose units changed
    levels: int = 0  # intents whose degradation level changed
    flaps: int = 0  # of those changes, the ones within the window after the intent's last change
    flapping: tuple[str, ...] = ()  # the ids of the intents that flapped


def window_ticks(tick_s: float, stable_s: float = STABLE_S) -> int:
    """The stability window in ticks (at least one)."""
    return max(1, round(stable_s / tick_s))


def plan_changes(
    previous: Mapping[str, Decision], decisions: Iterable[Decision], tick: int, window: int
) -> PlanChanges:
    """What changed from `previous` (by intent id) to `decisions`, made at `tick`; intents new
    to the plan are not changes."""
    units = levels = flaps = 0
    flapping: list[str] = []
    for d in decisions:
        p = previous.get(d.intent_id)
        if p is None or p is d:
            continue
        moved_units = d.units != p.units
        moved_level = d.degradation != p.degradation
        if not (moved_units or moved_level):
            continue
        units += moved_units
        levels += moved_level
        if tick - max(p.since_tick, p.level_since_tick) < window:
            flaps += 1
            flapping.append(d.intent_id)
    return PlanChanges(units, levels, flaps, tuple(flapping))
