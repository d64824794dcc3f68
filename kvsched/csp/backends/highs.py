"""HiGHS (highspy): MILPs, LPs and the model export.

Bound semantics (HiGHS 1.12 documentation of ``HighsInfo.mip_dual_bound``): the
branch-and-bound's global lower bound, valid whenever it is finite and the run
ended in a regular state (optimal, or stopped by a time, iteration, node or
solution limit, or by an interrupt). For a pure LP only an optimal run gives a
value that is also a bound. Anything else (errors, infeasible, unbounded) gives
no bound.

Deadline: HiGHS's own ``time_limit`` is not checked everywhere in presolve
(HiGHS issues #2226, #2478), so every run goes through
:func:`kvsched.highs.run_highs`: it interrupts itself from the simplex, IPM and
MIP callbacks once the deadline has passed, and a run still inside presolve at
the deadline is left behind (no solution, no bound) rather than waited for. A
model too large for its presolve to fit the time left is solved without it
(:data:`PRESOLVE_NONZEROS_PER_SECOND`).
"""

from __future__ import annotations

import time

import numpy as np

from kvsched.csp.backends.options import RawSolution, SolverOptions
from kvsched.csp.model import INF, LinearModel, Row
from kvsched.csp.result import AnytimePoint, SolveStatus
from kvsched.highs import run_highs, use_highs_threads
from kvsched.stop import Deadline

#: Seconds kept between HiGHS's own time limit and the deadline (reading the solution back).
MARGIN = 0.05
#: Nonzeros that each second left pays for before HiGHS's presolve is switched off. Presolve does not
#: stop at the time limit (above) and ran at 24,000 nonzeros a second on the batch-indexed model of 6
#: chunked requests (1.5M nonzeros, 62 s) and at 64,000-76,000 on models of 50,000-100,000 nonzeros
#: (0.7-1.6 s, 2 cores): above this rate it would take about half the time left, or all of it.
PRESOLVE_NONZEROS_PER_SECOND = 10_000


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
    if deadline.bounded and h.getNumNz() > PRESOLVE_NONZEROS_PER_SECOND * deadline.remaining():
        h.setOptionValue("presolve", "off")
    if model.hint is not None:
        sol = highspy.HighsSolution()
        sol.col_value = [float(v) for v in model.hint]
        sol.value_valid = True
        h.setSolution(sol)
    use_highs_threads(options.threads)
    start = time.perf_counter()
    run_status = run_highs(h, deadline)
    runtime = time.perf_counter() - start
    if run_status is None:  # still in presolve at the deadline: nothing HiGHS found can be read
        return RawSolution(SolveStatus.UNKNOWN, None, None, None, runtime, tuple(points), "deadline")
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
    use_highs_threads(options.threads)
    if run_highs(h, deadline) is None or h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return h.getInfo().objective_function_value, np.asarray(h.getSolution().row_dual)


def write_model(model: LinearModel, path: str) -> None:
    """Write the MILP form (indicators as big-M rows) as .mps or .lp."""
    h = highs_model(model)
    h.setOptionValue("output_flag", False)
    h.writeModel(path)
