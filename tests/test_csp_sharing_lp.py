"""The processor-sharing LP (kvsched.csp.bounds.sharing_lp): below the optimum and below every legal schedule."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.csp import SolverOptions, driver, solve
from kvsched.csp.bounds.sharing_lp import (
    SOURCE,
    _cheapest_tangents,
    _done_lines,
    planned_intervals,
    sharing_lp_bound,
)
from kvsched.csp.certificate import Scope
from kvsched.csp.objectives import OBJECTIVES
from kvsched.errors import KvschedError
from kvsched.heuristics import POLICIES, make_policy, simulate
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.validate import instance_cost_model, replay
from kvsched.stop import Deadline
from tests.brute import brute_force
from tests.strategies import budget_trio, build_legal_schedule, instances
from tests.test_csp_fluid_lp import LINEAR, MODELS, STEPPED, _many

TOL = 1e-9
#: Interval lengths (clamped up to the longest batch) and tails past the last arrival: the default, a
#: coarse grid, and a tail so short that requests are still running at its end.
GRIDS = ((None, None), (2.5, None), (None, 0.5))

tiny = instances(max_requests=3, max_prompt=3, max_output=3, cost="unit")


def _bounds(inst: Instance) -> list[float]:
    out = []
    for step, tail in GRIDS:
        got = sharing_lp_bound(inst, step=step, tail=tail)
        assert got.bound is not None, got.status
        assert got.bound.scope == Scope.ALL and got.bound.source == SOURCE
        out.append(got.bound.value)
    return out


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(tiny, st.sampled_from(MODELS))
def test_bound_below_the_brute_force_optimum(inst, model):
    """Evictions allowed, with and without budgets and arrivals, on every grid."""
    inst = replace(inst, time_model=model)
    opt = brute_force(inst, "total-latency", allow_eviction=True)
    for value in _bounds(inst):
        assert value <= opt + TOL * max(1.0, opt)


@pytest.mark.parametrize("evict", [True, False])
@pytest.mark.parametrize("model", MODELS)
def test_bound_below_the_optimum_with_budgets(evict, model):
    inst = budget_trio(model)
    opt = brute_force(inst, "total-latency", allow_eviction=evict)
    for value in _bounds(inst):
        assert 0 < value <= opt + TOL * max(1.0, opt)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(instances(cost="infermax-linear"), st.sampled_from(MODELS), st.integers(0, 2**16))
def test_bound_below_every_legal_schedule(inst, model, seed):
    """Random legal schedules (chunks, pauses, evictions, idling) through the core."""
    inst = replace(inst, time_model=model)
    built = build_legal_schedule(inst, seed, instance_cost_model(inst))
    value = OBJECTIVES["total-latency"](replay(inst, built.schedule))
    for bound in _bounds(inst):
        assert bound <= value + TOL * max(1.0, value)


@pytest.mark.parametrize("model", MODELS)
def test_bound_below_every_policy(model):
    """Every policy's validated schedule on a congested random instance is above the bound."""
    inst = _many(12, model, 7)
    bounds = _bounds(inst)
    assert min(bounds) > 0
    for name in POLICIES:
        try:
            trace = replay(inst, simulate(inst, make_policy(name)).schedule)
        except KvschedError:  # a policy that refuses this instance (e.g. whole refills over the budget)
            continue
        value = OBJECTIVES["total-latency"](trace)
        for bound in bounds:
            assert bound <= value + TOL * max(1.0, value), name


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=12))
def test_done_lines_lie_above_the_smallest_first_count(sizes):
    """For every amount x, the most requests whose sizes sum to at most x is below every line."""
    sizes = np.array(sizes, dtype=np.float64)
    lines = _done_lines(sizes, 4)
    ordered = np.sort(sizes)
    for x in np.linspace(0.0, sizes.sum() + 3.0, 57):
        count = int(np.searchsorted(np.cumsum(ordered), x, side="right"))
        assert all(count <= b + slope * x + 1e-9 for b, slope in lines)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(0, 4), min_size=2, max_size=9), st.integers(0, 2**16))
def test_cheapest_tangents_lie_below_the_cheapest_sum(counts, seed):
    """For every op count x, the x cheapest ops cost at least every tangent (costs nondecreasing in S)."""
    counts = np.array(counts, dtype=np.float64)
    unit = np.sort(np.random.default_rng(seed).uniform(0.0, 2.0, counts.size))
    lines = _cheapest_tangents(counts, unit, 3)
    ops = np.repeat(unit, counts.astype(int))
    cheapest = np.concatenate([[0.0], np.cumsum(ops)])
    for x, least in enumerate(cheapest):
        assert all(c0 + slope * x <= least + 1e-9 for c0, slope in lines)


def test_refuses_unit_time_and_returns_nothing_when_out_of_time():
    inst = Instance((Request("a", 0, 2, 2),), Limits(kv_capacity=8), TimeModel("unit"))
    assert sharing_lp_bound(inst).bound is None
    inst = _many(12, LINEAR, 3)
    got = sharing_lp_bound(inst, Deadline(time.monotonic() - 2.0, 1.0))
    assert got.bound is None and got.status == "deadline while building" and got.rounds == 0


def test_cutting_planes_raise_the_bound_on_a_congested_instance():
    """Each round's LP is a relaxation, and the tangents added where the point violated V^2/R tighten it: the
    best round is at least the first, and every round is below a policy's schedule."""
    inst = _many(12, STEPPED, 5)
    got = sharing_lp_bound(inst, step=1.0)
    values = [v for _, v in got.history]
    assert got.rounds >= 2 and max(values) >= values[0]
    above = OBJECTIVES["total-latency"](replay(inst, simulate(inst, make_policy("sarathi")).schedule))
    assert got.bound.value <= above + TOL * above


def test_the_grid_is_sized_from_the_time_left():
    assert planned_intervals(float("inf"), 6) == 226
    assert planned_intervals(0.01, 6) == 32 and planned_intervals(1e6, 6) == 600
    assert planned_intervals(20.0, 6) < planned_intervals(20.0, 2)


def test_the_pipeline_reports_the_sharing_lp(monkeypatch):
    monkeypatch.setattr(driver, "AUTO_EXACT_MAX", 0)  # the pipeline, not the exact model, at this size
    reqs = tuple(Request(f"r{k}", 0.4 * k, 3 + k % 3, 2 + k % 4) for k in range(8))
    inst = Instance(reqs, Limits(kv_capacity=14, max_batch_tokens=4, max_prefill_tokens=4), LINEAR)
    result = solve(inst, formulation="auto", options=SolverOptions(time_limit=20.0))
    sources = {b.source: b.value for b in result.bounds}
    assert SOURCE in sources and sources[SOURCE] > 0
    assert max(sources.values()) <= result.objective + TOL * result.objective
    assert "sharing_lp_seconds" in result.stats


def test_rounds_stop_once_the_value_stalls():
    from kvsched.csp.bounds.sharing_lp import _stalled

    rising = [(float(k), 100.0 + 10 * k) for k in range(6)]
    assert not _stalled(rising)
    flat = [*rising, (6.0, 150.02), (7.0, 149.9), (8.0, 150.05)]
    assert _stalled(flat) and not _stalled(flat[:-1])
