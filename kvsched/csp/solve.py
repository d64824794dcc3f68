"""``solve()``: instance in, :class:`~kvsched.csp.result.Result` out.

The path is data -> model -> back end -> decoded schedule -> replay through the
semantic core -> result. The objective reported is the replayed one; it must
agree with the solver's, and the warm start must satisfy the model, or solve
raises (those are model/decoder bugs, not user errors).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from kvsched.csp.backends import RawSolution, SolverOptions, export_model, solve_model
from kvsched.csp.bounds import lower_bounds
from kvsched.csp.lagrangian import horizon_windows, lagrangian
from kvsched.csp.objectives import objective_function
from kvsched.csp.result import Result, SolveStatus
from kvsched.csp.timeindexed import TimeIndexed
from kvsched.errors import InputError
from kvsched.instances.model import Instance
from kvsched.schedule.core import ScheduleError
from kvsched.schedule.ir import Schedule
from kvsched.schedule.validate import replay

FORMULATIONS = ("time", "batch")
#: Share of the time limit the local search may spend improving the incumbent.
LOCAL_SEARCH_SHARE = 0.1
#: Above this relative gap between the incumbent and the Lagrangian bound the MILP rarely closes it
#: within the limit, so the local search gets a longer leash (20 moves per request without
#: improvement instead of 400). ShareGPT / 10 at KV 20%: 0.4-0.9% better schedules; at 30-40% the
#: gaps are below 2% up to n = 75 and the longer search found nothing.
LONG_SEARCH_GAP = 0.02
#: Nonzeros of the time-indexed model that each second of the time limit pays for. Building runs at
#: about 50,000 nonzeros a second and the LP needs the rest; 200 ShareGPT requests / 10 make 0.5 M.
#: A larger model is not built (200 full-length ShareGPT requests would make about 10^8): the result
#: is the list schedule after local search, with the combinatorial bound.
NONZEROS_PER_SECOND = 20_000
#: Models up to this size are always built, however short the limit.
MIN_NONZEROS = 500_000
#: The solver always gets at least this long, even if preparation used up the limit.
MIN_SOLVER_SECONDS = 1.0
#: Relative tolerance between the solver's objective and the replayed one.
OBJECTIVE_RTOL = 1e-6


class ModelError(AssertionError):
    """The model disagrees with the semantic core (a bug in a formulation or decoder)."""


def time_left(options: SolverOptions, t0: float) -> SolverOptions:
    """``options`` with what is left of its time limit since ``t0``: the limit covers preparation too."""
    spent = time.perf_counter() - t0
    return replace(options, time_limit=max(MIN_SOLVER_SECONDS, options.time_limit - spent))


def settle(
    raw: RawSolution,
    value: float,
    scale: float,
    extra_bound: float | None = None,
    *,
    integral: bool = False,
) -> tuple[SolveStatus, float | None]:
    """Status and best bound (instance units) of a solve whose decoded schedule replays to ``value``.

    ``scale`` converts model units to the instance's; ``extra_bound`` is another
    valid bound in model units (e.g. a Lagrangian one); ``integral``: the
    model's objective takes whole values only. The bound never exceeds the
    value; meeting it proves optimality; a timeout without a solution still has
    the warm start, so it is feasible.
    """
    if raw.status == SolveStatus.INFEASIBLE:
        raise ModelError("the model is infeasible although its warm start is feasible")
    bound = raw.bound
    if bound is not None and integral:
        bound = math.ceil(bound - 1e-6)  # the optimum is an integer: round the solver's float bound up
    if extra_bound is not None:
        bound = extra_bound if bound is None else max(bound, extra_bound)
    bound = None if bound is None else min(bound * scale, value)
    status = raw.status
    if bound is not None and value - bound <= OBJECTIVE_RTOL * max(1.0, abs(value)):
        status = SolveStatus.OPTIMAL
    if status == SolveStatus.UNKNOWN:
        status = SolveStatus.FEASIBLE
    return status, bound


def _unbuilt(
    instance: Instance,
    ti: TimeIndexed,
    hint: np.ndarray,
    hint_source: str,
    size: int,
    solver: str,
    objective: str,
    options: SolverOptions,
    t0: float,
) -> Result:
    """The result when the model is too large to build within the limit: the incumbent and a valid bound."""
    better = ti.improve(hint, seconds=LOCAL_SEARCH_SHARE * options.time_limit, seed=options.seed)
    if ti.value(better) < ti.value(hint):
        hint, hint_source = better, f"{hint_source} + local search"
    schedule = ti.schedule_of(hint)
    schedule = Schedule(schedule.batches, {**schedule.meta, "solver": solver, "objective": objective})
    value = objective_function(objective)(replay(instance, schedule))
    no_solve = RawSolution(SolveStatus.UNKNOWN, None, None, None, 0.0)
    status, bound = settle(no_solve, value, 1.0, lower_bounds(instance).for_objective(objective))
    return Result.settled(
        status,
        value,
        bound,
        t0,
        schedule=schedule,
        solver=solver,
        formulation="time-indexed",
        objective_name=objective,
        stats={
            "warm_start": hint_source,
            "not_built": f"about {size:,} nonzeros, too many to build and solve in {options.time_limit:g} s: "
            "the bound is the combinatorial one",
            "nonzeros_estimate": size,
            "covers_all_schedules": False,
            "combinatorial_bound": bound,
        },
    )


def _time_indexed_starts(ti: TimeIndexed, schedule: Schedule) -> np.ndarray | None:
    """Start slots of ``schedule`` if it lies in the time-indexed class, else None."""
    n = len(ti.prompt)
    starts = np.full(n, -1, dtype=np.int64)
    for b in schedule.batches:
        fresh = b.requests[starts[b.requests] < 0]
        starts[fresh] = round(b.start / ti.slot)
    if (starts < 0).any():
        return None
    try:
        rebuilt = ti.schedule_of(starts)
    except ScheduleError:  # those starts are illegal without the schedule's chunks, pauses or evictions
        return None
    return starts if rebuilt.same_as(schedule, tol=1e-9) else None


def solve(
    instance: Instance,
    *,
    objective: str = "total-latency",
    formulation: str = "time",
    solver: str = "highs",
    options: SolverOptions | None = None,
    warm_start: Schedule | None = None,
    export: str | Path | None = None,
    allow_eviction: bool = True,
    strengthen: bool = True,
) -> Result:
    """Find a hindsight-optimal schedule, or the best one found and a proven bound.

    Parameters
    ----------
    objective
        ``total-latency`` (sum of completion minus arrival), ``makespan`` or ``sum-ttft``.
    formulation
        ``time``: the time-indexed model (unit time, no chunking or eviction);
        ``batch``: the batch-indexed model (every legal schedule: chunking,
        eviction, arrivals; unit or infermax-linear time; block size 1).
    solver
        ``highs``, ``cbc`` or ``cpsat``.
    warm_start
        A schedule to start from (used when it lies in the formulation's class
        and beats the built-in list schedules).
    export
        Also write the model as ``.mps`` or ``.lp``.
    allow_eviction
        ``batch`` only: ``False`` restricts it to eviction-free schedules.
    strengthen
        ``time`` only: improve the incumbent by local search and narrow the
        start windows by LP reduced costs (:mod:`kvsched.csp.lagrangian`).
        ``False`` gives the baseline: windows from the objective alone.
    """
    options = options or SolverOptions()
    measure = objective_function(objective)
    if formulation not in FORMULATIONS:
        raise InputError(
            f"--formulation: unknown formulation {formulation!r} (known: {', '.join(FORMULATIONS)})"
        )
    if formulation == "batch":
        from kvsched.csp.batchindexed import solve_batch

        return solve_batch(
            instance,
            objective=objective,
            solver=solver,
            options=options,
            warm_start=warm_start,
            export=export,
            allow_eviction=allow_eviction,
        )
    t0 = time.perf_counter()
    ti = TimeIndexed(instance, objective)
    hint = ti.heuristic_starts()
    hint_source = "list schedule"
    if warm_start is not None:
        ws = _time_indexed_starts(ti, warm_start)
        if ws is not None and ti.value(ws) < ti.value(hint):
            hint, hint_source = ws, "warm start"
    upper = ti.value(hint)
    size = ti.nonzeros(horizon_windows(ti, hint) if strengthen else ti.windows(upper))
    if size > max(MIN_NONZEROS, NONZEROS_PER_SECOND * options.time_limit):
        return _unbuilt(instance, ti, hint, hint_source, size, solver, objective, options, t0)
    lag = windows = None
    if strengthen:
        lag = lagrangian(ti, hint, options)
        if lag is None or lag.bound < upper:  # a bound that meets the incumbent needs no search
            wide = lag is None or upper - lag.bound > LONG_SEARCH_GAP * upper
            better = ti.improve(
                hint,
                stall=max(400, 20 * len(instance)) if wide else 400,
                seconds=LOCAL_SEARCH_SHARE * options.time_limit,
                seed=options.seed,
            )
            if ti.value(better) < upper:
                hint, hint_source, upper = better, f"{hint_source} + local search", ti.value(better)
        if lag is not None:
            windows = lag.windows(ti, upper, hint)
    model = ti.build(upper, hint, windows=windows)
    bad = model.violations(model.hint)
    if bad:
        raise ModelError(f"the warm start violates the model: {bad[0]}")
    if export is not None:
        export_model(model, export)
    build_time = time.perf_counter() - t0
    raw = solve_model(model, solver, time_left(options, t0))

    starts = ti.starts_from(raw.x) if raw.x is not None else hint
    schedule = ti.schedule_of(starts)
    schedule = Schedule(
        schedule.batches,
        {**schedule.meta, "solver": solver, "objective": objective, "status": str(raw.status)},
    )
    trace = replay(instance, schedule)  # strict: raises if the decoded schedule is illegal
    value = measure(trace)
    slot = ti.slot
    if raw.objective is not None and abs(raw.objective * slot - value) > OBJECTIVE_RTOL * max(
        1.0, abs(value)
    ):
        raise ModelError(f"solver objective {raw.objective * slot!r} differs from the replayed {value!r}")
    status, bound = settle(
        raw, value, slot, None if lag is None else lag.bound, integral=model.integral_objective
    )
    stats = {
        "variables": model.num_vars,
        "rows": len(model.rows),
        "nonzeros": model.num_nonzeros,
        "upper_bound": upper * slot,
        "warm_start": hint_source,
        "build_seconds": build_time,
        "horizon": max(w.last for w in ti._windows) + int(ti.output.max()),
        "mean_window": float(np.mean([w.last - w.first for w in ti._windows])),
        "lagrangian_bound": None if lag is None else lag.bound * slot,
        # The class excludes chunking, pauses and evictions: its bound is not a bound on every schedule.
        "covers_all_schedules": False,
        # Valid for every legal schedule, not only the formulation's class.
        "combinatorial_bound": lower_bounds(instance).for_objective(objective),
    }
    return Result.settled(
        status,
        value,
        bound,
        t0,
        schedule=schedule,
        anytime=raw.anytime,
        solver=solver,
        formulation="time-indexed",
        objective_name=objective,
        stats=stats,
    )
