"""Sparse LPs for the LP bounds, solved by HiGHS, with a value that is a proof whatever HiGHS returns.

The batch-rate LP (:mod:`.fluid_lp`) and the processor-sharing LP (:mod:`.sharing_lp`) build their models here
and take as their bound not HiGHS's objective but a weak-duality value from its row duals
(:func:`dual_bound`): for any multipliers ``pi``, ``sum_r min(pi_r lo_r, pi_r hi_r) + sum_c min(d_c lo_c,
d_c hi_c)`` with ``d = c - A^T pi`` is below the LP's minimum, so HiGHS's tolerances, an interior point
without crossover or a run cut short cannot put the bound above a schedule. Every column therefore needs a
finite box.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from kvsched.csp.certificate import Bound
from kvsched.highs import new_highs, run_highs
from kvsched.instances.model import Instance
from kvsched.stop import Deadline


def from_first_arrival(instance: Instance) -> Instance:
    """``instance`` with every arrival counted from the first one (for a seconds-based cost model).

    The LPs' interval grids start at time 0: arrivals at 1.7e9 s (Unix time) made intervals of 3e7 s, which
    bound nothing. A batch's time does not depend on when it runs, so shifting every arrival and every
    schedule by the same amount is a bijection that keeps each total latency, and so every bound. The
    subtraction is exact (Sterbenz) for arrivals up to twice the first, and otherwise off by half an ulp of
    the arrival, far inside the LPs' safety margin.
    """
    first = min((r.arrival for r in instance.requests), default=0.0)
    if first == 0.0:
        return instance
    return replace(instance, requests=tuple(replace(r, arrival=r.arrival - first) for r in instance.requests))


#: Relative safety margin on a reported value (float rounding in the dual evaluation).
SAFETY = 1e-9


@dataclass(frozen=True, slots=True)
class LPBoundResult:
    """What an LP bound on a time grid gave: the bound (None when nothing was proven), its grid and what it took.

    The batch-rate LP (:mod:`.fluid_lp`) and the processor-sharing LP (:mod:`.sharing_lp`) both return one, so
    that callers read them the same way.

    Attributes
    ----------
    bound
        The bound, for every legal schedule; None when nothing was proven.
    step
        The grid's interval length D (0 when the model is not supported).
    cells
        The grid's cells in the model: the batch-rate LP's request-intervals, the sharing LP's intervals (0 when
        no model was built).
    rounds
        LP solves run: the sharing LP's cutting-plane rounds, the batch-rate LP's one.
    seconds
        Wall time taken.
    status
        HiGHS's model status after the last solve, or why none ran ("not supported", "grid too coarse",
        "deadline while building").
    history
        (seconds since the start, the LP's value) after each solve that gave duals.
    window
        The batch-rate LP's window (how long after its arrival a request's batches are placed); None for the
        sharing LP, whose intervals cover the whole horizon.
    rows
        The batch-rate LP's rows (0 when none was built or for the sharing LP): they choose its solver.
    """

    bound: Bound | None
    step: float
    cells: int
    rounds: int
    seconds: float
    status: str
    history: tuple[tuple[float, float], ...] = ()
    window: float | None = None
    rows: int = 0


def exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    """Exclusive prefix sums: ``out[k]`` is the sum of ``values[:k]``, so ``out[b] - out[a]`` sums ``values[a:b]``.

    Parameters
    ----------
    values
        A 1-d array.

    Returns
    -------
    np.ndarray
        Float array of ``values.size + 1`` entries, starting at 0 (as :meth:`.seconds.Tokens.over_tokens` reads it).
    """
    return np.concatenate([[0.0], np.cumsum(values)])


class LPModel:
    """Columns with boxes and costs, rows with bounds, as flat arrays (COO).

    Rows come one at a time (:meth:`row`) or in blocks (:meth:`rows`, the builders' per-interval patterns in
    one numpy call each); :meth:`arrays` lays the entries out row by row, in each row's own column order,
    whichever way they came, so a model has one matrix however it was built.
    """

    def __init__(self) -> None:
        self.ncol = 0
        self.lo: list[np.ndarray] = []
        self.hi: list[np.ndarray] = []
        self.cost: list[np.ndarray] = []
        self.nrow = 0
        # Entries and row bounds as blocks of arrays; single rows are gathered in Python lists first (a numpy
        # call per row cost more than the row: 35 us each, 4 s of a 10,000-cell batch-rate LP's build).
        self._ri: list[np.ndarray] = []
        self._ci: list[np.ndarray] = []
        self._vi: list[np.ndarray] = []
        self._bid: list[np.ndarray] = []
        self._blo: list[np.ndarray] = []
        self._bhi: list[np.ndarray] = []
        self._one_ri: list[int] = []
        self._one_ci: list = []
        self._one_vi: list = []
        self._one_id: list[int] = []
        self._one_lo: list[float] = []
        self._one_hi: list[float] = []

    def cols(self, k: int, hi, cost=0.0) -> np.ndarray:
        """``k`` new columns in [0, hi] with objective ``cost``; their indices."""
        idx = np.arange(self.ncol, self.ncol + k)
        self.ncol += k
        self.lo.append(np.zeros(k))
        self.hi.append(np.broadcast_to(np.asarray(hi, dtype=np.float64), (k,)).copy())
        self.cost.append(np.broadcast_to(np.asarray(cost, dtype=np.float64), (k,)).copy())
        return idx

    def row(self, cols, vals, lo=-math.inf, hi=math.inf) -> None:
        """One row ``lo <= sum vals * x[cols] <= hi``."""
        if isinstance(cols, np.ndarray):
            cols = cols.tolist()
        k = len(cols)
        if isinstance(vals, np.ndarray):
            vals = vals.tolist() if vals.ndim else [float(vals)] * k
        elif not isinstance(vals, (list, tuple)):
            vals = [vals] * k
        if len(vals) != k:  # one value for every column, as numpy broadcasting allows
            (vals,) = vals
            vals = [vals] * k
        self._one_ri += [self.nrow] * k
        self._one_ci += cols
        self._one_vi += vals
        self._one_id.append(self.nrow)
        self._one_lo.append(lo)
        self._one_hi.append(hi)
        self.nrow += 1

    def rows(
        self, cols, vals, lo=-math.inf, hi=math.inf, *, keep=None, stride: int = 1, offset: int = 0
    ) -> None:
        """Rows ``lo[r] <= sum_k vals[r, k] x[cols[r, k]] <= hi[r]`` for r = 0, 1, ..., one numpy call.

        ``cols`` is (rows, width); ``vals``, ``lo`` and ``hi`` broadcast to it and to (rows,). Entries where
        ``keep`` (rows, width) is False are left out. Row r gets the id ``nrow + offset + stride r``, so that
        several patterns can interleave (one call per pattern, ``offset`` 0..stride - 1, then
        :meth:`skip_rows` by ``stride`` times the rows); with the defaults the rows are simply appended.
        """
        cols = np.asarray(cols, dtype=np.int64)
        if cols.ndim == 1:
            cols = cols[:, None]
        r, w = cols.shape
        ids = self.nrow + offset + stride * np.arange(r, dtype=np.int64)
        vals = np.broadcast_to(np.asarray(vals, dtype=np.float64), (r, w))
        ri = np.broadcast_to(ids[:, None], (r, w))
        if keep is None:
            self._ri.append(ri.ravel())
            self._ci.append(cols.ravel())
            self._vi.append(vals.ravel())
        else:
            keep = np.broadcast_to(keep, (r, w))
            self._ri.append(ri[keep])
            self._ci.append(cols[keep])
            self._vi.append(vals[keep])
        self._bid.append(ids)
        self._blo.append(np.broadcast_to(np.asarray(lo, dtype=np.float64), (r,)))
        self._bhi.append(np.broadcast_to(np.asarray(hi, dtype=np.float64), (r,)))
        if stride == 1 and offset == 0:
            self.nrow += r

    def skip_rows(self, count: int) -> None:
        """Take ``count`` row ids that interleaved :meth:`rows` calls (``stride`` > 1) have filled."""
        self.nrow += count

    def arrays(self):
        """(cost, column lo, column hi, row lo, row hi, row index, column index, value), entries row by row."""
        ri = np.concatenate([np.asarray(self._one_ri, dtype=np.int64), *self._ri])
        ci = np.concatenate([np.asarray(self._one_ci, dtype=np.int64), *self._ci])
        vi = np.concatenate([np.asarray(self._one_vi, dtype=np.float64), *self._vi])
        if ri.size and np.any(ri[1:] < ri[:-1]):
            order = np.argsort(ri, kind="stable")  # stable: each row keeps its own column order
            ri, ci, vi = ri[order], ci[order], vi[order]
        rlo = np.full(self.nrow, -math.inf)
        rhi = np.full(self.nrow, math.inf)
        ids = np.concatenate([np.asarray(self._one_id, dtype=np.int64), *self._bid])
        rlo[ids] = np.concatenate([np.asarray(self._one_lo, dtype=np.float64), *self._blo])
        rhi[ids] = np.concatenate([np.asarray(self._one_hi, dtype=np.float64), *self._bhi])
        return (
            np.concatenate(self.cost),
            np.concatenate(self.lo),
            np.concatenate(self.hi),
            rlo,
            rhi,
            ri,
            ci,
            vi,
        )


def dual_bound(arrays, row_dual: np.ndarray) -> float:
    """A lower bound on the LP from any row multipliers (weak duality over the columns' boxes)."""
    cost, clo, chi, rlo, rhi, ri, ci, vi = arrays
    pi = np.asarray(row_dual, dtype=np.float64).copy()
    pi[~np.isfinite(pi)] = 0.0
    pi[(pi > 0) & ~np.isfinite(rlo)] = 0.0  # a multiplier on a side without a bound gives -inf
    pi[(pi < 0) & ~np.isfinite(rhi)] = 0.0
    rows = np.where(
        pi > 0, pi * np.where(np.isfinite(rlo), rlo, 0.0), pi * np.where(np.isfinite(rhi), rhi, 0.0)
    )
    reduced = cost - np.bincount(ci, weights=vi * pi[ri], minlength=cost.size)
    cols = np.minimum(reduced * clo, reduced * chi)
    return float(rows.sum() + cols.sum())


def solve_lp(
    m: LPModel, deadline: Deadline, threads: int, *, simplex: bool = False
) -> tuple[float | None, str, np.ndarray | None]:
    """Solve ``m`` (minimise) by HiGHS's interior point, or its dual simplex where ``simplex``: (:func:`dual_bound`
    of its duals, HiGHS's status, the primal point); (None, status, None) when HiGHS returned no duals (cut off by
    the deadline)."""
    import highspy

    arrays = m.arrays()
    cost, clo, chi, rlo, rhi, ri, ci, vi = arrays
    h = new_highs(threads)
    if simplex:
        h.setOptionValue("solver", "simplex")
    else:
        # Interior point without crossover: 6-10 times faster than simplex on the large LPs, and the bound needs
        # only duals (any duals give a valid value; these are near optimal).
        h.setOptionValue("solver", "ipm")
        h.setOptionValue("run_crossover", "off")
    if deadline.bounded:
        h.setOptionValue("time_limit", max(0.01, deadline.remaining()))
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = m.ncol, m.nrow
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, clo, chi
    lp.row_lower_, lp.row_upper_ = rlo, rhi
    order = np.lexsort((ri, ci))
    start = np.concatenate([[0], np.cumsum(np.bincount(ci, minlength=m.ncol))])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = start
    lp.a_matrix_.index_ = ri[order]
    lp.a_matrix_.value_ = vi[order]
    h.passModel(lp)
    # The time limit above stops the interior point; None: still in presolve at the deadline.
    if run_highs(h, deadline, interrupts=False) is None:
        return None, "deadline (in presolve)", None
    status = h.modelStatusToString(h.getModelStatus())
    sol = h.getSolution()
    if not sol.dual_valid:
        return None, status, None
    primal = np.array(sol.col_value) if sol.value_valid else None
    return dual_bound(arrays, np.array(sol.row_dual)), status, primal
