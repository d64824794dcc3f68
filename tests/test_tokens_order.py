"""The ITL's sort on the gaps' bit patterns gives numpy's stable float order."""

import numpy as np
import pytest

from kvsched.schedule.tokens import _stable_order


@pytest.mark.parametrize("seed", range(5))
def test_non_negative_gaps_sort_as_floats(seed):
    rng = np.random.default_rng(seed)
    values = rng.choice(np.r_[0.0, rng.random(50) * 0.1, np.inf], size=2_000)  # ties, +0.0 and +inf
    values[rng.random(values.size) < 0.3] = 0.0
    assert np.array_equal(_stable_order(values), np.argsort(values, kind="stable"))


@pytest.mark.parametrize("special", [-1e-9, -0.0, -np.inf])
def test_a_sign_bit_keeps_the_float_sort(special):
    values = np.array([0.5, 0.0, special, 0.25, 0.0, 0.5])
    assert np.array_equal(_stable_order(values), np.argsort(values, kind="stable"))


def test_empty():
    assert _stable_order(np.zeros(0)).size == 0
