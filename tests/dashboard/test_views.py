"""The D-MUG table's rows: the plan's prediction beside what the node observed."""

from __future__ import annotations

import pytest

from parfusion.v1 import intent_pb2
from services.dashboard.views import allocation_rows


def _allocation(intent_id: str, predicted: float, units: int = 2) -> intent_pb2.Allocation:
    return intent_pb2.Allocation(
        intent_id=intent_id,
        intent_name=intent_id,
        workload_class=intent_pb2.WORKLOAD_CLASS_ONLINE,
        workers=units,
        units=units,
        predicted_p99_ms=predicted,
        deadline_ms=60.0,
    )


def test_rows_show_the_observed_tail_and_the_prediction_error() -> None:
    plan = [
        _allocation("chat", 38.8),
        _allocation("detect", 20.0),
        _allocation("stuck", 1e9),  # the queue would not drain: nothing to compare
        _allocation("quiet", 12.0),  # no requests observed yet
    ]
    rows = {
        r["name"]: r
        for r in allocation_rows(plan, {}, {"chat": 65.0, "detect": 20.0, "stuck": 900.0})
    }
    assert rows["chat"]["observed"] == 65.0
    assert rows["chat"]["error"] == pytest.approx(38.8 / 65.0 - 1)  # 40 % under
    assert rows["detect"]["error"] == pytest.approx(0.0)
    assert rows["stuck"]["error"] is None and rows["stuck"]["observed"] == 900.0
    assert rows["quiet"]["error"] is None and rows["quiet"]["observed"] is None
    # without telemetry (the node agent is down) the columns are empty, not zero
    assert all(r["error"] is None for r in allocation_rows(plan, {}))
