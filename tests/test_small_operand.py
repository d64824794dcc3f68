"""costmodel.small.operand: a 0-d int64 operand that gives an int64 array's ufunc the Python int's result."""

from __future__ import annotations

import numpy as np
import pytest

from kvsched.costmodel.small import operand


@pytest.mark.parametrize("k", [0, 1, 7, 1023, 1024, 5000, -1, -3, 2**40])
def test_same_result_as_the_python_int(k: int) -> None:
    a = np.array([0, 5, 2**50, -9], dtype=np.int64)
    op = operand(k)
    assert op.shape == () and op.dtype == np.int64 and int(op) == k
    for got, want in ((a + op, a + k), (a - op, a - k), (a != op, a != k)):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    b = a.copy()
    b += op
    assert np.array_equal(b, a + k)


def test_table_operands_are_read_only() -> None:
    with pytest.raises(ValueError):
        operand(3)[...] = 4
    assert operand(3) is operand(3)
