"""What a solve returns: status, objective, proven bound, gap, runtime, schedule."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kvsched.schedule.ir import Schedule


class SolveStatus(StrEnum):
    """Outcome of a solve.

    OPTIMAL: the schedule is proven optimal (within the gap limit, if one was set).
    FEASIBLE: a schedule was found, not proven optimal (time or gap limit).
    INFEASIBLE: the model has no solution.
    UNKNOWN: the limit was hit with no schedule.
    """

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class AnytimePoint:
    """One point of a solver's progress: wall time, incumbent objective, best bound."""

    time: float
    incumbent: float | None
    bound: float | None


def relative_gap(objective: float | None, bound: float | None) -> float | None:
    """(objective - bound) / |objective| (0 for a zero objective that meets its bound)."""
    if objective is None or bound is None:
        return None
    diff = max(0.0, objective - bound)
    if diff == 0.0:
        return 0.0
    return diff / max(abs(objective), 1e-12)


@dataclass(frozen=True, slots=True, eq=False)
class Result:
    """The outcome of :func:`kvsched.csp.solve`, in the style of PyJobShop's ``solve()``.

    Parameters
    ----------
    status
        See :class:`SolveStatus`.
    objective
        The objective of ``schedule``, measured by replaying it through the
        semantic core (``None`` without a schedule).
    best_bound
        A proven lower bound on the optimum of the formulation's schedule class.
    gap
        Relative gap between ``objective`` and ``best_bound``.
    runtime
        Wall-clock seconds, model building included.
    schedule
        The best schedule found, validated; ``None`` only when none was found.
    anytime
        The solver's progress (incumbent and bound over time) where the back end reports it.
    solver, formulation, objective_name
        What was solved, and how.
    stats
        Model size and other facts (variables, rows, horizon, warm start used, ...).
    """

    status: SolveStatus
    objective: float | None
    best_bound: float | None
    gap: float | None
    runtime: float
    schedule: Schedule | None
    anytime: tuple[AnytimePoint, ...] = ()
    solver: str = ""
    formulation: str = ""
    objective_name: str = ""
    stats: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def settled(
        cls, status: SolveStatus, objective: float, bound: float | None, started: float, **rest: Any
    ) -> Result:
        """A result whose gap is computed from ``objective`` and ``bound`` and whose runtime runs from
        ``started`` (a :func:`time.perf_counter` reading) to now; ``rest`` are the other fields."""
        return cls(
            status=status,
            objective=objective,
            best_bound=bound,
            gap=relative_gap(objective, bound),
            runtime=time.perf_counter() - started,
            **rest,
        )

    @property
    def found(self) -> bool:
        return self.schedule is not None

    def summary(self) -> str:
        """One line: status, objective, bound and gap."""
        obj = "-" if self.objective is None else f"{self.objective:.6g}"
        bound = "-" if self.best_bound is None else f"{self.best_bound:.6g}"
        gap = "-" if self.gap is None else f"{100 * self.gap:.2f}%"
        return (
            f"{self.status}: {self.objective_name} {obj}, bound {bound}, gap {gap} "
            f"({self.formulation}/{self.solver}, {self.runtime:.2f} s)"
        )
