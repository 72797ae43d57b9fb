"""Plan changes and flaps between two consecutive plans."""

from __future__ import annotations

from services.core.model import Decision
from services.core.stability import PlanChanges, plan_changes, window_ticks


def test_a_change_within_the_window_of_the_last_one_is_a_flap() -> None:
    assert window_ticks(0.25) == 20 and window_ticks(10.0) == 1
    before = {
        "a": Decision("a", 3, since_tick=90, level_since_tick=10),  # units moved 10 ticks ago
        "b": Decision("b", 2, since_tick=50, level_since_tick=50),  # 50 ticks ago
        "c": Decision("c", 1, degradation="FP16", since_tick=5, level_since_tick=95),
        "d": Decision("d", 4),
    }
    after = [
        Decision("a", 2, since_tick=100),
        Decision("b", 3, since_tick=100),
        Decision("c", 1, degradation="NORMAL", since_tick=5, level_since_tick=100),
        before["d"],  # the very same decision: unchanged
        Decision("e", 1),  # new to the plan: not a change
    ]
    changes = plan_changes(before, after, tick=100, window=20)
    assert changes == PlanChanges(units=2, levels=1, flaps=2, flapping=("a", "c"))
    assert plan_changes(before, after, tick=100, window=5).flaps == 0
