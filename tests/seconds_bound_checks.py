"""What every LP bound in seconds must pass (the batch-rate and processor-sharing LPs): below the brute-force
optimum on tiny instances, below random legal schedules through the core, below every policy's schedule.

Each check takes ``bounds``, a function from an instance to the bound's values on a few grids."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from kvsched.csp.objectives import OBJECTIVES
from kvsched.errors import KvschedError
from kvsched.heuristics import POLICIES, make_policy, simulate
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.validate import instance_cost_model, replay
from tests.brute import brute_force
from tests.strategies import budget_trio, build_legal_schedule

#: A stepped token term with a negative step, a hinge and a linear model (unit-scale times).
STEPPED = TimeModel(
    "calibrated", {"a0": 0.6, "a1": 0.05, "step2": 0.5, "step3": -0.4, "b1": 0.02, "p1": 0.01}
)
HINGE = TimeModel("hinge", {"c": 1.0, "a": 0.3, "b0": 2.0})
LINEAR = TimeModel("infermax-linear", {"a0": 0.5, "a1": 0.1, "b0": 0.2, "b1": 0.05, "p0": 0.3, "p1": 0.02})
#: The refill route cheaper than a decode (large KV read per decode, cheap prefill attention).
REFILL = TimeModel("infermax-linear", {"a0": 0.2, "a1": 0.01, "b0": 0.05, "b1": 0.4, "p0": 0.05, "p1": 0.001})
MODELS = (LINEAR, STEPPED, HINGE, REFILL)
TOL = 1e-9

Bounds = Callable[[Instance], list[float]]


def congested(n: int, model: TimeModel, seed: int) -> Instance:
    """n requests arriving over time into a small KV cache with a token budget of 8."""
    rng = np.random.default_rng(seed)
    reqs = tuple(
        Request(
            f"r{k}",
            float(np.round(rng.exponential(1.5) * k, 2)),
            int(rng.integers(1, 12)),
            int(rng.integers(1, 9)),
        )
        for k in range(n)
    )
    return Instance(reqs, Limits(kv_capacity=40, max_batch_tokens=8, max_prefill_tokens=8), model)


def below(values: list[float], reference: float, what: str = "") -> None:
    for value in values:
        assert value <= reference + TOL * max(1.0, reference), what


def check_brute_force(inst: Instance, model: TimeModel, bounds: Bounds) -> None:
    """Evictions allowed, with and without budgets and arrivals."""
    inst = replace(inst, time_model=model)
    below(bounds(inst), brute_force(inst, "total-latency", allow_eviction=True))


def check_budgets(evict: bool, model: TimeModel, bounds: Bounds) -> None:
    inst = budget_trio(model)
    values = bounds(inst)
    assert min(values) > 0
    below(values, brute_force(inst, "total-latency", allow_eviction=evict))


def check_legal_schedule(inst: Instance, model: TimeModel, seed: int, bounds: Bounds) -> None:
    """A random legal schedule (chunks, pauses, evictions, idling) through the core."""
    inst = replace(inst, time_model=model)
    built = build_legal_schedule(inst, seed, instance_cost_model(inst))
    below(bounds(inst), OBJECTIVES["total-latency"](replay(inst, built.schedule)))


def check_policies(inst: Instance, values: list[float]) -> None:
    """Every policy's validated schedule is above every value."""
    for name in POLICIES:
        try:
            trace = replay(inst, simulate(inst, make_policy(name)).schedule)
        except KvschedError:  # a policy that refuses this instance (e.g. whole refills over the budget)
            continue
        below(values, OBJECTIVES["total-latency"](trace), name)
