"""Per-intent decision series: read at scrape time from the last recorded Decisions, gone
when the intent leaves the plan, is forgotten, or its loop stops."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from services.allocator.metrics import PER_INTENT, DecisionMetrics, per_intent_text
from services.core import model


def _units(name: str, intent_id: str) -> float | None:
    return PER_INTENT.get_sample_value(
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


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.sampled_from("pqrstu"), st.integers(0, 2)), unique_by=lambda r: r[0]),
        min_size=1,
        max_size=6,
    ),
    st.data(),
)
def test_series_are_the_last_plans_however_its_rows_move(plans, data) -> None:
    """Rows kept in place, appended after the others, moved, dropped or forgotten, with
    Decision objects reused whenever a row's values are unchanged (as the policies do): the
    series are always the last plan's."""
    m = DecisionMetrics()
    made: dict[tuple[str, int], model.Decision] = {}
    for plan in plans:
        if data.draw(st.booleans()):  # an intent deleted between two ticks
            m.forget([data.draw(st.sampled_from("pqrstu"))])
        decisions = [made.setdefault(r, model.Decision(f"m-{r[0]}", r[1])) for r in plan]
        _record(m, *decisions)
        for key in "pqrstu":
            expected = dict(plan).get(key)
            assert _units(f"n-m-{key}", f"m-{key}") == expected
    m.close()


def test_a_forgotten_series_comes_back_with_the_same_decision_object() -> None:
    m = DecisionMetrics()
    a = model.Decision("m-c", 4)
    _record(m, a)
    _record(m, a)  # the very same Decision: nothing to look at, the series stands
    assert _units("n-m-c", "m-c") == 4
    m.forget(["m-c"])
    assert _units("n-m-c", "m-c") is None
    _record(m, a)
    assert _units("n-m-c", "m-c") == 4  # forgotten: the same object is recorded again


def test_calibration_series_go_with_the_intent_and_a_closed_loop_reports_nothing() -> None:
    class Cal:
        correction = 1.25

    m = DecisionMetrics()
    _record(m, model.Decision("m-k", 2))
    m.record_prediction_errors({"m-k": -0.1, "gone": 0.5}, {"m-k": Cal(), "gone": Cal()})
    labels = {"intent": "n-m-k", "intent_id": "m-k"}
    error = "parfusion_dmug_prediction_error_ratio"
    assert PER_INTENT.get_sample_value(error, labels) == -0.1
    assert PER_INTENT.get_sample_value("parfusion_dmug_latency_correction_ratio", labels) == 1.25
    assert PER_INTENT.get_sample_value(error, {"intent": "gone", "intent_id": "gone"}) is None
    _record(m)  # m-k left the plan
    assert PER_INTENT.get_sample_value(error, labels) is None
    assert PER_INTENT.get_sample_value("parfusion_dmug_latency_correction_ratio", labels) is None
    _record(m, model.Decision("m-k", 2))
    assert _units("n-m-k", "m-k") == 2
    m.close()
    assert _units("n-m-k", "m-k") is None


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
    return PER_INTENT.get_sample_value(
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


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(max_size=12),  # names are free text: quotes, backslashes, newlines
            st.floats(allow_nan=True, allow_infinity=True),
        ),
        max_size=6,
    )
)
def test_the_fast_text_is_what_prometheus_client_writes(rows: list[tuple[str, float]]) -> None:
    class Cal:
        correction = 0.5

    m = DecisionMetrics()
    try:
        decisions = [
            model.Decision(f"t-{k}", k, slack_ms=v, nmu=-v) for k, (_, v) in enumerate(rows)
        ]
        names = {f"t-{k}": name for k, (name, _) in enumerate(rows)}
        m.record(model.PlanResult(policy="parfusion", decisions=tuple(decisions)), names, 0.0)
        m.record_prediction_errors({d.intent_id: d.slack_ms for d in decisions[:2]}, {"t-0": Cal()})
        assert per_intent_text() == generate_latest(PER_INTENT)
    finally:
        m.close()
