"""A solver-neutral mixed-integer linear model.

Formulations build a :class:`LinearModel` once; each back end
(:mod:`kvsched.csp.backends`) translates it. Conditional rows are kept as
*indicators* (``var == value`` implies ``lo <= a.x <= hi``): CP-SAT takes them
natively (``only_enforce_if``), the MILP back ends get big-M rows whose M is the
tightest the variable bounds allow (:meth:`LinearModel.big_m_rows`), never an
arbitrary 1e6.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

INF = float("inf")


@dataclass(frozen=True, slots=True, eq=False)
class Row:
    """``lo <= sum(coef * x[idx]) <= hi``."""

    idx: np.ndarray
    coef: np.ndarray
    lo: float
    hi: float
    name: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class Indicator:
    """``x[var] == value`` implies ``row`` (``var`` must be binary)."""

    var: int
    value: int
    row: Row


@dataclass(eq=False)
class LinearModel:
    """Variables, linear rows, indicator rows and a linear objective (minimised).

    Attributes
    ----------
    lb, ub, integer, obj, names
        Per-variable bounds, integrality, objective coefficient and name.
    obj_offset
        Constant added to the objective.
    hint
        A full assignment to warm-start from (checked with :meth:`violations`).
    """

    name: str = "model"
    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    obj: list[float] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    indicators: list[Indicator] = field(default_factory=list)
    obj_offset: float = 0.0
    hint: np.ndarray | None = None

    @property
    def num_vars(self) -> int:
        return len(self.lb)

    @property
    def num_nonzeros(self) -> int:
        return sum(r.idx.size for r in self.rows) + sum(i.row.idx.size + 1 for i in self.indicators)

    def add_var(self, name: str, lb: float, ub: float, *, integer: bool = True, obj: float = 0.0) -> int:
        """Add one variable and return its index."""
        if lb > ub:
            raise ValueError(f"variable {name}: lower bound {lb} > upper bound {ub}")
        self.lb.append(float(lb))
        self.ub.append(float(ub))
        self.integer.append(integer)
        self.obj.append(float(obj))
        self.names.append(name)
        return len(self.lb) - 1

    def add_row(
        self,
        idx: np.ndarray | list[int],
        coef: np.ndarray | list[float],
        lo: float,
        hi: float,
        name: str = "",
    ) -> None:
        self.rows.append(
            Row(np.asarray(idx, dtype=np.int64), np.asarray(coef, dtype=np.float64), lo, hi, name)
        )

    def add_indicator(
        self,
        var: int,
        value: int,
        idx: np.ndarray | list[int],
        coef: np.ndarray | list[float],
        lo: float,
        hi: float,
        name: str = "",
    ) -> None:
        if not (self.integer[var] and self.lb[var] >= 0 and self.ub[var] <= 1):
            raise ValueError(f"indicator variable {self.names[var]} is not binary")
        row = Row(np.asarray(idx, dtype=np.int64), np.asarray(coef, dtype=np.float64), lo, hi, name)
        self.indicators.append(Indicator(var, int(value), row))

    # ------------------------------------------------------------ derived rows
    def activity_bounds(
        self, row: Row, bounds: tuple[np.ndarray, np.ndarray] | None = None
    ) -> tuple[float, float]:
        """Smallest and largest value ``row``'s left side can take within the variable bounds.

        ``bounds``: the variables' bounds as arrays, when the caller has them (converting the lists
        costs O(variables) a call, and :meth:`big_m_rows` makes one call per indicator).
        """
        lbs, ubs = bounds if bounds is not None else (np.asarray(self.lb), np.asarray(self.ub))
        lb, ub = lbs[row.idx], ubs[row.idx]
        pos = row.coef > 0
        lo = float(np.sum(np.where(pos, row.coef * lb, row.coef * ub)))
        hi = float(np.sum(np.where(pos, row.coef * ub, row.coef * lb)))
        return lo, hi

    def big_m_rows(self) -> list[Row]:
        """Each indicator as at most two plain rows with the tightest valid big-M."""
        out: list[Row] = []
        bounds = (np.asarray(self.lb), np.asarray(self.ub))
        for ind in self.indicators:
            row = ind.row
            amin, amax = self.activity_bounds(row, bounds)
            z = ind.var
            idx = np.append(row.idx, z)
            if row.hi < INF and amax > row.hi:
                m = amax - row.hi
                if not np.isfinite(m):
                    raise ValueError(f"indicator row {row.name}: unbounded activity, no valid big-M")
                # active when z == value: a.x <= hi + m * (1 - active)
                if ind.value == 1:
                    out.append(Row(idx, np.append(row.coef, m), -INF, amax, row.name + ":M+"))
                else:
                    out.append(Row(idx, np.append(row.coef, -m), -INF, row.hi, row.name + ":M+"))
            if row.lo > -INF and amin < row.lo:
                m = row.lo - amin
                if not np.isfinite(m):
                    raise ValueError(f"indicator row {row.name}: unbounded activity, no valid big-M")
                if ind.value == 1:
                    out.append(Row(idx, np.append(row.coef, -m), amin, INF, row.name + ":M-"))
                else:
                    out.append(Row(idx, np.append(row.coef, m), row.lo, INF, row.name + ":M-"))
        return out

    @property
    def integral_objective(self) -> bool:
        """Whether every solution has an integer objective (integer variables and coefficients)."""
        obj = np.asarray(self.obj, dtype=np.float64)
        used = obj != 0
        return (
            bool(np.all(np.asarray(self.integer, dtype=bool)[used]))
            and bool(np.all(obj == np.round(obj)))
            and float(self.obj_offset).is_integer()
        )

    # -------------------------------------------------------------- evaluation
    def objective_value(self, x: np.ndarray) -> float:
        return float(np.dot(self.obj, x)) + self.obj_offset

    def violations(self, x: np.ndarray, tol: float = 1e-6) -> list[str]:
        """Names of the bounds and rows ``x`` breaks (empty: ``x`` is feasible)."""
        out = []
        lb, ub = np.asarray(self.lb), np.asarray(self.ub)
        for k in np.flatnonzero((x < lb - tol) | (x > ub + tol)):
            out.append(f"bound of {self.names[k]} ({x[k]:g} not in [{lb[k]:g}, {ub[k]:g}])")
        integer = np.asarray(self.integer, dtype=bool)
        for k in np.flatnonzero(integer & (np.abs(x - np.round(x)) > tol)):
            out.append(f"integrality of {self.names[k]} ({x[k]:g})")
        for row in self.rows:
            a = float(np.dot(row.coef, x[row.idx]))
            if a < row.lo - tol or a > row.hi + tol:
                out.append(f"row {row.name} ({a:g} not in [{row.lo:g}, {row.hi:g}])")
        for ind in self.indicators:
            if abs(x[ind.var] - ind.value) <= tol:
                row = ind.row
                a = float(np.dot(row.coef, x[row.idx]))
                if a < row.lo - tol or a > row.hi + tol:
                    out.append(f"indicator row {row.name} ({a:g} not in [{row.lo:g}, {row.hi:g}])")
        return out
