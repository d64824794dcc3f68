"""Sums, minima and maxima of the small integer arrays of one batch, at the cheapest of three prices.

A numpy reduction costs about 0.8 µs whatever the array's size (the ufunc machinery),
while Python's ``sum``/``min``/``max`` over the array's list cost about 0.1-0.3 µs plus
0.01 µs per element. A simulated batch has a few to a few hundred items, and these
reductions run several times per batch, so on a few elements the list wins. In between,
the last element of numpy's running sum (or minimum, maximum) wins: ``accumulate`` sets up
less than ``reduce`` (about 4,500 instructions against 7,800; callgrind, numpy 2.4) and
writes one element more per element, so up to a few hundred elements it costs less.
All three give the same exact integer (``tolist`` and ``item`` yield Python ints; int64
sums of token and KV counts never overflow). Not for float sums: numpy sums floats
pairwise, Python and a running sum left to right.
"""

from __future__ import annotations

from operator import index as _index

import numpy as np

#: "A few items": up to this size the per-batch paths work on lists (measured break-even of a list's
#: reduction against numpy's ``reduce``: 60-80 elements; the reductions here use :data:`LIST_MAX`).
SMALL = 64

try:  # the C function behind np.count_nonzero, without its Python wrapper (most of its cost on few items)
    from numpy._core.multiarray import count_nonzero as nonzero
except ImportError:  # pragma: no cover - another numpy's layout
    nonzero = np.count_nonzero

#: Up to this size a reduction goes through the array's list (callgrind: ``tolist`` and ``sum`` about
#: 1,000 instructions plus 110 an element, a running sum's last element about 4,500 plus 8).
LIST_MAX = 28
#: Up to this size (above :data:`LIST_MAX`) through the last element of a running reduction
#: (``accumulate``), above it through ``reduce`` (about 7,800 whatever the size; the running sum
#: writes its output, 6.5 instructions an element more: break-even at about 700 elements).
RUNNING_MAX = 512

_add = np.add.reduce
_minimum = np.minimum.reduce
_maximum = np.maximum.reduce
_running_add = np.add.accumulate
_running_min = np.minimum.accumulate
_running_max = np.maximum.accumulate


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
    size = a.size
    if size <= LIST_MAX:
        return sum(a.tolist())
    return _running_add(a).item(-1) if size <= RUNNING_MAX else int(_add(a))


def imin(a: np.ndarray) -> int:
    """Minimum of a non-empty integer array, as a Python int."""
    size = a.size
    if size <= LIST_MAX:
        return min(a.tolist())
    return _running_min(a).item(-1) if size <= RUNNING_MAX else int(_minimum(a))


def imax(a: np.ndarray) -> int:
    """Maximum of a non-empty integer array, as a Python int."""
    size = a.size
    if size <= LIST_MAX:
        return max(a.tolist())
    return _running_max(a).item(-1) if size <= RUNNING_MAX else int(_maximum(a))


def fmax(a: np.ndarray) -> float:
    """Maximum of a non-empty float array without NaN, as a Python float (exact: no arithmetic)."""
    size = a.size
    if size <= LIST_MAX:
        return max(a.tolist())
    return _running_max(a).item(-1) if size <= RUNNING_MAX else float(_maximum(a))


__all__ = ["LIST_MAX", "RUNNING_MAX", "SMALL", "count", "fmax", "imax", "imin", "isum", "nonzero", "operand"]
