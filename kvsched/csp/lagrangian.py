"""Reduced-cost windows for the time-indexed model: a valid bound and narrow start windows.

Dualise the per-slot capacity rows of the time-indexed model with multipliers
``y >= 0``. What is left decomposes by request: each picks its cheapest start
``k >= e_i`` at cost ``c_i(k) + sum_t y_t use_i(t - k)``, where ``c_i`` is its
share of a separable objective (total latency, sum of TTFT) and ``use_i`` its
resource profile. For *every* schedule of the class (any start, no window) and
any ``y >= 0``,

    objective >= L(y) + sum_i rc_i(p_i),   L(y) = sum_i min_k (...) - sum_t y_t cap_t,

with reduced costs ``rc_i(k) >= 0``. So ``L(y)`` is a lower bound, and a
schedule no worse than an incumbent of value UB starts each request where
``rc_i(k) <= UB - L(y)``: those starts are its window. Good multipliers are the
LP duals of the model over a short horizon (the incumbent's makespan); validity
does not depend on them being optimal, and they stay valid when the incumbent
improves later (:meth:`Lagrangian.windows` takes the new UB). On ShareGPT-shaped
instances this cuts the windows that the objective alone allows by 5-50x (575
-> 85 slots on average for 30 requests), which is what lets the MILP prove
100-request instances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvsched.csp.backends import SolverOptions, lp_relaxation
from kvsched.csp.timeindexed import TimeIndexed, Window
from kvsched.stop import Deadline

#: Slack on reduced costs, against LP round-off.
RC_TOL = 1e-6


@dataclass(frozen=True, slots=True, eq=False)
class Lagrangian:
    """A Lagrangian lower bound (slots) and each request's reduced cost per start slot.

    ``starts[i]`` are the slots ``e_i .. K`` evaluated (past ``K`` no
    multiplier applies and the cost grows by one per slot), ``cost[i]`` the
    Lagrangian cost of starting there and ``least[i]`` its minimum.
    """

    bound: float
    starts: tuple[np.ndarray, ...]
    cost: tuple[np.ndarray, ...]
    least: np.ndarray
    tail: np.ndarray  # cost of a start at slot 0 without multipliers (start k costs k + tail)

    def windows(self, ti: TimeIndexed, upper_bound: float, hint: np.ndarray) -> list[Window]:
        """Start windows that keep every schedule of value <= ``upper_bound`` (slots), and ``hint``."""
        base = ti.windows(upper_bound)
        # The model sees the hint with identical requests' starts sorted (its symmetry rows).
        hint = ti.canonical(hint)
        slack = upper_bound - self.bound + RC_TOL * max(1.0, abs(upper_bound))
        out = []
        for i, (ks, cost) in enumerate(zip(self.starts, self.cost, strict=True)):
            keep = ks[cost - self.least[i] <= slack]
            last = int(keep.max())
            if last == ks[-1]:
                last = max(last, math.floor(self.least[i] + slack - self.tail[i]))
            first = max(base[i].first, int(keep.min()))
            last = min(base[i].last, last)
            # Widening a window is always safe; the incumbent must stay a solution.
            out.append(Window(min(first, int(hint[i])), max(last, int(hint[i]))))
        return out


def horizon_windows(ti: TimeIndexed, hint: np.ndarray) -> list[Window]:
    """The objective's start windows cut to ``hint``'s makespan: the LP the duals come from."""
    horizon = int(np.max(hint + ti.output))
    return [
        Window(w.first, max(w.first, min(w.last, horizon - int(o))))
        for w, o in zip(ti.windows(ti.value(hint)), ti.output, strict=True)
    ]


def lagrangian(
    ti: TimeIndexed, hint: np.ndarray, options: SolverOptions, deadline: Deadline | None = None
) -> Lagrangian | None:
    """The Lagrangian bound of ``ti`` with the LP duals of its model up to ``hint``'s makespan.

    Returns None for the makespan (not a sum over requests) or when the LP
    does not solve within the time limit.
    """
    if ti.objective == "makespan":
        return None
    upper_bound = ti.value(hint)
    built = ti.build(upper_bound, None, windows=horizon_windows(ti, hint), symmetry=False)
    lp = lp_relaxation(built.model, options, deadline)
    if lp is None:
        return None
    _, duals = lp
    last_slot = max((t for _, _, t in built.resource_rows), default=0) + 1
    y = {res: np.zeros(last_slot) for res in ti.capacities()}
    for row, res, t in built.resource_rows:
        y[res][t] = max(0.0, -duals[row])  # HiGHS: a binding <= row of a minimisation has a dual <= 0

    starts, costs = [], []
    for i in range(len(ti.prompt)):
        first = int(ti.earliest[i])
        ks = np.arange(first, max(first, last_slot) + 1)  # past last_slot no multiplier applies
        cost = ti.start_cost(i, ks).astype(np.float64)
        for res, yr in y.items():
            prof = ti.profile(i, res).astype(np.float64)
            padded = np.concatenate([yr[first:], np.zeros(len(ks) + prof.size)])
            cost += np.correlate(padded, prof, mode="valid")[: len(ks)]
        starts.append(ks)
        costs.append(cost)
    least = np.array([c.min() for c in costs])
    bound = float(least.sum() - sum(ti.capacities()[res] * yr.sum() for res, yr in y.items()))
    bound = math.ceil(bound - RC_TOL)  # arrivals are whole slots: every objective value is an integer
    tail = np.array([ti.start_cost(i, np.array([0]))[0] for i in range(len(ti.prompt))], dtype=np.float64)
    return Lagrangian(bound, tuple(starts), tuple(costs), least, tail)
