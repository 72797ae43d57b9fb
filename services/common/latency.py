"""How PARFusion says "never" for a predicted latency, and how every view writes it.

The allocator predicts ``UNBOUNDED_MS`` for work whose queue would not drain at its units (the
utilisation reaches 1) or that has no unit at all; that value travels in
``Allocation.predicted_p99_ms`` and makes the slack about ``-UNBOUNDED_MS``. Views (the plan
reasons, ``parfusion plan``, the dashboard) write either as infinity, never as the raw number.
"""

from __future__ import annotations

UNBOUNDED_MS = 1e9
# deadlines are at most an hour (3.6e6 ms), so a slack this far below zero is D - UNBOUNDED_MS
_UNBOUNDED_BELOW = UNBOUNDED_MS / 2


def is_unbounded(ms: float) -> bool:
    """Whether a predicted latency (or the slack computed from one) means "never"."""
    return abs(ms) >= _UNBOUNDED_BELOW


def format_ms(ms: float | None, unit: str = " ms") -> str:
    """``12.3 ms``; ``∞ ms`` / ``−∞ ms`` for an unbounded latency or slack; ``-`` for none."""
    if ms is None:
        return "-"
    if is_unbounded(ms):
        return ("∞" if ms > 0 else "−∞") + unit
    return f"{ms:.1f}{unit}"
