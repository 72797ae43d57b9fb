"""A D-MUG formula gives the same bits for one intent alone and for the same intent inside a
larger array (what the water-filling fast path relies on to equal the heap greedy exactly)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from services.core import formulas

positive = st.floats(min_value=1e-6, max_value=1e4, allow_nan=False)
fraction = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
signed = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False)


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def in_matrix(fn, *args):
    """fn on a 3-row column where the row of interest sits between two unrelated rows."""
    cols = [np.array([1.5, a, 2.5]) if isinstance(a, float) else np.array([2, a, 3]) for a in args]
    return float(fn(*cols)[1])


@settings(max_examples=300, deadline=None)
@given(
    tail1=positive,
    mean1=positive,
    f=fraction,
    p=st.integers(min_value=-1, max_value=256),
    arrival=st.floats(min_value=0.0, max_value=500.0),
    factor=st.floats(min_value=0.1, max_value=4.0),
)
def test_predicted_latency_alone_equals_in_matrix(tail1, mean1, f, p, arrival, factor):
    alone = float(formulas.predicted_latency_ms(tail1, mean1, f, p, arrival, factor))
    matrix = in_matrix(formulas.predicted_latency_ms, tail1, mean1, f, p, arrival, factor)
    assert same(alone, matrix)
    if p < 1:
        assert alone == formulas.LATENCY_CEILING_MS


@settings(max_examples=300, deadline=None)
@given(slack=signed, latency=st.floats(min_value=0.0, max_value=1e9), rel=fraction)
def test_deadline_risk_alone_equals_in_matrix(slack, latency, rel):
    alone = float(formulas.deadline_risk(slack, latency, rel))
    assert same(alone, in_matrix(formulas.deadline_risk, slack, latency, rel))
    assert 0.0 <= alone <= 1.0


@settings(max_examples=200, deadline=None)
@given(
    cpu=fraction,
    gpu=st.floats(min_value=-1.0, max_value=2.0),
    network=st.floats(min_value=-1.0, max_value=2.0),
    gain=st.floats(min_value=0.0, max_value=4.0),
    uses_gpu=st.sampled_from([0.0, 1.0]),
    network_bound=st.sampled_from([0.0, 1.0]),
)
def test_pressure_inflation_alone_equals_in_matrix(
    cpu, gpu, network, gain, uses_gpu, network_bound
):
    args = (cpu, gpu, network, gain, uses_gpu, network_bound)
    alone = float(formulas.pressure_inflation(*args))
    assert same(alone, in_matrix(formulas.pressure_inflation, *args))
    assert alone >= 1.0


def test_latency_is_the_ceiling_at_saturation():
    # rho = 100/s * 10 ms / 1000 = 1.0 >= MAX_UTILISATION: the queue does not drain
    assert formulas.predicted_latency_ms(10.0, 10.0, 0.0, 1, 100.0, 1.0) == (
        formulas.LATENCY_CEILING_MS
    )
    assert formulas.predicted_latency_ms(10.0, 10.0, 0.0, 1, 0.0, 1.0) == 10.0
