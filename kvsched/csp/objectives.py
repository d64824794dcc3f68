"""Schedule objectives, measured on a replayed trace (never on solver values).

Every objective is minimised and measured in the instance's time unit. A
solver's own objective value must agree with the replayed one; the solve
driver checks that, so a model/decoder mismatch cannot go unnoticed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvsched.errors import InputError
from kvsched.instances.model import Instance
from kvsched.schedule.validate import Trace, expect_trace


def total_latency(trace: Trace) -> float:
    """Sum over requests of completion minus arrival (seed 004's TEL)."""
    if type(trace) is not Trace:  # an exact type test first: these run once per candidate schedule
        expect_trace(trace)
    st = trace.state
    return float(np.sum(st.completion - st.arrival))


def makespan(trace: Trace) -> float:
    """End of the last batch (seed 003's "latency": the sum of batch times, offline)."""
    if type(trace) is not Trace:
        expect_trace(trace)
    return float(np.max(trace.state.completion)) if trace.state.n else 0.0


def sum_ttft(trace: Trace) -> float:
    """Sum over requests of the time to first token."""
    if type(trace) is not Trace:
        expect_trace(trace)
    st = trace.state
    return float(np.sum(st.first_token - st.arrival))


#: Objectives by the name ``--objective`` takes.
OBJECTIVES: dict[str, Callable[[Trace], float]] = {
    "total-latency": total_latency,
    "makespan": makespan,
    "sum-ttft": sum_ttft,
}


def objective_origin(instance: Instance, name: str) -> float:
    """The time an objective's value counts from: the first arrival for the makespan (an absolute time), 0
    for the sums of differences. Tolerances between two values of an objective scale with the value less its
    origin (:func:`kvsched.csp.certify.tolerance`): relative to an absolute time of 2e6 slots, 1e-6 is two
    slots."""
    if name == "makespan" and len(instance.requests):
        return float(min(r.arrival for r in instance.requests))
    return 0.0


def objective_function(name: str) -> Callable[[Trace], float]:
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise InputError(
            f"--objective: unknown objective {name!r} (known: {', '.join(OBJECTIVES)})"
        ) from None
