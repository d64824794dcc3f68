"""HiGHS (highspy): MILPs, LPs and the model export.

Bound semantics (HiGHS 1.12 documentation of ``HighsInfo.mip_dual_bound``): the
branch-and-bound's global lower bound, valid whenever it is finite and the run
ended in a regular state (optimal, or stopped by a time, iteration, node or
solution limit, or by an interrupt). For a pure LP only an optimal run gives a
value that is also a bound. Anything else (errors, infeasible, unbounded) gives
no bound.

Deadline: HiGHS's own ``time_limit`` is not checked everywhere in presolve
(HiGHS issues #2226, #2478), so the run also subscribes to the simplex, IPM and
MIP interrupt callbacks and interrupts itself once the deadline has passed.
"""

from __future__ import annotations

import time

import numpy as np

from kvsched.csp.backends.options import RawSolution, SolverOptions
from kvsched.csp.model import INF, LinearModel, Row
from kvsched.csp.result import AnytimePoint, SolveStatus
from kvsched.highs import use_highs_threads
from kvsched.stop import Deadline

#: Seconds kept between HiGHS's own time limit and the deadline (reading the solution back).
MARGIN = 0.05


def all_rows(model: LinearModel) -> list[Row]:
    """The model's rows with its indicators as big-M rows (what a MILP back end sees)."""
    return model.rows + model.big_m_rows()


def highs_model(model: LinearModel):  # -> highspy.Highs
    """``model`` loaded into a silent HiGHS instance (indicators as big-M rows)."""
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)  # before anything else, or HiGHS prints its banner
    n = model.num_vars
    inf = highspy.kHighsInf
    lb = np.where(np.isinf(model.lb), -inf, model.lb)
    ub = np.where(np.isinf(model.ub), inf, model.ub)
    h.addVars(n, lb, ub)
    h.changeColsCost(n, np.arange(n, dtype=np.int32), np.asarray(model.obj, dtype=np.float64))
    ints = np.flatnonzero(model.integer).astype(np.int32)
    if ints.size:
        h.changeColsIntegrality(ints.size, ints, np.array([highspy.HighsVarType.kInteger] * ints.size))
    rows = all_rows(model)
    if rows:
        lo = np.array([-inf if r.lo == -INF else r.lo for r in rows])
        hi = np.array([inf if r.hi == INF else r.hi for r in rows])
        starts = np.zeros(len(rows), dtype=np.int32)
        starts[1:] = np.cumsum([r.idx.size for r in rows])[:-1]
        index = np.concatenate([r.idx for r in rows]).astype(np.int32)
        value = np.concatenate([r.coef for r in rows])
        h.addRows(len(rows), lo, hi, index.size, starts, index, value)
    h.changeObjectiveOffset(model.obj_offset)
    return h


def stop_at(h, deadline: Deadline) -> None:  # h: highspy.Highs
    """Make ``h`` interrupt itself once ``deadline`` has passed (simplex, IPM and MIP callbacks)."""

    def check(event) -> None:
        if deadline.expired():
            event.interrupt()

    for callback in (h.cbSimplexInterrupt, h.cbIpmInterrupt, h.cbMipInterrupt):
        callback.subscribe(check)


def _time_limit(deadline: Deadline) -> float:
    return max(0.01, deadline.remaining() - MARGIN) if deadline.bounded else float("inf")


#: Model statuses after which HiGHS's MIP dual bound is a proof.
_BOUND_STATUSES = (
    "kOptimal",
    "kTimeLimit",
    "kIterationLimit",
    "kSolutionLimit",
    "kInterrupt",
    "kObjectiveBound",
    "kObjectiveTarget",
)


def solve_highs(model: LinearModel, options: SolverOptions, deadline: Deadline) -> RawSolution:
    """Solve with HiGHS, warm-started from ``model.hint``, stopping at ``deadline``."""
    import highspy

    h = highs_model(model)
    h.setOptionValue("output_flag", options.log)
    h.setOptionValue("threads", options.threads)
    h.setOptionValue("time_limit", _time_limit(deadline))
    h.setOptionValue("mip_rel_gap", float(options.gap))
    h.setOptionValue("random_seed", int(options.seed))
    points: list[AnytimePoint] = []

    def on_improve(event) -> None:
        d = event.data_out
        bound = d.mip_dual_bound
        points.append(
            AnytimePoint(
                d.running_time, d.objective_function_value, None if not np.isfinite(bound) else bound
            )
        )

    h.cbMipImprovingSolution.subscribe(on_improve)
    stop_at(h, deadline)
    if model.hint is not None:
        sol = highspy.HighsSolution()
        sol.col_value = [float(v) for v in model.hint]
        sol.value_valid = True
        h.setSolution(sol)
    use_highs_threads(options.threads)
    start = time.perf_counter()
    run_status = h.run()
    runtime = time.perf_counter() - start
    if run_status == highspy.HighsStatus.kError:
        raise RuntimeError(f"HiGHS failed to run: {h.modelStatusToString(h.getModelStatus())}")
    ms = h.getModelStatus()
    info = h.getInfo()
    has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
    x = np.asarray(h.getSolution().col_value) if has_sol else None
    obj = info.objective_function_value if has_sol else None
    regular = ms in tuple(getattr(highspy.HighsModelStatus, s) for s in _BOUND_STATUSES)
    optimal = ms == highspy.HighsModelStatus.kOptimal
    # An LP's objective is a bound on its optimum only when it is optimal.
    bound = (info.mip_dual_bound if regular else None) if any(model.integer) else (obj if optimal else None)
    if optimal:
        status = SolveStatus.OPTIMAL
    elif ms == highspy.HighsModelStatus.kInfeasible:
        status = SolveStatus.INFEASIBLE
    else:
        status = SolveStatus.FEASIBLE if has_sol else SolveStatus.UNKNOWN
    stopped = (
        "deadline" if ms in (highspy.HighsModelStatus.kTimeLimit, highspy.HighsModelStatus.kInterrupt) else ""
    )
    return RawSolution(status, x, obj, bound, runtime, tuple(points), stopped)


def lp_relaxation(
    model: LinearModel, options: SolverOptions, deadline: Deadline | None = None
) -> tuple[float, np.ndarray] | None:
    """The LP relaxation of ``model`` by HiGHS: its value and row duals (None if not solved in time).

    Duals follow HiGHS's sign convention: a binding ``<=`` row of a
    minimisation has a non-positive dual.
    """
    import highspy

    deadline = deadline or Deadline.after(options.time_limit)
    if model.num_vars == 0:  # every variable fixed by its window: HiGHS reports an empty model
        return model.obj_offset, np.zeros(len(model.rows))
    h = highs_model(model)
    ints = np.flatnonzero(model.integer).astype(np.int32)
    if ints.size:
        h.changeColsIntegrality(ints.size, ints, np.array([highspy.HighsVarType.kContinuous] * ints.size))
    h.setOptionValue("threads", options.threads)
    h.setOptionValue("time_limit", _time_limit(deadline))
    stop_at(h, deadline)
    use_highs_threads(options.threads)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return h.getInfo().objective_function_value, np.asarray(h.getSolution().row_dual)


def write_model(model: LinearModel, path: str) -> None:
    """Write the MILP form (indicators as big-M rows) as .mps or .lp."""
    h = highs_model(model)
    h.setOptionValue("output_flag", False)
    h.writeModel(path)
