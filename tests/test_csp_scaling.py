"""Exact integer scaling of decimal models for CP-SAT."""

import numpy as np
import pytest

from kvsched.csp import SolverOptions
from kvsched.csp.backends import solve_model
from kvsched.csp.model import INF, LinearModel
from kvsched.csp.scaling import integer_model

OPTS = SolverOptions(time_limit=10, threads=1)


def chain(duration: float, arrival: float) -> LinearModel:
    """Two jobs in sequence on one machine, the second's length chosen by an integer: minimise its end."""
    m = LinearModel()
    t1 = m.add_var("t1", arrival, 100, integer=False)
    e1 = m.add_var("e1", 0, 100, integer=False)
    k = m.add_var("k", 1, 3)  # the second job processes k tokens at 0.25 each
    e2 = m.add_var("e2", 0, 100, integer=False, obj=1.0)
    m.add_row([e1, t1], [1.0, -1.0], duration, duration, "e1 = t1 + d")
    m.add_row([e2, e1, k], [1.0, -1.0, -0.25], 0.5, INF, "e2 >= e1 + 0.5 + 0.25 k")
    m.add_row([k], [1.0], 2, INF, "k >= 2")
    return m


def test_scaling_is_exact_on_difference_rows():
    model = chain(1.35, 0.2)
    scaled = integer_model(model)
    assert scaled is not None and scaled.scale == 100
    assert all(scaled.model.integer)
    for backend in ("highs", "cpsat"):
        raw = solve_model(model, backend, OPTS)
        assert raw.objective == pytest.approx(0.2 + 1.35 + 0.5 + 0.5)
        assert raw.x[0] == pytest.approx(0.2) and raw.x[2] == 2


def test_integral_models_keep_scale_one():
    m = LinearModel()
    a, b = m.add_var("a", 0, 5, obj=2.0), m.add_var("b", 0, 5, obj=3.0)
    m.add_row([a, b], [1.0, 1.0], 4, INF)
    scaled = integer_model(m)
    assert scaled.scale == 1 and scaled.obj_scale == 1
    assert solve_model(m, "cpsat", OPTS).objective == 8


@pytest.mark.parametrize(
    ("coefs", "why"),
    [([1.0, 1.0], "two continuous variables of one sign"), ([2.0, -1.0], "a coefficient other than +-1")],
)
def test_rows_outside_difference_form_are_refused(coefs, why):
    m = LinearModel()
    x = m.add_var("x", 0, 10, integer=False, obj=1.0)
    y = m.add_var("y", 0, 10, integer=False, obj=1.0)
    m.add_row([x, y], coefs, 3, INF)
    assert integer_model(m) is None, why


def test_decimal_digits_beyond_the_limit_are_refused():
    assert integer_model(chain(1.0000000000001, 0.0)) is None  # 13 digits
    assert np.isclose(integer_model(chain(1.000001, 0.0)).scale, 10**6)
