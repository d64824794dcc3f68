"""The LP helpers of the bounds (kvsched.csp.bounds.lp_model): the reported value is a proof."""

from __future__ import annotations

import numpy as np
import pytest

from kvsched.csp.bounds.lp_model import LPModel, dual_bound, solve_lp
from kvsched.stop import Deadline


def test_dual_bound_is_weak_duality():
    """min x s.t. x1 + x2 >= 1, 0 <= x <= 5, cost (1, 2): any multiplier gives at most the optimum 1."""
    arrays = (
        np.array([1.0, 2.0]),
        np.zeros(2),
        np.full(2, 5.0),
        np.array([1.0]),
        np.array([np.inf]),
        np.array([0, 0]),
        np.array([0, 1]),
        np.array([1.0, 1.0]),
    )
    assert dual_bound(arrays, np.array([1.0])) == pytest.approx(1.0)
    for pi in (-3.0, 0.0, 0.5, 2.0, 7.0):
        assert dual_bound(arrays, np.array([pi])) <= 1.0 + 1e-12


def test_solve_gives_the_value_and_a_point():
    """min x + 2 y s.t. x + y >= 1, x - y <= 0.5 over [0, 5]^2: optimum 1.25 at (0.75, 0.25)."""
    m = LPModel()
    cols = m.cols(2, 5.0, cost=np.array([1.0, 2.0]))
    m.row(cols, [1.0, 1.0], lo=1.0)
    m.row(cols, [1.0, -1.0], hi=0.5)
    value, status, point = solve_lp(m, Deadline.never(), threads=1)
    assert value == pytest.approx(1.25, rel=1e-6) and value <= 1.25 + 1e-9
    assert point is not None and point == pytest.approx([0.75, 0.25], abs=1e-5)
    assert status == "Optimal"
