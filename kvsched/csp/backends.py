"""Back ends: solve a :class:`~kvsched.csp.model.LinearModel` with HiGHS, CBC or CP-SAT.

Each back end returns a :class:`RawSolution` (values, objective, proven bound,
status, progress). Threads are always set explicitly (CI has 2 cores).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvsched.csp.model import INF, LinearModel, Row
from kvsched.csp.result import AnytimePoint, SolveStatus
from kvsched.csp.scaling import MAX_DIGITS, integer_model
from kvsched.errors import InputError
from kvsched.highs import use_highs_threads


@dataclass(frozen=True, slots=True)
class SolverOptions:
    """Limits and settings shared by every back end.

    Parameters
    ----------
    time_limit
        Wall-clock seconds for the solver itself.
    threads
        Threads (HiGHS, CBC) or workers (CP-SAT).
    gap
        Relative gap at which to stop (0: prove optimality).
    seed
        Random seed where the solver takes one.
    log
        Print the solver's own log.
    """

    time_limit: float = 60.0
    threads: int = 2
    gap: float = 0.0
    seed: int = 0
    log: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class RawSolution:
    status: SolveStatus
    x: np.ndarray | None
    objective: float | None
    bound: float | None
    runtime: float
    anytime: tuple[AnytimePoint, ...] = ()


def _all_rows(model: LinearModel) -> list[Row]:
    return model.rows + model.big_m_rows()


# -------------------------------------------------------------------- HiGHS
def _highs_model(model: LinearModel):  # -> highspy.Highs
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
    rows = _all_rows(model)
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


def solve_highs(model: LinearModel, options: SolverOptions) -> RawSolution:
    """Solve with HiGHS (highspy), warm-started from ``model.hint``."""
    import highspy

    h = _highs_model(model)
    h.setOptionValue("output_flag", options.log)
    h.setOptionValue("threads", options.threads)
    h.setOptionValue("time_limit", float(options.time_limit))
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
    is_mip = any(model.integer)
    bound = info.mip_dual_bound if is_mip else obj
    if bound is not None and not np.isfinite(bound):
        bound = None
    if ms == highspy.HighsModelStatus.kOptimal:
        status = SolveStatus.OPTIMAL
    elif ms == highspy.HighsModelStatus.kInfeasible:
        status = SolveStatus.INFEASIBLE
    else:
        status = SolveStatus.FEASIBLE if has_sol else SolveStatus.UNKNOWN
    return RawSolution(status, x, obj, bound, runtime, tuple(points))


def lp_relaxation(model: LinearModel, options: SolverOptions) -> tuple[float, np.ndarray] | None:
    """The LP relaxation of ``model`` by HiGHS: its value and row duals (None if not solved).

    Duals follow HiGHS's sign convention: a binding ``<=`` row of a
    minimisation has a non-positive dual.
    """
    import highspy

    h = _highs_model(model)
    ints = np.flatnonzero(model.integer).astype(np.int32)
    if ints.size:
        h.changeColsIntegrality(ints.size, ints, np.array([highspy.HighsVarType.kContinuous] * ints.size))
    h.setOptionValue("threads", options.threads)
    h.setOptionValue("time_limit", float(options.time_limit))
    use_highs_threads(options.threads)
    if model.num_vars == 0:  # every variable fixed by its window: HiGHS reports an empty model
        return model.obj_offset, np.zeros(len(model.rows))
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return h.getInfo().objective_function_value, np.asarray(h.getSolution().row_dual)


# ---------------------------------------------------------------------- CBC
def solve_cbc(model: LinearModel, options: SolverOptions) -> RawSolution:
    """Solve with CBC through PuLP, warm-started from ``model.hint``.

    PuLP does not report CBC's best bound; it is known only when CBC proves
    optimality (then it equals the objective).
    """
    import pulp

    prob = pulp.LpProblem(model.name.replace(" ", "_") or "model", pulp.LpMinimize)
    xs = [
        prob.add_variable(
            f"x{k}",
            None if lb == -INF else lb,
            None if ub == INF else ub,
            cat=pulp.LpInteger if integer else pulp.LpContinuous,
        )
        for k, (lb, ub, integer) in enumerate(zip(model.lb, model.ub, model.integer, strict=True))
    ]
    prob += (
        pulp.LpAffineExpression([(xs[k], c) for k, c in enumerate(model.obj) if c != 0]) + model.obj_offset
    )
    for k, row in enumerate(_all_rows(model)):
        expr = pulp.LpAffineExpression(
            [(xs[i], c) for i, c in zip(row.idx.tolist(), row.coef.tolist(), strict=True)]
        )
        if row.lo == row.hi:
            prob += expr == row.lo, f"r{k}"
        else:
            if row.lo > -INF:
                prob += expr >= row.lo, f"r{k}l"
            if row.hi < INF:
                prob += expr <= row.hi, f"r{k}u"
    warm = model.hint is not None
    if warm:
        for v, val in zip(xs, model.hint, strict=True):
            v.setInitialValue(float(round(val)) if v.cat == pulp.LpInteger else float(val))
    with tempfile.TemporaryDirectory() as tmp:
        solver = pulp.PULP_CBC_CMD(
            msg=options.log,
            timeLimit=options.time_limit,
            threads=options.threads,
            gapRel=options.gap if options.gap > 0 else None,
            warmStart=warm,
            keepFiles=False,
            options=[f"randomSeed {max(1, options.seed)}"],
        )
        cwd = os.getcwd()
        os.chdir(tmp)  # CBC's warm-start file lands in the working directory
        try:
            start = time.perf_counter()
            prob.solve(solver)
            runtime = time.perf_counter() - start
        finally:
            os.chdir(cwd)
    sol_status = prob.sol_status
    has_sol = sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    x = np.array([v.value() if v.value() is not None else 0.0 for v in xs]) if has_sol else None
    obj = model.objective_value(x) if x is not None else None
    if sol_status == pulp.LpSolutionOptimal:
        status, bound = SolveStatus.OPTIMAL, obj
    elif prob.status == pulp.LpStatusInfeasible:
        status, bound = SolveStatus.INFEASIBLE, None
    else:
        status, bound = (SolveStatus.FEASIBLE if has_sol else SolveStatus.UNKNOWN), None
    return RawSolution(status, x, obj, bound, runtime)


# ------------------------------------------------------------------- CP-SAT
def _as_int(values: np.ndarray, what: str) -> list[int]:
    rounded = np.round(values)
    if not np.allclose(values, rounded, rtol=0, atol=1e-9):
        raise InputError(
            f"CP-SAT needs integer coefficients; the {what} has fractional ones (use highs or cbc)"
        )
    return [int(v) for v in rounded]


def solve_cpsat(model: LinearModel, options: SolverOptions) -> RawSolution:
    """Solve with OR-Tools CP-SAT; indicators become ``only_enforce_if`` constraints."""
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
    p.max_time_in_seconds = float(options.time_limit)
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

    start = time.perf_counter()
    st = solver.solve(m, Progress())
    runtime = time.perf_counter() - start
    has_sol = st in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    x = scaled.original(np.array([solver.value(v) for v in xs])) if has_sol else None
    objective = unscale(solver.objective_value) + offset if has_sol else None
    bound = unscale(solver.best_objective_bound) + offset if st != cp_model.INFEASIBLE else None
    status = {
        cp_model.OPTIMAL: SolveStatus.OPTIMAL,
        cp_model.FEASIBLE: SolveStatus.FEASIBLE,
        cp_model.INFEASIBLE: SolveStatus.INFEASIBLE,
    }.get(st, SolveStatus.UNKNOWN)
    return RawSolution(status, x, objective, bound, runtime, tuple(points))


BACKENDS: dict[str, Callable[[LinearModel, SolverOptions], RawSolution]] = {
    "highs": solve_highs,
    "cbc": solve_cbc,
    "cpsat": solve_cpsat,
}


def solve_model(model: LinearModel, solver: str, options: SolverOptions) -> RawSolution:
    """Solve ``model`` with the named back end (a model without variables is solved here)."""
    try:
        backend = BACKENDS[solver]
    except KeyError:
        raise InputError(f"--solver: unknown solver {solver!r} (known: {', '.join(BACKENDS)})") from None
    if model.num_vars == 0:
        # Every window is a single slot: nothing to decide (some back ends refuse empty models).
        x = np.zeros(0)
        if model.violations(x):
            return RawSolution(SolveStatus.INFEASIBLE, None, None, None, 0.0)
        return RawSolution(SolveStatus.OPTIMAL, x, model.obj_offset, model.obj_offset, 0.0)
    return backend(model, options)


def export_model(model: LinearModel, path: str | Path) -> None:
    """Write the MILP form (indicators as big-M rows) as .mps or .lp, for Gurobi, CPLEX, ..."""
    p = Path(path)
    if p.suffix.lower() not in (".mps", ".lp"):
        raise InputError(f"--export: {p.name}: the file must end in .mps or .lp")
    h = _highs_model(model)
    h.setOptionValue("output_flag", False)
    h.writeModel(str(p))
