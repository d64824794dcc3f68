"""OR-Tools CP-SAT: indicators become ``only_enforce_if`` constraints.

Bound semantics (``CpSolverResponse.best_objective_bound`` in cp_model.proto):
a proven lower bound when the status is OPTIMAL or FEASIBLE. When the search
stops with UNKNOWN (no solution within the limit) the response carries no
usable bound (on a 20-request model it reported 2,440 against a known schedule
of 441), so none is read. Decimal models go through the exact integer scaling
of :mod:`kvsched.csp.scaling`.

Deadline: ``max_time_in_seconds`` is set to what is left, and a timer calls
``stop_search()`` at the deadline in case the limit is not checked in time.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from kvsched.csp.backends.options import RawSolution, SolverOptions
from kvsched.csp.model import INF, LinearModel, Row
from kvsched.csp.result import AnytimePoint, SolveStatus
from kvsched.csp.scaling import MAX_DIGITS, integer_model
from kvsched.errors import InputError
from kvsched.stop import Deadline, wait_timeout


def _as_int(values: np.ndarray, what: str) -> list[int]:
    rounded = np.round(values)
    if not np.allclose(values, rounded, rtol=0, atol=1e-9):
        raise InputError(
            f"CP-SAT needs integer coefficients; the {what} has fractional ones (use highs or cbc)"
        )
    return [int(v) for v in rounded]


def solve_cpsat(model: LinearModel, options: SolverOptions, deadline: Deadline) -> RawSolution:
    """Solve with CP-SAT, hinted with ``model.hint``, stopping at ``deadline``."""
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    original, scaled = model, integer_model(model)
    if scaled is None:
        raise InputError(
            "CP-SAT needs integer data: this model has continuous variables outside difference rows or "
            f"more than {MAX_DIGITS} decimal digits, or values too large once scaled (use highs or cbc)"
        )
    model = scaled.model
    xs = [
        m.new_int_var(int(np.ceil(lb)), int(np.floor(ub)), name)
        for lb, ub, name in zip(model.lb, model.ub, model.names, strict=True)
    ]

    def add(row: Row):
        coefs = _as_int(row.coef, f"row {row.name}")
        expr = cp_model.LinearExpr.weighted_sum([xs[i] for i in row.idx.tolist()], coefs)
        lo = -(2**62) if row.lo == -INF else int(np.ceil(row.lo - 1e-9))
        hi = 2**62 if row.hi == INF else int(np.floor(row.hi + 1e-9))
        return m.add_linear_constraint(expr, lo, hi)

    for row in model.rows:
        add(row)
    for ind in model.indicators:
        lit = xs[ind.var] if ind.value == 1 else xs[ind.var].Not()
        add(ind.row).only_enforce_if(lit)
    obj = _as_int(np.asarray(model.obj), "objective")
    m.minimize(cp_model.LinearExpr.weighted_sum(xs, obj))
    if model.hint is not None:
        for v, val in zip(xs, model.hint, strict=True):
            m.add_hint(v, round(val))
    solver = cp_model.CpSolver()
    p = solver.parameters
    if deadline.bounded:
        p.max_time_in_seconds = max(0.01, deadline.remaining())
    p.num_workers = max(1, options.threads)
    p.relative_gap_limit = float(options.gap)
    p.random_seed = int(options.seed)
    p.log_search_progress = options.log
    points: list[AnytimePoint] = []
    offset = original.obj_offset
    unscale = scaled.objective

    class Progress(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            points.append(
                AnytimePoint(
                    self.wall_time,
                    unscale(self.objective_value) + offset,
                    unscale(self.best_objective_bound) + offset,
                )
            )

    timer = None
    wait = wait_timeout(deadline.remaining())  # None: no deadline, or one past what a wait may be given
    if wait is not None:
        timer = threading.Timer(wait, solver.stop_search)
        timer.daemon = True
        timer.start()
    start = time.perf_counter()
    try:
        st = solver.solve(m, Progress())
    finally:
        if timer is not None:
            timer.cancel()
    runtime = time.perf_counter() - start
    has_sol = st in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    x = scaled.original(np.array([solver.value(v) for v in xs])) if has_sol else None
    objective = unscale(solver.objective_value) + offset if has_sol else None
    # The bound is a proof only next to a solution (OPTIMAL or FEASIBLE); see the module docstring.
    bound = unscale(solver.best_objective_bound) + offset if has_sol else None
    status = {
        cp_model.OPTIMAL: SolveStatus.OPTIMAL,
        cp_model.FEASIBLE: SolveStatus.FEASIBLE,
        cp_model.INFEASIBLE: SolveStatus.INFEASIBLE,
    }.get(st, SolveStatus.UNKNOWN)
    stopped = (
        ""
        if st in (cp_model.OPTIMAL, cp_model.INFEASIBLE)
        else ("deadline" if deadline.expired() else "limit")
    )
    return RawSolution(status, x, objective, bound, runtime, tuple(points), stopped)
