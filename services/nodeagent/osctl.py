"""Kernel scheduling controls for one process: affinity, nice, policy, and reading them back.

The one adapter between the agent and the scheduler syscalls (sched_setaffinity,
setpriority, sched_setscheduler) and /proc/<pid>/stat|status. The agent calls it only for
worker processes it started; ownership is checked by the caller, never here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SCHED_POLICIES: dict[str, int] = {
    "other": os.SCHED_OTHER,
    "batch": os.SCHED_BATCH,
    "idle": os.SCHED_IDLE,
}
POLICY_NAMES: dict[int, str] = {v: k for k, v in SCHED_POLICIES.items()}
NICE_MIN, NICE_MAX = -20, 19


@dataclass(frozen=True)
class SchedState:
    """What the kernel reports for a process (from /proc, not from our own bookkeeping)."""

    pid: int
    nice: int
    sched_policy: str
    cpus_allowed: tuple[int, ...]
    last_cpu: int
    threads: int


def set_affinity(pid: int, cpus: tuple[int, ...] | list[int]) -> None:
    os.sched_setaffinity(pid, set(cpus))


def set_nice(pid: int, nice: int) -> None:
    os.setpriority(os.PRIO_PROCESS, pid, max(NICE_MIN, min(NICE_MAX, nice)))


def set_sched_policy(pid: int, policy: str) -> None:
    """SCHED_OTHER, SCHED_BATCH or SCHED_IDLE (all with static priority 0; nice is kept)."""
    os.sched_setscheduler(pid, SCHED_POLICIES[policy], os.sched_param(0))


def online_cpus() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """ "0-2,5" -> (0, 1, 2, 5), the kernel's list format."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(cpus)


def read_sched_state(pid: int, proc: Path = Path("/proc")) -> SchedState:
    """Nice, policy and last CPU from /proc/<pid>/stat; allowed CPUs and threads from status."""
    stat = (proc / str(pid) / "stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # fields[0] is stat field 3 (state)
    status = (proc / str(pid) / "status").read_text()
    cpus: tuple[int, ...] = ()
    threads = 0
    for line in status.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            cpus = parse_cpu_list(line.split(":", 1)[1])
        elif line.startswith("Threads:"):
            threads = int(line.split(":", 1)[1])
    policy = int(fields[38])
    return SchedState(
        pid=pid,
        nice=int(fields[16]),
        sched_policy=POLICY_NAMES.get(policy, str(policy)),
        cpus_allowed=cpus,
        last_cpu=int(fields[36]),
        threads=threads,
    )
