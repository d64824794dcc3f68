"""Instances and a replayed objective shared by the incumbent tests (test_csp_incumbents*)."""

import numpy as np

from kvsched.csp.incumbents import Incumbent
from kvsched.csp.objectives import OBJECTIVES
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.validate import replay


def make_instance(reqs, m, c=None, p=None, r=None, *, block=1, time_model="unit"):
    """An instance of requests ``(prompt, output, arrival)`` under limits M, block, C, P, R and ``time_model``."""
    requests = tuple(Request(f"r{k}", float(a), i, o) for k, (i, o, a) in enumerate(reqs))
    return Instance(requests, Limits(m, block, c, p, r), TimeModel(time_model))


def random_instance(rng: np.random.Generator, n: int) -> Instance:
    """Mixed limits: arrivals, blocks, budgets C/P, max_running, unit or linear time."""
    reqs = [
        (int(rng.integers(1, 25)), int(rng.integers(1, 25)), float(rng.integers(0, 20))) for _ in range(n)
    ]
    peak = max(i + o - 1 for i, o, _ in reqs)
    block = int(rng.choice([1, 1, 4]))
    m = max(-(-peak // block) * block, int(rng.integers(peak, 3 * peak)))
    c = None if rng.random() < 0.5 else int(rng.integers(8, 50))
    p = None if rng.random() < 0.6 else int(rng.integers(4, 30))
    r = None if rng.random() < 0.7 else int(rng.integers(1, 6))
    model = "unit" if rng.random() < 0.7 else "infermax-linear"
    return make_instance(reqs, m, c, p, r, block=block, time_model=model)


def objective_value(inst: Instance, inc: Incumbent) -> float:
    """The incumbent's objective, from replaying its schedule through the core."""
    return OBJECTIVES[inc.objective](replay(inst, inc.schedule))


def budget_instance(rng: np.random.Generator, n: int, time_model: str = "unit") -> Instance:
    """Long prompts against a small budget, tight KV: refills take several batches."""
    reqs = [
        (int(rng.integers(1, 40)), int(rng.integers(1, 20)), float(rng.integers(0, 30))) for _ in range(n)
    ]
    peak = max(i + o - 1 for i, o, _ in reqs)
    block = int(rng.choice([1, 1, 4]))
    m = max(-(-peak // block) * block, int(rng.integers(peak, 2 * peak)))
    c = int(rng.integers(6, 20))
    return make_instance(reqs, m, c, c if rng.random() < 0.5 else None, block=block, time_model=time_model)
