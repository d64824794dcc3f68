"""Sums, minima and maxima of the small integer arrays of one batch, at the cheaper of two prices.

A numpy reduction costs about 0.8 µs whatever the array's size (the ufunc machinery),
while Python's ``sum``/``min``/``max`` over the array's list cost about 0.1-0.3 µs plus
0.01 µs per element. A simulated batch has a few to a few hundred items, and these
reductions run several times per batch, so below :data:`SMALL` elements the list wins.
Both give the same exact integer (``tolist`` yields Python ints; int64 sums of token and
KV counts never overflow). Not for floats: numpy sums floats pairwise, Python left to right.
"""

from __future__ import annotations

from operator import index as _index

import numpy as np

#: Arrays up to this size are reduced through their list (measured break-even: 60-80 elements).
SMALL = 64

try:  # the C function behind np.count_nonzero, without its Python wrapper (most of its cost on few items)
    from numpy._core.multiarray import count_nonzero as nonzero
except ImportError:  # pragma: no cover - another numpy's layout
    nonzero = np.count_nonzero

_add = np.add.reduce
_minimum = np.minimum.reduce
_maximum = np.maximum.reduce


#: How many counts (0 .. NUM_OPERANDS - 1, a run's batches) :data:`OPERANDS` holds.
NUM_OPERANDS = 1024
#: :func:`operand` of 0 .. ``NUM_OPERANDS - 1``, read-only; hot paths index it directly where a call per
#: run counts (``OPERANDS[k] if k < NUM_OPERANDS else operand(k)``, for k >= 0).
OPERANDS = tuple(np.array(k, dtype=np.int64) for k in range(NUM_OPERANDS))
for _a in OPERANDS:
    _a.flags.writeable = False


def operand(k: int) -> np.ndarray:
    """``k`` (an int) as a read-only 0-d int64 array, the operand of an int64 array's ufunc.

    numpy 2 converts a Python int operand on every call (its weak-scalar promotion): ``a + k``
    on a few items costs about 0.53 µs against 0.27 µs with a 0-d array of a's dtype. With an
    int64 ``a``, the same values and dtype, so the same result (another dtype would promote to
    int64: a 0-d array is not a weak scalar). Counts 0-1,023 (a run's batches) come from a table.
    """
    return OPERANDS[k] if 0 <= k < NUM_OPERANDS else np.array(k, dtype=np.int64)


def count(a: np.ndarray) -> int:
    """Number of non-zero (true) elements, as a Python int (numpy returns an ``np.int64``)."""
    return _index(nonzero(a))  # (operator.index: the same int without int()'s call through its type)


def isum(a: np.ndarray) -> int:
    """Sum of an integer array, as a Python int."""
    return sum(a.tolist()) if a.size <= SMALL else int(_add(a))


def imin(a: np.ndarray) -> int:
    """Minimum of a non-empty integer array, as a Python int."""
    return min(a.tolist()) if a.size <= SMALL else int(_minimum(a))


def imax(a: np.ndarray) -> int:
    """Maximum of a non-empty integer array, as a Python int."""
    return max(a.tolist()) if a.size <= SMALL else int(_maximum(a))


def fmax(a: np.ndarray) -> float:
    """Maximum of a non-empty float array without NaN, as a Python float (exact: no arithmetic)."""
    return max(a.tolist()) if a.size <= SMALL else float(_maximum(a))


__all__ = ["SMALL", "count", "fmax", "imax", "imin", "isum", "nonzero", "operand"]
