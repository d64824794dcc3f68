"""Regret of every heuristic against the exact optimum, on one instance and one cost model.

Each policy runs in the simulator; its schedule is replayed through the
semantic core and measured. The exact solver is warm-started from the best
heuristic schedule. Regret is reported two ways:

* against the solver's schedule class: ``regret = h - incumbent``, with the
  interval ``[h - incumbent, h - class bound]`` when optimality is not proven;
* *certified*: ``h - L``, where L is a lower bound valid for every legal
  schedule (the combinatorial bounds, and the solver's bound when its
  formulation covers every schedule). No heuristic can be further from the
  true optimum than this.

The time-indexed formulation covers only schedules without chunking, pauses or
evictions, so a heuristic may beat its optimum (negative regret): that is a
finding about the schedule class, and the certified column stays valid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvsched.costmodel import UnitCost
from kvsched.csp import Result, SolverOptions, SolveStatus, solve
from kvsched.csp.bounds import lower_bounds
from kvsched.csp.objectives import objective_function
from kvsched.errors import KvschedError
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.model import Instance
from kvsched.schedule.ir import Schedule
from kvsched.schedule.metrics import run_metrics
from kvsched.schedule.validate import Trace, instance_cost_model, replay


@dataclass(frozen=True, slots=True, eq=False)
class Comparison:
    """The outcome of :func:`compare`.

    Parameters
    ----------
    table
        One row per policy (and one for the solver), indexed by name.
    result
        The solver's result (``None`` when no solver ran).
    objective
        The objective every row is measured in.
    lower_bound
        The best lower bound valid for every legal schedule (``None`` if none is known).
    schedules
        Every schedule compared, by row name.
    """

    table: pd.DataFrame
    result: Result | None
    objective: str
    lower_bound: float | None
    schedules: Mapping[str, Schedule] = field(default_factory=dict)


def _row(name: str, trace: Trace, value: float, kind: str, runtime: float) -> dict[str, Any]:
    m = run_metrics(trace)
    return {
        "name": name,
        "kind": kind,
        "objective": value,
        "mean_latency": m.mean_latency,
        "mean_ttft": m.mean_ttft,
        "p99_ttft": m.p99_ttft,
        "max_tbt": m.max_tbt,
        "tokens_per_s": m.tokens_per_s,
        "makespan": m.makespan,
        "evictions": m.evictions,
        "batches": m.num_batches,
        "runtime_s": runtime,
    }


def compare(
    instance: Instance,
    policies: Sequence[str],
    *,
    objective: str = "total-latency",
    solver: str | None = "highs",
    formulation: str = "time",
    options: SolverOptions | None = None,
    policy_params: Mapping[str, Mapping[str, Any]] | None = None,
) -> Comparison:
    """Run ``policies`` and the exact solver on ``instance`` and tabulate their regret.

    A policy that cannot run the instance (e.g. a whole-prompt policy facing a
    prompt over its budget) is reported in the ``error`` column instead of
    stopping the comparison.
    """
    measure = objective_function(objective)
    policy_params = policy_params or {}
    rows: list[dict[str, Any]] = []
    schedules: dict[str, Schedule] = {}
    for name in policies:
        try:
            sim = simulate(instance, make_policy(name, **policy_params.get(name, {})))
        except KvschedError as exc:
            rows.append({"name": name, "kind": "policy", "error": str(exc)})
            continue
        trace = replay(instance, sim.schedule)  # every schedule is validated
        rows.append(_row(name, trace, measure(trace), "policy", sim.runtime))
        schedules[name] = sim.schedule

    result = None
    if solver is not None:
        ran = [r for r in rows if "objective" in r]
        best = min(ran, key=lambda r: r["objective"])["name"] if ran else None
        result = solve(
            instance,
            objective=objective,
            formulation=formulation,
            solver=solver,
            options=options,
            warm_start=schedules.get(best) if best else None,
        )
        assert result.schedule is not None  # a solve always returns a schedule
        label = f"optimum ({result.formulation}/{solver})"
        trace = replay(instance, result.schedule)
        rows.append(_row(label, trace, measure(trace), "solver", result.runtime))
        schedules[label] = result.schedule

    lower = _global_lower_bound(instance, objective, result)
    table = pd.DataFrame(rows).set_index("name")
    if "error" not in table.columns:
        table["error"] = None
    if result is not None:
        inc, bound = result.objective, result.best_bound
        table["regret"] = table["objective"] - inc
        table["regret_pct"] = 100.0 * table["regret"] / inc if inc else float("nan")
        table["regret_max"] = table["objective"] - bound if bound is not None else float("nan")
    if lower is not None:
        table["certified_max_regret"] = table["objective"] - lower
    return Comparison(table, result, objective, lower, schedules)


def _global_lower_bound(instance: Instance, objective: str, result: Result | None) -> float | None:
    bounds = []
    if isinstance(instance_cost_model(instance), UnitCost):
        bounds.append(lower_bounds(instance).for_objective(objective))
    if (
        result is not None
        and result.best_bound is not None
        and result.stats.get("covers_all_schedules", False)
    ):
        bounds.append(result.best_bound)
    if (
        result is not None
        and result.status == SolveStatus.OPTIMAL
        and result.stats.get("covers_all_schedules")
    ):
        bounds.append(result.objective)
    return max(bounds) if bounds else None
