"""What a unit allocation says about each intent: state, outcome and reason codes, UnitPlan.

STATE codes index STATE_NAMES (the Decision's state). OUTCOME codes say why an intent has its
units (D-MUG's phases set them); the cross-layer step refines two cases into reason codes of
their own before it writes the reason text. Every code is named here, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# UnitPlan.state codes (index into STATE_NAMES)
ADMITTED, THROTTLED, DEGRADED, PREEMPTED = 0, 1, 2, 3
STATE_NAMES = ("ADMITTED", "THROTTLED", "DEGRADED", "PREEMPTED")

# UnitPlan.outcome codes: why the intent has its units (drives the human-readable reason)
MET = 0  # the deadline phase's units meet the deadline at NORMAL
MET_DEGRADED = 1  # met only down the degradation ladder
UNREACHABLE = 2  # missed even at the cap (at risk, best effort)
SHORT = 3  # would meet, but not enough units were free when it asked
BATCH_ADMITTED = 4  # admitted at its minimum (plus what the marginal phase gives)
NOT_ADMITTED = 5  # its minimum did not fit
WAS_PREEMPTED = 6  # urgent work took its units
FIXED = 7  # non-elastic: keeps the units of its first allocation
HELD_DEGRADED = 8  # NORMAL (or a lighter level) would meet, but the degraded level is held
SHARED = 9  # light deadline work: its workers run on shared cores, charged by offered load
IDLE_TIME = 10  # preemptible elastic batch: no units, idle-time workers under SCHED_IDLE
NOTHING_YIELDS = 11  # URGENT short of its minimum: no work holds units it could yield
# reason codes beyond the outcomes (set by the cross-layer step, for the reason text only)
MET_WITH_LEFTOVER = 12  # MET, and the marginal phase gave it more than it needed
POLICY_UNITS = 13  # deadline work a policy without a deadline phase gave units
REASON_CODES = range(14)  # every code a reason can have


@dataclass
class UnitPlan:
    """Per-intent outcome of the unit allocation, as columns aligned with IntentTable."""

    units: np.ndarray
    level: np.ndarray  # index into DEGRADATION_ORDER
    state: np.ndarray  # index into STATE_NAMES
    outcome: np.ndarray  # MET, MET_DEGRADED, ... (why; drives the reason text)
    need: np.ndarray  # units the deadline phase asked for (0 for batch)
    preempted_units: np.ndarray
    preempted_by: np.ndarray  # table index of the urgent intent that took the units, -1 if none
    order: np.ndarray  # deadline-phase order (least slack first), table indexes
    free_at_ask: np.ndarray  # free units when the intent asked and did not get them
    predicted_p99_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    slack_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    risk: np.ndarray = field(default_factory=lambda: np.zeros(0))
    nmu: np.ndarray = field(default_factory=lambda: np.zeros(0))
    preemptions: int = 0
    shared: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # light work
    shared_reserve: int = 0  # units set aside for the light work's summed offered load
