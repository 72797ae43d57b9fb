"""One human-readable reason per intent: why it has its units, from its outcome code.

Each reason code has a %-template naming its arguments; a tick formats one outcome group at a
time and, with the policy's memo, only the rows whose inputs changed since last tick.
"""

from __future__ import annotations

import numpy as np

from services.common.latency import format_ms
from services.core.deadline import offered_load
from services.core.formulas import LATENCY_CEILING_MS
from services.core.memo import LastReasons, TickMemo
from services.core.model import DEGRADATION_ORDER
from services.core.outcome import (
    BATCH_ADMITTED,
    FIXED,
    HELD_DEGRADED,
    IDLE_TIME,
    MET,
    MET_DEGRADED,
    MET_WITH_LEFTOVER,
    NOT_ADMITTED,
    NOTHING_YIELDS,
    POLICY_UNITS,
    REASON_CODES,
    SHARED,
    SHORT,
    UNREACHABLE,
    WAS_PREEMPTED,
    UnitPlan,
)
from services.core.table import IntentTable

_LEVEL_NAMES = np.array(DEGRADATION_ORDER, dtype=object)  # index -> name, one gather per tick


# per reason code: the %-template and the names of its arguments, looked up per tick in
# ``reasons``: a column (gathered at the group's rows; "level" by the names of its codes) or a
# constant ("policy", "light")
_TEMPLATES = {
    MET: ("deadline phase: %d units meet %g ms (pred p99 %.1f ms)", ("need", "deadline", "p99")),
    MET_WITH_LEFTOVER: ("deadline phase: %d units meet %g ms (pred p99 %.1f ms); +%d of the leftover units",
         ("need", "deadline", "p99", "leftover")),
    MET_DEGRADED: ("degraded to %s: %g ms unreachable at %d units at NORMAL; "
                   "%d units meet it at %s (pred p99 %.1f ms)",
                   ("level", "deadline", "cap", "units", "level", "p99")),
    HELD_DEGRADED: ("holding %s: a lighter level would meet %g ms, but not yet with "
                    "margin for long enough; %d units (pred p99 %.1f ms)",
                    ("level", "deadline", "units", "p99")),
    UNREACHABLE: ("at risk: %g ms unreachable even at %d units (%s); running %d units "
                  "(pred p99 %.1f ms)", ("deadline", "cap", "level", "units", "p99")),
    SHORT: ("at risk: needs %d units for %g ms, %d free; running %d",
            ("need", "deadline", "free", "units")),
    NOT_ADMITTED: ("not admitted: needs %d units, %d free", ("min_units", "free")),
    NOTHING_YIELDS: ("throttled: needs %d units for %g ms, %d free, and nothing can yield "
                     "(no preemptible work, no elastic ONLINE/ROBOT work above its minimum; "
                     "idle-time batch holds none); running %d", ("need", "deadline", "free", "units")),
    FIXED: ("%s: holds %d units from its first allocation", ("policy", "units")),
    IDLE_TIME: ("%s: idle-time batch, holds no units", ("policy",)),
    SHARED: ("light: offered load %.3g cores <= %g; runs %d on shared cores, holds no units "
             "(pred p99 %.1f ms for %g ms)", ("load", "light", "units", "p99", "deadline")),
    POLICY_UNITS: ("%s: %d units (pred p99 %.1f ms for %g ms)", ("policy", "units", "p99", "deadline")),
    BATCH_ADMITTED: ("%s: %d units (next-unit nmu %.3g)", ("policy", "units", "nmu")),
}  # fmt: skip
# an unbounded p99 as the templates (%.1f) write it, and as every view writes it
_UNBOUNDED_P99 = (
    f"pred p99 {LATENCY_CEILING_MS:.1f} ms",
    f"pred p99 {format_ms(LATENCY_CEILING_MS)}",
)


def reasons(
    table: IntentTable,
    plan: UnitPlan,
    policy: str,
    light_load_cores: float,
    memo: TickMemo | None = None,
) -> list[str]:
    """One human-readable reason per intent, from the outcome code and the numbers behind it.

    Built one outcome group at a time (the groups are slices of one stable sort by code), each
    group's strings by one %-template mapped over its columns (C-level formatting), scattered
    back by index. With `memo`, a row whose code and template columns all equal last tick's
    for the same intent (matched by id, so intents added or dropped since do not disturb the
    others) keeps last tick's text and only the other rows are formatted: at 10,000 intents
    the formatting is a visible part of the tick.
    """
    n = table.n
    units, need = plan.units, plan.need
    lost = plan.preempted_units
    outcome = np.where(lost > 0, WAS_PREEMPTED, plan.outcome)
    outcome[(outcome == BATCH_ADMITTED) & (units == 0)] = NOT_ADMITTED
    outcome[(outcome == IDLE_TIME) & (units > 0)] = BATCH_ADMITTED
    outcome[(outcome == BATCH_ADMITTED) & table.has_deadline] = POLICY_UNITS
    outcome[(outcome == MET) & (units > need)] = MET_WITH_LEFTOVER
    # every column a template may read: what a row's text depends on, with its code
    columns = {
        "code": outcome, "units": units, "need": need, "leftover": units - need,
        "level": plan.level, "p99": plan.predicted_p99_ms, "deadline": table.deadline,
        "cap": table.cap, "free": plan.free_at_ask, "min_units": table.min_units,
        "nmu": plan.nmu, "load": offered_load(table),
    }  # fmt: skip
    constants = {"policy": policy, "light": light_load_cores}
    last = memo.reasons if memo is not None else None
    kept = last.kept(table.ids, columns, constants) if last is not None else None
    if kept is None:
        texts = np.empty(n, dtype=object)
        rows = np.arange(n)
    else:
        changed, texts = kept
        # preempted rows name their preemptor (a spec name): always formatted again
        rows = (changed | (outcome == WAS_PREEMPTED)).nonzero()[0]
    if rows.size:  # none in a tick where every text is kept
        shifted = outcome[rows] - REASON_CODES.start
        counts = np.bincount(shifted, minlength=len(REASON_CODES)).tolist()
        by_code = rows[np.argsort(shifted, kind="stable")]  # each group's rows in ascending order
        at = 0
        for code, count in zip(REASON_CODES, counts, strict=True):
            if not count:
                continue
            idx = by_code[at : at + count]
            at += count
            if code == WAS_PREEMPTED:
                spec_names = [sp.name for sp in table.specs]
                texts[idx] = [
                    f"preempted: {gone} units taken by urgent {spec_names[by] if by >= 0 else 'work'}"
                    + (f"; running {left} (its minimum)" if left else "")
                    for gone, by, left in zip(
                        lost[idx].tolist(),
                        plan.preempted_by[idx].tolist(),
                        units[idx].tolist(),
                        strict=True,
                    )
                ]
                continue
            template, names = _TEMPLATES[code]
            args = []
            for name in names:
                if name in constants:
                    args.append([constants[name]] * count)
                elif name == "level":
                    args.append(_LEVEL_NAMES[plan.level[idx]].tolist())
                else:
                    args.append(columns[name][idx].tolist())
            texts[idx] = list(map(template.__mod__, zip(*args, strict=True)))
        # "never" reads as infinity, as in every view, not as the sentinel's digits
        for i in rows[plan.predicted_p99_ms[rows] >= LATENCY_CEILING_MS].tolist():
            texts[i] = texts[i].replace(*_UNBOUNDED_P99)
    if memo is not None:
        texts.flags.writeable = False  # kept for the next tick, which copies it
        memo.reasons = LastReasons(columns, texts, constants, table.ids)
    return texts.tolist()
