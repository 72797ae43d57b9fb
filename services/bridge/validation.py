"""Validation of robot requests (missions, urgent events, ticks): the first broken rule names its field.

The same parsers serve the HTTP API and the ROS 2 urgent-event topic, so both sources accept
exactly the same documents. Unknown fields are refused so a typo never silently falls back to
a default.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from services.common.errors import InvalidArgument

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_STEPS = 1_000_000
MAX_DEADLINE_MS = 3_600_000.0  # the allocator's own upper bound for a deadline
MAX_URGENT_WORK = 100_000
MAX_TICKS_PER_CALL = 10_000


@dataclass(frozen=True, slots=True)
class MissionSpec:
    name: str
    steps: int
    safe_point_interval: int
    deadline_ms: float  # 0 = no deadline


@dataclass(frozen=True, slots=True)
class UrgentSpec:
    name: str
    deadline_ms: float
    work: int  # ticks of robot time the urgent task needs


def _only(body: dict[str, Any], allowed: set[str]) -> None:
    for key in body:
        if key not in allowed:
            raise InvalidArgument(
                f"unknown field; expected one of {', '.join(sorted(allowed))}", field=key
            )


def _integer(
    body: dict[str, Any], key: str, low: int, high: int, default: int | None = None
) -> int:
    if key not in body:
        if default is None:
            raise InvalidArgument("is required", field=key)
        return default
    value = body[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"must be an integer, got {value!r}", field=key)
    if not low <= value <= high:
        raise InvalidArgument(f"must be in [{low}, {high}], got {value}", field=key)
    return value


def _number(
    body: dict[str, Any],
    key: str,
    low: float,
    high: float,
    default: float | None = None,
    *,
    low_open: bool = False,
) -> float:
    if key not in body:
        if default is None:
            raise InvalidArgument("is required", field=key)
        return default
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgument(f"must be a finite number, got {value!r}", field=key)
    if value < low or (low_open and value == low) or value > high:
        bracket = "(" if low_open else "["
        raise InvalidArgument(f"must be in {bracket}{low:g}, {high:g}], got {value:g}", field=key)
    return float(value)


def _name(body: dict[str, Any], key: str, default: str | None = None) -> str:
    if key not in body:
        if default is None:
            raise InvalidArgument("is required", field=key)
        return default
    value = body[key]
    if not isinstance(value, str) or len(value) > 63 or not DNS1123_LABEL.match(value):
        raise InvalidArgument(
            f"must be a DNS-1123 label (lower-case letters, digits and '-', at most 63), got {value!r}",
            field=key,
        )
    return value


def parse_mission(
    body: dict[str, Any], *, default_safe_point_interval: int, default_name: str
) -> MissionSpec:
    _only(body, {"name", "steps", "safe_point_interval", "deadline_ms"})
    name = _name(body, "name", default_name)
    steps = _integer(body, "steps", 1, MAX_STEPS)
    interval = _integer(
        body, "safe_point_interval", 1, MAX_STEPS, min(default_safe_point_interval, steps)
    )
    if interval > steps:
        raise InvalidArgument(
            f"must not exceed steps ({steps}), got {interval}", field="safe_point_interval"
        )
    deadline = _number(body, "deadline_ms", 0.0, MAX_DEADLINE_MS, 0.0)
    return MissionSpec(name=name, steps=steps, safe_point_interval=interval, deadline_ms=deadline)


def parse_urgent(body: dict[str, Any]) -> UrgentSpec:
    _only(body, {"name", "deadline_ms", "work"})
    name = _name(body, "name")
    deadline = _number(body, "deadline_ms", 0.0, MAX_DEADLINE_MS, low_open=True)
    work = _integer(body, "work", 1, MAX_URGENT_WORK, 1)
    return UrgentSpec(name=name, deadline_ms=deadline, work=work)


def parse_tick(body: dict[str, Any]) -> int:
    _only(body, {"ticks"})
    return _integer(body, "ticks", 1, MAX_TICKS_PER_CALL, 1)
