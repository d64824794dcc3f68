"""The bounds portfolio: every cheap bound that applies to an instance and objective, under one deadline.

>>> bounds = portfolio(instance, "total-latency")                  # doctest: +SKIP
>>> best(instance, "total-latency").value                           # doctest: +SKIP

Every :class:`~kvsched.csp.certificate.Bound` returned holds for every legal
schedule of the instance (scope ``ALL``): chunking, pauses, idling, evictions
and budgets included. The arguments are in the modules named by each source and
in ``docs/bounds.md``. Stages run cheapest first and a stage is skipped once the
deadline has passed, so a tight deadline returns fewer (never wrong) bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvsched.costmodel import UnitCost
from kvsched.csp.bounds import batch_count, mbt
from kvsched.csp.bounds.combinatorial import lower_bounds
from kvsched.csp.bounds.seconds import SecondsBounds, Tokens, seconds_bounds
from kvsched.csp.bounds.separable import separable_forms, tau_max
from kvsched.csp.certificate import Bound, Scope
from kvsched.csp.objectives import objective_function
from kvsched.instances.model import Instance, expect_instance
from kvsched.schedule.validate import instance_cost_model
from kvsched.stop import Deadline, DeadlineReached


@dataclass(frozen=True, slots=True)
class SecondsReport:
    """The best seconds-based bounds over the separable forms tried, and what the minorant gave up."""

    bounds: SecondsBounds
    forms_tried: int
    #: Largest relative gap between the cost model's token term and its convex minorant (0: exact).
    minorant_gap: float


def seconds_report(instance: Instance, deadline: Deadline | None = None) -> SecondsReport | None:
    """Seconds-based bounds under each separable form of the instance's cost model (None if unsupported)."""
    deadline = deadline or Deadline.never()
    forms = separable_forms(instance_cost_model(instance), tau_max(instance))
    if not forms:
        return None
    tok = Tokens.of(instance)
    fields = ("isolated", "work_area", "mbt", "makespan", "ttft_isolated", "ttft_mbt")
    best: dict[str, float] = dict.fromkeys(fields, -math.inf)
    mixture = (1.0, 0.0, 0.0)
    tried = 0
    for form in forms:
        if tried and deadline.expired():
            break
        got = seconds_bounds(form, tok, deadline=deadline)
        tried += 1
        if got.mbt > best["mbt"]:
            mixture = got.mixture
        for name in fields:
            best[name] = max(best[name], getattr(got, name))
    gap = max(form.minorant_gap for form in forms)
    return SecondsReport(SecondsBounds(**best, minorant_gap=gap, mixture=mixture), tried, gap)


def _unit_bounds(instance: Instance, objective: str, slot: float, deadline: Deadline) -> list[Bound]:
    lb = lower_bounds(instance)
    out: list[Bound] = []
    if objective == "total-latency":
        out += [Bound(lb.isolated, "isolated"), Bound(lb.total_latency, "kv-area")]
    elif objective == "makespan":
        out.append(Bound(lb.makespan, "kv-area"))
    else:
        out.append(Bound(lb.sum_ttft, "isolated"))
    req = mbt.RequestArrays.of(instance, slot)
    caps = mbt.budgets(instance)
    arrivals = float(req.arrival.sum()) * slot
    for mix in mbt.MIXTURES:
        try:
            _mixture_bounds(out, req, caps, mix, objective, slot, arrivals, deadline)
        except DeadlineReached:  # this stage would overrun: keep the bounds already proven
            break
    return out


def _mixture_bounds(
    out: list[Bound],
    req: mbt.RequestArrays,
    caps: tuple,
    mix: tuple[float, float, float],
    objective: str,
    slot: float,
    arrivals: float,
    deadline: Deadline,
) -> None:
    """Append the bounds of one resource mixture to ``out`` as each is proven (DeadlineReached may interrupt)."""
    deadline.check()
    if objective == "sum-ttft":
        jobs = mbt.first_token_jobs(req, mix, caps)
    else:
        jobs = mbt.completion_jobs(req, mix, caps)
    if jobs is None:
        return
    suffix = "" if mix == (1.0, 0.0, 0.0) else f" {_mix_name(mix)}"
    if objective == "makespan":
        out.append(Bound(slot * mbt.slotted_makespan(jobs), "area" + suffix))
        return
    out.append(Bound(slot * mbt.mbt_sum(jobs, deadline) - arrivals, "mean-busy-time" + suffix))
    if objective == "total-latency":
        # Sorted completions: SRPT on the machine with release dates, against each request alone.
        area = np.maximum(mbt.slotted_area(jobs, deadline), np.sort(req.alone))
        out.append(Bound(slot * float(area.sum()) - arrivals, "area (release dates)" + suffix))


def _mix_name(mix: tuple[float, float, float]) -> str:
    parts = [f"{w:g} {r}" for w, r in zip(mix, ("kv", "tokens", "prefill"), strict=True) if w]
    return "(" + " + ".join(parts) + ")"


def _seconds_bounds(report: SecondsReport, objective: str) -> list[Bound]:
    b = report.bounds
    if objective == "total-latency":
        return [
            Bound(b.isolated, "isolated (seconds)"),
            Bound(b.work_area, "work-area (seconds)"),
            Bound(b.mbt, "mean-busy-time (seconds)"),
        ]
    if objective == "makespan":
        return [Bound(b.makespan, "work (seconds)")]
    return [Bound(b.ttft_isolated, "isolated (seconds)"), Bound(b.ttft_mbt, "mean-busy-time (seconds)")]


def portfolio(instance: Instance, objective: str, deadline: Deadline | None = None) -> list[Bound]:
    """Every cheap lower bound on ``objective`` for ``instance``, each valid for every legal schedule.

    Parameters
    ----------
    objective
        ``"total-latency"``, ``"makespan"`` or ``"sum-ttft"``.
    deadline
        Stages not started by then are skipped (the first one always runs: it takes milliseconds).
    """
    objective_function(objective)  # one clear error for an unknown name
    # A request built in Python with a zero length or a NaN arrival is one error here, not a wrong bound.
    expect_instance(instance)
    deadline = deadline or Deadline.never()
    if not instance.requests:
        return [Bound(0.0, "empty")]
    cost = instance_cost_model(instance)
    out: list[Bound] = []
    if isinstance(cost, UnitCost):
        # The slotted bounds of mbt match the seconds machinery's continuous ones here to within a slot per
        # request (flooring arrivals against not), at a fraction of the cost.
        out += _unit_bounds(instance, objective, cost.slot, deadline)
        return [b for b in out if math.isfinite(b.value)]
    report = seconds_report(instance, deadline)
    if report is not None:
        out += _seconds_bounds(report, objective)
        if objective == "total-latency" and not deadline.expired():
            # F x (the unit copy's batch count) + shortest-first own work (kvsched.csp.bounds.batch_count).
            unit = max(b.value for b in portfolio(batch_count.unit_copy(instance), objective, deadline))
            value = batch_count.batch_count_bound(instance, unit)
            if value:  # 0 when the arrivals outweigh it
                out.append(Bound(value, batch_count.SOURCE))
    return [b for b in out if math.isfinite(b.value)] or [Bound(0.0, "trivial", Scope.ALL)]


def best(instance: Instance, objective: str, deadline: Deadline | None = None) -> Bound:
    """The largest bound of :func:`portfolio` (``Bound(0, "trivial")`` when nothing applies)."""
    return max(portfolio(instance, objective, deadline), key=lambda b: b.value)
