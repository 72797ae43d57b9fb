"""CPU sets written the way cgroup v2 and reasons show them."""

from __future__ import annotations

from collections.abc import Sequence


def format_cpuset(cpus: Sequence[int]) -> str:
    """(0, 1, 2, 3, 6) -> "0-3,6", the cgroup v2 cpuset.cpus syntax."""
    ids = sorted(set(cpus))
    parts: list[str] = []
    start = prev = None
    for cpu in ids:
        if start is None:
            start = prev = cpu
        elif prev is not None and cpu == prev + 1:
            prev = cpu
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = cpu
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts)
