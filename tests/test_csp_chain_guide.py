"""The reduced costs that guide the local search (kvsched.csp.bounds.chain_guide)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsched.csp.bounds import chain_lagrangian
from kvsched.csp.bounds.chain import ChainData, evaluate
from kvsched.csp.bounds.chain_guide import ChainGuide
from kvsched.csp.incumbents import greedy
from kvsched.csp.objectives import OBJECTIVES
from kvsched.schedule.validate import replay
from kvsched.stop import Deadline
from tests.incumbent_instances import make_instance
from tests.strategies import SETTINGS, instances, legal_schedules

unit_no_budget = instances(max_requests=5, cost="unit", budgets=False)


def _guide(data: ChainData, y: np.ndarray) -> ChainGuide:
    return ChainGuide(data, y, np.zeros(0), evaluate(data, y).price)


@SETTINGS
@given(legal_schedules(unit_no_budget), st.integers(0, 2**32 - 1))
def test_every_legal_schedules_reduced_costs_are_nonnegative(built, seed):
    """A schedule's op chain is one of the chains the pricing minimises over, at any multipliers."""
    inst = built.instance
    trace = replay(inst, built.schedule)
    data = ChainData.from_instance(inst)
    horizon = int(np.ceil(trace.state.completion.max())) + 2
    rng = np.random.default_rng(seed)
    y = rng.exponential(1.0 / data.capacity, horizon) * (rng.random(horizon) < 0.7)
    assert (_guide(data, y)(trace) >= -1e-9).all()
    # At y = 0 the prices are each request alone: the scores sum to the schedule's latency in slots
    # (batch starts floored) less L(0), at most the objective less L(0).
    at_zero = _guide(data, np.zeros(horizon))(trace)
    latency = OBJECTIVES["total-latency"](trace)
    assert at_zero.sum() <= latency - evaluate(data, np.zeros(horizon)).value + 1e-9
    starts = np.array([b.start for b in built.schedule.batches])
    if np.all(starts == np.floor(starts)) and all(r.arrival == int(r.arrival) for r in inst.requests):
        assert at_zero.sum() == pytest.approx(latency - evaluate(data, np.zeros(horizon)).value, abs=1e-9)


def _loaded():
    rng = np.random.default_rng(5)
    reqs = [
        (int(rng.integers(5, 40)), int(rng.integers(2, 20)), float(rng.integers(0, 90))) for _ in range(30)
    ]
    return make_instance(reqs, 2 * max(i + o - 1 for i, o, _ in reqs))


def test_the_guide_at_the_lagrangians_multipliers_splits_the_gap():
    """V(S) - L(y) = sum of the reduced costs + the memory S leaves unused at priced slots, each >= 0."""
    inst = _loaded()
    start = greedy(inst, "remaining-area")
    lag = chain_lagrangian(inst, incumbent=start.trace, deadline=Deadline.after(5.0))
    guide = ChainGuide.from_lagrangian(lag)
    assert guide is not None
    scores = guide(start.trace)
    assert scores.shape == (len(inst),)
    assert (scores >= -1e-6).all()
    assert scores.sum() <= start.value - lag.value + 1e-6
    # No time for its one pricing: no guide rather than an overrun.
    assert ChainGuide.from_lagrangian(lag, Deadline.after(1e-9)) is None
    assert ChainGuide.from_lagrangian(lag, Deadline.never()) is not None
    # The split is total latency's: a Lagrangian of the first-token objective gives no guide.
    ttft = chain_lagrangian(inst, "sum-ttft", incumbent=start.trace, deadline=Deadline.after(2.0))
    assert ChainGuide.from_lagrangian(ttft) is None


def test_the_guide_refuses_an_incomplete_schedule():
    inst = _loaded()
    start = greedy(inst, "remaining-area")
    data = ChainData.from_instance(inst)
    guide = _guide(data, np.zeros(10))
    partial = make_instance(
        [(r.prompt, r.output + 1, r.arrival) for r in inst.requests], inst.limits.kv_capacity
    )
    with pytest.raises(ValueError, match="complete"):
        ChainGuide(ChainData.from_instance(partial), guide.y, guide.z, guide.price)(start.trace)
