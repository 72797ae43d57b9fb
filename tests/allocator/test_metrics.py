"""Per-intent decision series: read at scrape time from the last recorded plan's Decisions,
gone when the intent leaves the plan or is forgotten."""

from __future__ import annotations

from prometheus_client import REGISTRY

from services.allocator.metrics import DecisionMetrics
from services.core import model


def _units(name: str, intent_id: str) -> float | None:
    return REGISTRY.get_sample_value(
        "parfusion_dmug_units", {"intent": name, "intent_id": intent_id}
    )


def _record(m: DecisionMetrics, *decisions: model.Decision) -> None:
    names = {d.intent_id: f"n-{d.intent_id}" for d in decisions}
    m.record(model.PlanResult(policy="parfusion", decisions=decisions), names, 0.001)


def test_series_follow_the_decisions() -> None:
    m = DecisionMetrics()
    a, b = model.Decision("m-a", 2), model.Decision("m-b", 3)
    _record(m, a, b)
    assert (_units("n-m-a", "m-a"), _units("n-m-b", "m-b")) == (2, 3)
    _record(m, model.Decision("m-a", 5), b)
    assert (_units("n-m-a", "m-a"), _units("n-m-b", "m-b")) == (5, 3)
    _record(m, b)
    assert _units("n-m-a", "m-a") is None and _units("n-m-b", "m-b") == 3
    m.forget(["m-b"])
    assert _units("n-m-b", "m-b") is None


def test_a_forgotten_series_comes_back_with_the_next_plan_that_holds_it() -> None:
    m = DecisionMetrics()
    a = model.Decision("m-c", 4)
    _record(m, a)
    m.forget(["m-c"])
    assert _units("n-m-c", "m-c") is None
    _record(m, a)  # the very same Decision object: the series is back
    assert _units("n-m-c", "m-c") == 4


def test_a_renamed_intent_moves_its_series_even_with_the_same_decision() -> None:
    m = DecisionMetrics()
    a, b = model.Decision("m-r", 3), model.Decision("m-s", 1)
    result = model.PlanResult(policy="parfusion", decisions=(a, b))
    m.record(result, {"m-r": "old", "m-s": "s"}, 0.001)
    m.record(result, {"m-r": "new", "m-s": "s"}, 0.001)  # same Decision objects, new name
    assert _units("old", "m-r") is None and _units("new", "m-r") == 3
    # the same rows in another order: every row looked at, nothing lost
    m.record(
        model.PlanResult(policy="parfusion", decisions=(b, a)), {"m-r": "new", "m-s": "s"}, 0.0
    )
    assert _units("new", "m-r") == 3 and _units("s", "m-s") == 1


def _error(name: str, intent_id: str) -> float | None:
    return REGISTRY.get_sample_value(
        "parfusion_dmug_prediction_error_ratio", {"intent": name, "intent_id": intent_id}
    )


def test_prediction_errors_of_an_intent_already_forgotten_make_no_series() -> None:
    m = DecisionMetrics()
    _record(m, model.Decision("m-e", 2), model.Decision("m-f", 1))
    m.record_prediction_errors({"m-e": 0.5}, {})
    assert _error("n-m-e", "m-e") == 0.5  # under the series' own labels
    m.forget(["m-e", "m-f"])
    assert _error("n-m-e", "m-e") is None
    # telemetry read before the deletes arrives after them: no series comes back, none leaks
    m.record_prediction_errors({"m-e": 0.25, "m-f": 0.1}, {})
    assert _error("n-m-e", "m-e") is None and _error("n-m-f", "m-f") is None
    assert _error("m-f", "m-f") is None
