"""D-MUG's deadline phase: the fewest units that meet each deadline, and who gets them.

``units_to_meet`` inverts the latency formula; ``walk_ladder`` tries ONLINE work's degraded
levels where NORMAL misses; ``hold_levels`` keeps a level from flapping; ``deadline_first_fit``
grants the asks in order when units are scarce, URGENT taking units from preemptible work and
from elastic deadline work above its minimum. Light work
(``light_work``) holds no units: it runs on shared cores, charged by its offered load.
"""

from __future__ import annotations

import numpy as np

from services.core.columns import ONLINE, ROBOT, URGENT
from services.core.formulas import MAX_UTILISATION
from services.core.model import DmugConfig
from services.core.outcome import (
    HELD_DEGRADED,
    MET,
    MET_DEGRADED,
    NOTHING_YIELDS,
    SHORT,
    UNREACHABLE,
)
from services.core.table import IntentTable

LEVEL_MARGIN = 0.1  # a lighter level must meet (1 - margin) x deadline before it is taken back
# a step up that failed (left again for a deeper level while on probation) doubles the dwell
# before the next one, up to dwell x 2**4 (80 s with the default 5 s dwell)
MAX_LEVEL_BACKOFF = 4
_AT_AND_BELOW = np.array([[0], [1]])  # p - this: the rows p and p - 1


def units_to_meet(
    table: IntentTable, idx: np.ndarray, level: int | np.ndarray, scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Fewest units in [min, cap] with L(p) <= D at `level` (one for all rows, or one per row),
    and whether that meets D at all (D = scale x deadline; scale < 1 asks for a margin).

    Closed form from L = a / (S - b) (a = T1*m, b = lambda*M1*m/1000): S(p) >= b + a/D, inverted
    through Amdahl, then checked and nudged with the latency formula itself so that the answer
    is exactly what ``predicted_latency_ms`` says.
    """
    r = table.take(idx)
    if scale != 1.0:
        r.deadline = r.deadline * scale
    lf = table.level_factor[level]
    factor = r.inflation * lf
    a = r.tail1 * factor
    b = r.arrival * r.mean1 * factor / 1000.0
    d = np.maximum(r.deadline, 1e-9)
    f = r.f
    s_req = np.maximum(b / MAX_UTILISATION, b + a / d)
    denom = 1.0 / s_req - (1.0 - f)
    with np.errstate(divide="ignore", invalid="ignore"):
        p_real = np.where(denom > 0, f / np.where(denom > 0, denom, 1.0), np.inf)
    lo, hi = table.min_units[idx], r.cap
    p = np.minimum(np.maximum(np.ceil(np.minimum(p_real, 1e12)), lo), np.maximum(hi, lo))
    p = np.where(f <= 0.0, lo, p)  # no parallel part: every p has the latency of the minimum
    p = p.astype(np.int64)
    lat, below = r.latency(p - _AT_AND_BELOW, lf)  # L(p) and L(p - 1), in one evaluation
    for _ in range(2):
        late = (lat > r.deadline) & (p < hi)
        if not np.count_nonzero(late):
            break
        p = p + late
        lat, below = r.latency(p - _AT_AND_BELOW, lf)
    early = (p > lo) & (below <= r.deadline)
    p = p - early
    meets = (early | (lat <= r.deadline)) & (p <= hi)
    return p, meets


def offered_load(table: IntentTable) -> np.ndarray:
    """Cores' worth of work each intent brings: arrival rate x mean service at one unit."""
    load: np.ndarray = table.arrival * table.mean1 * table.inflation / 1000.0
    return load


def light_work(table: IntentTable, config: DmugConfig, load: np.ndarray) -> np.ndarray:
    """Deadline work too light to hold whole units: an offered load of at most
    config.light_load_cores (a rare urgent event, a heartbeat) and its deadline met at its
    minimum (load: offered_load(table)). A unit each would idle nearly all the time and
    starve the work that needs it."""
    candidate = table.has_deadline & (table.arrival > 0) & (load <= config.light_load_cores)
    if not np.count_nonzero(candidate):
        return candidate
    idx = candidate.nonzero()[0]
    meets = table.latency(idx, table.min_units[idx], 0) <= table.deadline[idx]
    candidate[idx[~meets]] = False
    return candidate


def walk_ladder(
    table: IntentTable, dl: np.ndarray, degrade: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Units each deadline row dl needs at NORMAL and, for ONLINE work that misses even at its
    cap, down its degradation ladder (FP16, then INT8) until a level meets; the deepest allowed
    level tried is kept when none does (best effort). Returns (need, meets, level) per row.

    Every level a row may walk to is evaluated in one units_to_meet call (NORMAL for every row,
    a deeper level for each ONLINE row whose ladder allows it), so a tick pays for one call
    instead of up to three; each row's answer is the one a call of its own would give.
    """
    at_level = [np.arange(dl.size)]  # positions into dl evaluated at level 0, 1, 2
    if degrade:
        online = table.cls[dl] == ONLINE
        at_level += [(online & table.ladder[dl, level_i]).nonzero()[0] for level_i in (1, 2)]
    pos = np.concatenate(at_level)
    levels = np.repeat(np.arange(len(at_level)), [a.size for a in at_level])
    p_all, m_all = units_to_meet(table, dl[pos], levels)
    p_need, meets = p_all[: dl.size], m_all[: dl.size]
    lvl = np.zeros(dl.size, dtype=np.int64)
    start = dl.size
    for level_i, rows in enumerate(at_level[1:], start=1):
        end = start + rows.size
        walk = ~meets[rows]  # rows that still miss: they try this level
        idx = rows[walk]
        if idx.size:
            p2, m2 = p_all[start:end][walk], m_all[start:end][walk]
            p_need[idx] = np.where(m2, p2, p_need[idx])
            lvl[idx] = level_i
            meets[idx] = m2
        start = end
    return p_need, meets, lvl


def probe_ticks(config: DmugConfig) -> int:
    """How long a step up is on probation: left for a deeper level within this many ticks of
    being taken, it failed. Four dwells (20 s by default): the node's latency window (the
    agent's last 10 s) must fill with the new level's requests, and queues that build at the
    lighter level show in the tail only after that."""
    return 4 * config.hysteresis_dwell_ticks


def step_up_dwell(backoff: np.ndarray, config: DmugConfig) -> np.ndarray:
    """Ticks at the current level before a step up, per row of ``Decision.level_backoff``: the
    dwell, doubled for each step up that failed in a row."""
    return np.asarray(config.hysteresis_dwell_ticks << np.minimum(backoff, MAX_LEVEL_BACKOFF))


def level_state(
    table: IntentTable, level: np.ndarray, tick: int, config: DmugConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``Decision.level_backoff`` and ``level_raised`` once this tick's levels are
    chosen. A step up left for a deeper level while on probation failed: the backoff grows by
    one (at most MAX_LEVEL_BACKOFF). One that held through its probation succeeded: the backoff
    falls by one (not to 0: where the lighter level holds for a while and then fails again, the
    failures still lengthen the wait). Without this, a lighter level that the model predicts to
    meet but the node does not would be tried again after every dwell, a change of level every
    few seconds."""
    has = table.has_prev
    backoff = np.where(has, table.prev_level_backoff, 0)
    raised = has & table.prev_level_raised
    on_probation = raised & (tick - table.prev_level_since < probe_ticks(config))
    deeper = has & (level > table.prev_level)
    lighter = has & (level < table.prev_level)
    held = ~(deeper | lighter)
    backoff = np.where(deeper & on_probation, np.minimum(backoff + 1, MAX_LEVEL_BACKOFF), backoff)
    passed = held & raised & ~on_probation  # counted once: raised is cleared with it
    backoff = np.where(passed, np.maximum(backoff - 1, 0), backoff)
    raised = np.where(lighter, True, np.where(deeper | passed, False, raised))
    return backoff, raised


def hold_levels(
    table: IntentTable,
    dl: np.ndarray,
    lvl: np.ndarray,
    p_need: np.ndarray,
    meets: np.ndarray,
    code: np.ndarray,
    tick: int,
    config: DmugConfig,
) -> None:
    """Hysteresis on the degradation level (in place, over the deadline rows dl).

    A deeper level than last tick's is taken at once (the deadline is at risk). A lighter one is
    taken only one step at a time, after dwell ticks at the current level (doubled for each
    failed step up, ``step_up_dwell``), and only when that step meets (1 - LEVEL_MARGIN) x
    deadline; otherwise the previous level is held. This keeps a level from flapping on every
    tick around the point where the lighter level just meets.
    """
    prev = table.prev_level[dl]
    allowed = table.ladder[dl]
    prev = np.where(allowed[np.arange(dl.size), prev], prev, 0)
    lighter = (meets & (prev > lvl) & (table.cls[dl] == ONLINE)).nonzero()[0]
    if lighter.size == 0:
        return
    rows = dl[lighter]
    wait = step_up_dwell(table.prev_level_backoff[rows], config)
    dwelt = (tick - table.prev_level_since[rows]) >= wait
    # one step: the deepest allowed level below the previous one (at least the one that meets)
    step = lvl[lighter].copy()
    for candidate in (1, 0):
        ok = allowed[lighter, candidate] & (candidate < prev[lighter]) & (candidate > step)
        step = np.where(ok, candidate, step)
    hold = prev[lighter].copy()
    hold_need = p_need[lighter].copy()
    for level_i in (0, 1, 2):
        sel = (hold == level_i).nonzero()[0]
        if sel.size:
            hold_need[sel], _ = units_to_meet(table, dl[lighter[sel]], level_i)
    take = np.zeros(lighter.size, dtype=bool)
    take_need = hold_need.copy()
    for level_i in (0, 1):
        sel = (dwelt & (step == level_i)).nonzero()[0]
        if sel.size:
            p, m = units_to_meet(table, dl[lighter[sel]], level_i, 1.0 - LEVEL_MARGIN)
            take[sel] = m
            take_need[sel] = p
    lvl[lighter] = np.where(take, step, hold)
    p_need[lighter] = np.where(take, take_need, hold_need)
    code[lighter] = np.where(lvl[lighter] == 0, MET, np.where(take, MET_DEGRADED, HELD_DEGRADED))


def deadline_first_fit(
    table: IntentTable,
    preempt: bool,
    order: np.ndarray,
    units: np.ndarray,
    need: np.ndarray,
    free: int,
    outcome: np.ndarray,
    preempted: np.ndarray,
    preempted_by: np.ndarray,
    free_at_ask: np.ndarray,
) -> int:
    """The scarce deadline phase: in order, grant what fits; URGENT takes units; the rest is short.

    An URGENT intent that does not fit takes units from what can yield, in this order:
    preemptible non-URGENT intents (batch first, then lowest weight, newest first; a victim loses
    all its units: below its minimum it could not run anyway), then elastic ONLINE/ROBOT work
    above its minimum (lowest weight, newest first; it keeps its minimum). Idle-time batch holds
    no units and yields its cycles by itself (SCHED_IDLE). It takes enough for its need when
    that much can yield, else enough for its minimum; when not even that can yield it is short
    with outcome NOTHING_YIELDS.
    """
    victims_order = np.lexsort((-table.seq, table.weight, table.has_deadline))
    can_lose = table.preemptible & (table.cls != URGENT)
    victims = victims_order[can_lose[victims_order]].tolist()
    # elastic deadline work that may give up what it holds above its minimum
    can_shrink = (
        table.elastic
        & ~can_lose
        & table.has_deadline
        & ((table.cls == ONLINE) | (table.cls == ROBOT))
    )
    shrinkers = victims_order[can_shrink[victims_order]].tolist()
    is_victim = can_lose.tolist()
    is_urgent = (table.cls == URGENT).tolist()
    u = units.tolist()
    want = need.tolist()
    lost = preempted.tolist()
    by = preempted_by.tolist()
    min_units = table.min_units.tolist()
    code = outcome.tolist()  # plain lists: this loop touches thousands of rows when scarce
    asked_at = free_at_ask.tolist()
    reclaimable = int(units[can_lose].sum())
    cursor = 0
    for i in order.tolist():
        if lost[i]:
            continue
        e = want[i] - u[i]
        if e <= 0:
            continue
        if e > free and preempt and is_urgent[i]:
            own = u[i] if is_victim[i] else 0
            above_min = sum(max(u[v] - min_units[v], 0) for v in shrinkers if v != i)
            can_yield = free + reclaimable - own + above_min
            # its need when that much can yield, else its minimum
            goal = e if can_yield >= e else max(min_units[i] - u[i], 0)
            if 0 < goal <= can_yield:
                # one pass from a cursor, a second from the start for victims that gained units
                # after the cursor passed them
                for begin in (cursor, 0):
                    k = begin
                    while free < goal and k < len(victims):
                        v = victims[k]
                        k += 1
                        if v != i and u[v] > 0:
                            free += u[v]
                            reclaimable -= u[v]
                            lost[v] += u[v]
                            by[v] = i
                            u[v] = 0
                    if begin == cursor:
                        cursor = k
                    if free >= goal:
                        break
                for v in shrinkers:
                    if free >= goal:
                        break
                    give = min(u[v] - min_units[v], goal - free)
                    if v != i and give > 0:
                        free += give
                        lost[v] += give
                        by[v] = i
                        u[v] -= give
            elif goal > can_yield:
                code[i] = NOTHING_YIELDS
        if e <= free:
            u[i] += e
            free -= e
            if is_victim[i]:
                reclaimable += e
            continue
        asked_at[i] = free
        if code[i] not in (UNREACHABLE, NOTHING_YIELDS):
            code[i] = SHORT
        if u[i] == 0 and min_units[i] <= free:
            u[i] = min_units[i]
            free -= u[i]
            if is_victim[i]:
                reclaimable += u[i]
    units[:] = u
    preempted[:] = lost
    preempted_by[:] = by
    outcome[:] = code
    free_at_ask[:] = asked_at
    return free
