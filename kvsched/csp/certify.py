"""From a back end's answer and the bounds at hand to a status and a best bound that are both true.

Rules (docs/bounds.md, "Bound sources and scopes"):

* a bound enters only from a back end's *proven* dual bound (each back end reads
  its own per its documented semantics, see :mod:`kvsched.csp.backends`) or from
  a relaxation valid for every schedule of its scope;
* nothing raises a bound to meet the objective;
* ``optimal`` means a proven bound over the result's scope meets the replayed
  objective within the objective's rounding;
* a bound above a schedule the tool itself has seen and that lies in the
  bound's scope is a bug, and raises :class:`ModelError`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvsched.csp.backends import RawSolution
from kvsched.csp.certificate import Bound, Scope, best_bound
from kvsched.csp.result import SolveStatus

#: Relative tolerance between two objective values that should be equal (float rounding), relative to the
#: value less its origin (:func:`kvsched.csp.objectives.objective_origin`).
OBJECTIVE_RTOL = 1e-6
#: Relative float rounding of an absolute time (a few thousand operations at 2.2e-16 each).
TIME_RTOL = 1e-12


class ModelError(AssertionError):
    """The model disagrees with the semantic core, or a bound with a schedule (a bug in kvsched)."""


def tolerance(value: float, origin: float = 0.0) -> float:
    """How far two values of an objective whose value is about ``value`` may differ by float rounding alone.

    Relative to ``value - origin``, not to ``value``: a makespan of 2,000,012 slots counted from arrivals at
    2,000,000 was "optimal" against a bound of 2,000,010 (1e-6 of the value is two slots), where the brute
    force reaches 2,000,011. The origin's own rounding adds :data:`TIME_RTOL` of it.
    """
    return OBJECTIVE_RTOL * max(1.0, abs(value - origin)) + TIME_RTOL * abs(origin)


@dataclass(frozen=True, slots=True)
class Seen:
    """A validated schedule's objective value and the narrowest scope known to contain it."""

    value: float
    scope: Scope
    what: str = ""


def model_bound(raw: RawSolution, *, scale: float, integral: bool, source: str, scope: Scope) -> Bound | None:
    """The back end's proven bound in instance units (rounded up when the optimum is an integer)."""
    if raw.bound is None or not math.isfinite(raw.bound):
        return None
    value = raw.bound
    if integral:
        value = math.ceil(value - 1e-6)  # the model's optimum is an integer: round the float bound up
    return Bound(value * scale, source, scope)


def check_bounds(bounds: Iterable[Bound], seen: Iterable[Seen], origin: float = 0.0) -> None:
    """Raise :class:`ModelError` if a bound exceeds a seen schedule of its scope (``origin``: the objective's,
    :func:`tolerance`)."""
    seen = list(seen)
    for b in bounds:
        for s in seen:
            if b.holds_for(s.scope) and b.value > s.value + tolerance(s.value, origin):
                raise ModelError(
                    f"the {b.source} bound {b.value!r} exceeds the {s.what or 'known'} schedule of value "
                    f"{s.value!r} in its scope ({b.scope.description}): a bug in kvsched"
                )


def certify(
    value: float,
    scope: Scope,
    bounds: Sequence[Bound],
    seen: Iterable[Seen] = (),
    raw_status: SolveStatus | None = None,
    origin: float = 0.0,
) -> tuple[SolveStatus, Bound | None]:
    """Status and best bound over ``scope`` of a solve whose best schedule replays to ``value``.

    ``raw_status`` is the back end's verdict on its model; an INFEASIBLE one is
    a bug here, since the model was given a feasible warm start. ``origin`` is the
    objective's (:func:`kvsched.csp.objectives.objective_origin`).
    """
    if raw_status == SolveStatus.INFEASIBLE:
        raise ModelError("the model is infeasible although its warm start is feasible")
    check_bounds(bounds, [*seen, Seen(value, scope, "returned")], origin)
    best = best_bound(bounds, scope)
    proven = best is not None and value - best.value <= tolerance(value, origin)
    return (SolveStatus.OPTIMAL if proven else SolveStatus.FEASIBLE), best
