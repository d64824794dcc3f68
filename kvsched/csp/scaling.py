"""Exact integer scaling of a model with decimal data, for CP-SAT.

CP-SAT takes integer variables and integer coefficients only. The batch-indexed
model under a linear cost model (seed 003's ``infermax-linear``) has neither:
its batch start and end times and completion times are continuous, and batch
durations carry decimal coefficients (e.g. 0.05 per KV token read). This module
rewrites such a model into an integer one *without changing its optimum*:

* time is counted in units of ``1 / S`` with ``S = 10**d``, the smallest power of
  ten that makes every coefficient, bound and objective coefficient a multiple
  of ``1 / S`` (``d <= MAX_DIGITS``, and no scaled value above 2**53); each continuous ``x`` becomes an integer
  ``y = S x`` and every row is multiplied by ``S``;
* this is exact when the continuous variables form a system of *difference
  constraints*: every row has at most two of them, with coefficients +1 and
  -1. Fix the integer variables; what is left is a network matrix (totally
  unimodular) with right-hand sides on the ``1 / S`` grid, so some optimal
  solution has every continuous value on that grid, and the integer model keeps
  it. The batch-indexed model's time rows are of that form (``E_j = tau_j +
  duration``, ``tau_j >= E_{j-1}``, ``tau_j >= a_i``, ``F_i >= E_j``).

Models of any other form are refused (:func:`integer_model` returns ``None``),
so the caller can say plainly that CP-SAT cannot take them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvsched.csp.model import INF, Indicator, LinearModel, Row

#: Most decimal digits the data may have (the default infermax-linear coefficients need 10).
MAX_DIGITS = 12
#: Largest magnitude a scaled coefficient or bound may reach (doubles are exact integers up to 2**53).
MAX_MAGNITUDE = 2.0**53
#: Units in the last place of a value that may separate it from a multiple of 10**-d (float rounding).
ULPS = 64
#: Rounding slack on scaled variable bounds.
TOL = 1e-6


@dataclass(frozen=True, slots=True)
class IntegerModel:
    """``model`` with every continuous variable counted in units of ``1 / scale``.

    Attributes
    ----------
    model
        The integer model (all variables integer, all data integral).
    scale
        ``S``: a continuous variable's value is its integer variable's value / S.
    obj_scale
        The integer model's objective is the original one's (offset excluded) times this.
    continuous
        Which variables of the original model were continuous.
    """

    model: LinearModel
    scale: int
    obj_scale: int
    continuous: np.ndarray

    def original(self, y: np.ndarray) -> np.ndarray:
        """The original model's assignment from the integer model's."""
        x = np.asarray(y, dtype=np.float64).copy()
        x[self.continuous] /= self.scale
        return x

    def objective(self, scaled: float) -> float:
        """The original objective (offset excluded) from the integer model's."""
        return scaled / self.obj_scale


def _digits(values: np.ndarray) -> int | None:
    """Fewest decimal digits that make every value whole, or None beyond :data:`MAX_DIGITS`."""
    v = np.abs(values[np.isfinite(values)])
    for d in range(MAX_DIGITS + 1):
        s = v * 10**d
        # Whole up to the rounding the data carry: a few units in the last place of each value.
        if np.all(np.abs(s - np.round(s)) <= ULPS * np.spacing(v) * 10**d):
            return d
    return None


def _difference_row(row: Row, continuous: np.ndarray) -> bool:
    coef = row.coef[continuous[row.idx]]
    if coef.size == 0:
        return True
    if not np.all(np.isin(coef, (-1.0, 1.0))) or coef.size > 2:
        return False
    return coef.size == 1 or coef.sum() == 0.0


def integer_model(model: LinearModel) -> IntegerModel | None:
    """The exact integer rewrite of ``model``, or None when it is not of the form above.

    A model that is integral already comes back with scale 1.
    """
    continuous = ~np.asarray(model.integer, dtype=bool)
    rows = model.rows + [ind.row for ind in model.indicators]
    if not all(_difference_row(r, continuous) for r in rows):
        return None
    data = [np.asarray(model.obj, dtype=np.float64), np.asarray(model.lb)[continuous]]
    data += [np.asarray(model.ub)[continuous]]
    for r in rows:
        data += [r.coef, np.array([r.lo, r.hi])]
    d = _digits(np.concatenate(data))
    if d is None:
        return None
    s = 10**d

    def scaled(row: Row) -> Row:
        return Row(
            row.idx,
            np.round(row.coef * np.where(continuous[row.idx], 1.0, s)),
            -INF if row.lo == -INF else round(row.lo * s),
            INF if row.hi == INF else round(row.hi * s),
            row.name,
        )

    factor = np.where(continuous, s, 1)
    lb = np.asarray(model.lb, dtype=np.float64) * factor
    ub = np.asarray(model.ub, dtype=np.float64) * factor
    obj = np.asarray(model.obj, dtype=np.float64) * np.where(continuous, 1.0, s)
    d_obj = _digits(obj)
    if d_obj is None:
        return None
    obj = obj * 10**d_obj
    out = LinearModel(
        name=model.name,
        lb=np.ceil(lb - TOL).tolist(),
        ub=np.floor(ub + TOL).tolist(),
        integer=[True] * model.num_vars,
        obj=np.round(obj).tolist(),
        names=list(model.names),
        rows=[scaled(r) for r in model.rows],
        indicators=[Indicator(i.var, i.value, scaled(i.row)) for i in model.indicators],
        obj_offset=0.0,
        hint=None if model.hint is None else np.round(np.asarray(model.hint) * factor),
    )
    data = [np.asarray(out.lb), np.asarray(out.ub), np.asarray(out.obj)]
    data += [np.concatenate([r.coef, [r.lo, r.hi]]) for r in out.rows + [i.row for i in out.indicators]]
    values = np.abs(np.concatenate(data))
    if values[np.isfinite(values)].max(initial=0.0) > MAX_MAGNITUDE:
        return None
    return IntegerModel(out, s, s * 10**d_obj, continuous)
