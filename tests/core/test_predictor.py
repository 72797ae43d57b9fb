"""Predictor: EWMA mean and P-square p95/p99 with bounded memory, regimes per parallelism."""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.core.model import Decision
from services.core.predictor import (
    CALIBRATION_SETTLE_TICKS,
    CORRECTION_MAX,
    MIN_SAMPLES,
    P2Quantile,
    Predictor,
)


@pytest.mark.parametrize(
    "samples",
    [
        np.random.default_rng(1).lognormal(3.0, 0.5, 5000),
        np.random.default_rng(2).exponential(10.0, 5000),
        np.random.default_rng(3).uniform(5.0, 50.0, 3000),
        np.random.default_rng(4).normal(40.0, 4.0, 4000),
    ],
    ids=["lognormal", "exponential", "uniform", "normal"],
)
def test_quantiles_track_numpy_percentiles(samples):
    p = Predictor()
    p.observe_many("a", samples.tolist(), units=2)
    s = p.stats("a")
    assert s is not None and s.count == len(samples) and s.observed_units == 2
    assert s.p95_ms == pytest.approx(np.percentile(samples, 95), rel=0.05)
    assert s.p99_ms == pytest.approx(np.percentile(samples, 99), rel=0.08)
    assert s.p99_ms >= s.p95_ms


def test_memory_is_bounded_per_intent():
    p = Predictor()
    rng = np.random.default_rng(0)
    p.observe_many("a", rng.exponential(5.0, 1_000).tolist(), 1)
    size_small = _deep_size(p)
    p.observe_many("a", rng.exponential(5.0, 20_000).tolist(), 1)
    assert p.stats("a").count == 21_000
    assert _deep_size(p) <= size_small * 1.05  # same markers, nothing appended


def _deep_size(obj, seen=None) -> int:
    seen = seen or set()
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        size += sum(_deep_size(x, seen) for x in obj)
    elif hasattr(obj, "__dict__"):
        size += _deep_size(vars(obj), seen)
    elif hasattr(obj, "__slots__"):
        size += sum(_deep_size(getattr(obj, a), seen) for a in obj.__slots__ if hasattr(obj, a))
    return size


def test_ewma_mean_follows_a_shift():
    p = Predictor(alpha=0.2)
    p.observe_many("a", [10.0] * 50)
    assert p.stats("a").mean_ms == pytest.approx(10.0)
    p.observe_many("a", [30.0] * 50)
    assert p.stats("a").mean_ms == pytest.approx(30.0, rel=1e-3)


def test_units_change_starts_a_new_regime_after_min_samples():
    p = Predictor()
    p.observe_many("a", [10.0] * 20, units=1)
    p.observe_many("a", [5.0] * (MIN_SAMPLES - 1), units=2)
    assert p.stats("a").observed_units == 1  # too few samples at 2 units yet
    p.observe("a", 5.0, units=2)
    s = p.stats("a")
    assert s.observed_units == 2 and s.count == MIN_SAMPLES and s.mean_ms == pytest.approx(5.0)


def test_snapshot_forget_and_bad_input():
    p = Predictor()
    assert p.stats("x") is None
    p.observe("b", 2.0)
    p.observe("a", 1.0)
    assert list(p.snapshot()) == ["a", "b"]
    p.forget("a")
    assert p.stats("a") is None and list(p.snapshot()) == ["b"] and len(p) == 1
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            p.observe("b", bad)
    with pytest.raises(ValueError):
        p.observe("b", 1.0, factor=0.0)
    assert p.stats("b") is not None and p.stats("b").count == 1  # nothing bad was stored
    # a batch stops at its first bad sample: the ones before it count, nothing after it
    with pytest.raises(ValueError):
        p.observe_many("b", [3.0, 4.0, float("nan"), 5.0], units=2)
    kept = p.stats("b")
    assert kept.count == 2 and kept.observed_units == 2 and kept.mean_ms == pytest.approx(3.2)
    p.observe_many("b", [6.0, 7.0, 8.0], units=2)
    stats = p.stats("b")
    assert stats.count == 5 and stats.observed_units == 2 and stats.mean_ms > 3.0
    with pytest.raises(ValueError):
        Predictor(alpha=0.0)
    with pytest.raises(ValueError):
        P2Quantile(1.0)


def test_compact_after_forgetting_most_intents_keeps_the_rest_and_frees_the_tables():
    p = Predictor()
    for k in range(2000):
        p.observe_many(f"i{k:04d}", [10.0 + k % 7] * MIN_SAMPLES)
    p.snapshot()
    kept = {i: p.stats(i) for i in ("i0007", "i1999")}
    peak = sys.getsizeof(p._current)
    for k in range(2000):
        if f"i{k:04d}" not in kept:
            p.forget(f"i{k:04d}")
    p.compact()
    small = sys.getsizeof(dict.fromkeys(range(8)))
    assert max(sys.getsizeof(p._current), sys.getsizeof(p._snapshot)) <= small < peak
    assert p.snapshot() == kept  # the very same stats objects, nothing forgotten comes back


def test_an_intents_statistics_give_the_garbage_collector_few_objects_to_walk():
    p = Predictor()
    p.observe_many("a", [10.0 + k % 7 for k in range(40)], units=2)
    regime = p._current["a"]
    gc.collect()  # tuples of numbers are untracked by the first collection that sees them
    held = [o for o in gc.get_referents(regime.p95, regime.p99) if not isinstance(o, type)]
    tracked = [o for o in held if gc.is_tracked(o)]
    assert len(tracked) == 2  # one list of markers per estimator
    assert regime.p99.increments is P2Quantile(0.99).increments  # one per quantile, shared


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 1e4), min_size=1, max_size=200))
def test_estimates_stay_within_the_observed_range(samples):
    q = P2Quantile(0.99)
    for x in samples:
        q.add(x)
    assert min(samples) - 1e-9 <= q.value() <= max(samples) + 1e-9
    if len(samples) <= 5:
        assert q.value() == pytest.approx(float(np.percentile(samples, 99)))


def test_stats_are_the_same_object_until_a_new_sample() -> None:
    p = Predictor()
    p.observe_many("a", [10.0, 11.0, 12.0, 13.0, 14.0, 15.0])
    first = p.snapshot()["a"]
    assert p.snapshot()["a"] is first and p.stats("a") is first
    p.observe("a", 30.0)
    second = p.snapshot()["a"]
    assert second is not first and second.count == first.count + 1


# --- calibration: observed tail latency against the plan's prediction -----------------------


def _decision(predicted: float, tick: int, since: int = 0) -> Decision:
    """The plan an intent ran under; its units and level last changed at tick `since`."""
    return Decision(
        "a", units=2, predicted_p99_ms=predicted, since_tick=since, level_since_tick=since
    )


def _settled_predictor() -> Predictor:
    p = Predictor()
    p.observe_many("a", [10.0] * 20, units=2)
    return p


def test_calibration_converges_on_the_node_latency_the_model_misses():
    """A node whose tail is 1.6x what the model predicts: the correction learns 1.6, and the
    stats D-MUG reads carry it, so the corrected prediction matches the observation."""
    p = _settled_predictor()
    model_ms = 30.0
    errors = []
    for tick in range(1, 80):
        k = p.stats("a").latency_correction
        errors.append(p.calibrate("a", 1.6 * model_ms, 500, _decision(k * model_ms, tick), tick))
    assert errors[0] == pytest.approx(1 / 1.6 - 1)  # under-predicted by 37.5 %
    assert p.stats("a").latency_correction == pytest.approx(1.6, rel=0.02)
    assert abs(errors[-1]) < 0.02
    state = p.calibration("a")
    assert state is not None and state.updates > 0 and state.correction == pytest.approx(1.6, 0.02)


def test_calibration_waits_for_a_settled_allocation_and_enough_requests():
    p = _settled_predictor()
    for tick in range(1, 40):  # units changed at tick 35: the window still mixes two allocations
        p.calibrate("a", 60.0, 500, _decision(30.0, tick, since=tick - 3), tick)
    assert p.stats("a").latency_correction == 1.0
    for tick in range(1, 40):  # too few requests behind the percentile
        assert p.calibrate("a", 60.0, 10, _decision(30.0, tick), tick) is None
    assert p.stats("a").latency_correction == 1.0
    # an unbounded prediction (the queue cannot drain) says nothing about the model's error
    assert p.calibrate("a", 60.0, 500, _decision(1e9, 50), 50) is None


def test_one_noisy_prediction_does_not_move_the_correction():
    """The observed tail spans many ticks: it is compared with the median of the model's
    predictions over them, so a tick whose prediction jumped (a service-time estimate near
    saturation) teaches nothing."""
    p = _settled_predictor()
    for tick in range(1, 100):
        predicted = 300.0 if tick % 10 == 0 else 30.0
        p.calibrate("a", 30.0, 500, _decision(predicted, tick), tick)
    assert p.stats("a").latency_correction == 1.0


def test_calibration_learns_through_predictions_that_swing_tick_to_tick():
    """Near saturation the model's prediction swings by tens of percent from tick to tick (its
    service-time estimate moves with every sample) while the node's tail, over a window of many
    ticks, is steady at twice the model's typical value: the correction learns 2."""
    p = _settled_predictor()
    swing = (20.0, 30.0, 45.0, 25.0, 35.0, 30.0, 50.0, 28.0)  # median 30
    for tick in range(1, 120):
        k = p.stats("a").latency_correction
        model_ms = swing[tick % len(swing)]
        p.calibrate("a", 60.0, 500, _decision(k * model_ms, tick), tick)
    assert p.stats("a").latency_correction == pytest.approx(2.0, rel=0.05)


def test_calibration_learns_once_per_tick_and_stays_bounded():
    p = _settled_predictor()
    for tick in range(1, 200):
        k = p.stats("a").latency_correction
        for _ in range(3):  # several telemetry reports within one tick
            p.calibrate("a", 300.0, 500, _decision(k * 10.0, tick), tick)
    assert p.stats("a").latency_correction == pytest.approx(CORRECTION_MAX)
    state = p.calibration("a")
    assert state is not None and state.updates == 199 - CALIBRATION_SETTLE_TICKS + 1


def test_a_steady_correction_hands_out_the_same_stats_object():
    """D-MUG's memo keeps a row's columns while its ServiceStats object is the same one."""
    p = _settled_predictor()
    for tick in range(1, 60):
        k = p.stats("a").latency_correction
        p.calibrate("a", 39.0, 500, _decision(k * 30.0, tick), tick)
    first = p.stats("a")
    p.calibrate("a", 39.0, 500, _decision(first.latency_correction * 30.0, 60), 60)
    assert p.stats("a") is first
    p.forget("a")
    assert p.calibration("a") is None and p.stats("a") is None


OPS = st.lists(
    st.tuples(
        st.sampled_from(["observe", "calibrate", "calibrate", "forget", "snapshot"]),
        st.sampled_from(["a", "b", "c", "d"]),
        st.floats(1.0, 100.0),
        st.integers(1, 3),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_kept_snapshot_equals_every_intents_stats_afresh(ops) -> None:  # type: ignore[no-untyped-def]
    p = Predictor()
    for tick, (op, intent_id, x, units) in enumerate(ops, start=1):
        if op == "observe":
            p.observe_many(intent_id, [x, x * 1.5, x * 0.7] * units, units=units)
        elif op == "calibrate":
            # a steady prediction half the observed tail: the correction moves
            p.calibrate(intent_id, 60.0, 500, _decision(30.0, tick, since=tick - 10), tick)
        elif op == "forget":
            p.forget(intent_id)
        got = p.snapshot()
        fresh = {i: s for i in sorted(p._current) if (s := p.stats(i)) is not None}
        assert list(got) == list(fresh)
        assert all(got[i] is fresh[i] for i in fresh)  # the very objects: the memo's key


def test_kept_snapshot_follows_a_correction_learnt_without_new_samples() -> None:
    p = Predictor()
    p.observe_many("a", [10.0, 12.0, 11.0] * 10, units=2)
    before = p.snapshot()["a"]
    for tick in range(20, 40):
        p.calibrate("a", 60.0, 500, _decision(30.0, tick, since=0), tick)
    after = p.snapshot()["a"]
    assert after is p.stats("a") and after.latency_correction != before.latency_correction


def test_the_corrected_stats_differ_from_the_regimes_in_the_correction_only() -> None:
    """The stats carrying a correction are built positionally (cheaper than dataclasses.replace
    or keywords): every other field must come across, whatever ServiceStats holds, and the
    same object is handed out while the samples and the correction stay."""
    import dataclasses

    from services.core.predictor import _Regime

    regime = _Regime(units=3, alpha=0.2)
    for x in (11.0, 13.0, 17.0, 12.0, 23.0, 14.0, 19.0):
        regime.add(x)
    plain = regime.stats()
    assert plain.observed_units == 3 and plain.count == 7 and plain.latency_correction == 1.0
    corrected = regime.stats(1.7)
    assert corrected == dataclasses.replace(plain, latency_correction=1.7)
    assert regime.stats(1.7) is corrected  # kept while the samples and k are the same
    regime.add(15.0)
    assert regime.stats(1.7) is not corrected and regime.stats(1.7).count == 8
