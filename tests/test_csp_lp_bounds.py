"""The LP bounds in seconds (batch-rate LP, processor-sharing LP): below the optimum and every legal schedule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.csp import SolverOptions, driver, solve
from kvsched.csp.bounds import fluid_lp, sharing_lp
from kvsched.csp.certificate import Scope
from kvsched.instances.model import Instance, Limits, Request
from tests.seconds_bound_checks import (
    LINEAR,
    MODELS,
    TOL,
    check_brute_force,
    check_budgets,
    check_legal_schedule,
    check_policies,
    congested,
)
from tests.strategies import instances

tiny = instances(max_requests=3, max_prompt=3, max_output=3, cost="unit")


def _values(results, source: str) -> list[float]:
    out = []
    for got in results:
        assert got.bound is not None, got.status
        assert got.bound.scope == Scope.ALL and got.bound.source == source
        out.append(got.bound.value)
    return out


def batch_rate(inst: Instance) -> list[float]:
    """Interval lengths and windows: fine and coarse grids, and a window short enough to use the overflow."""
    grids = ((0.3, 50.0), (1.0, 50.0), (2.5, 3.0))
    return _values([fluid_lp.fluid_lp_bound(inst, step=s, window=w) for s, w in grids], fluid_lp.SOURCE)


def sharing(inst: Instance) -> list[float]:
    """Interval lengths (clamped up to the longest batch) and tails past the last arrival: the default, a
    coarse grid, and a tail so short that requests are still running at its end."""
    grids = ((None, None), (2.5, None), (None, 0.5))
    return _values([sharing_lp.sharing_lp_bound(inst, step=s, tail=t) for s, t in grids], sharing_lp.SOURCE)


BOUNDS = pytest.mark.parametrize("bounds", [batch_rate, sharing], ids=["batch-rate", "sharing"])


@BOUNDS
@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(tiny, st.sampled_from(MODELS))
def test_below_the_brute_force_optimum(bounds, inst, model):
    check_brute_force(inst, model, bounds)


@BOUNDS
@pytest.mark.parametrize("evict", [True, False])
@pytest.mark.parametrize("model", MODELS)
def test_below_the_optimum_with_budgets(bounds, evict, model):
    check_budgets(evict, model, bounds)


@BOUNDS
@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(instances(cost="infermax-linear"), st.sampled_from(MODELS), st.integers(0, 2**16))
def test_below_every_legal_schedule(bounds, inst, model, seed):
    check_legal_schedule(inst, model, seed, bounds)


@BOUNDS
@pytest.mark.parametrize("model", MODELS)
def test_below_every_policy(bounds, model):
    """Every policy's validated schedule on a congested random instance is above the bound."""
    inst = congested(12, model, 7)
    values = bounds(inst)
    if bounds is batch_rate:  # its default grid too (about 10^4 cells: too slow for the examples above)
        values.append(fluid_lp.fluid_lp_bound(inst).bound.value)
    assert min(values) > 0
    check_policies(inst, values)


def test_the_pipeline_reports_both(monkeypatch):
    """Under a seconds model the pipeline runs the sharing LP, then the batch-rate LP, and keeps both bounds."""
    monkeypatch.setattr(driver, "AUTO_EXACT_MAX", 0)  # the pipeline, not the exact model, at this size
    reqs = tuple(Request(f"r{k}", 0.4 * k, 3 + k % 3, 2 + k % 4) for k in range(8))
    inst = Instance(reqs, Limits(kv_capacity=14, max_batch_tokens=4, max_prefill_tokens=4), LINEAR)
    result = solve(inst, formulation="auto", options=SolverOptions(time_limit=20.0))
    sources = {b.source: b.value for b in result.bounds}
    assert sources[fluid_lp.SOURCE] > 0 and sources[sharing_lp.SOURCE] > 0
    assert max(sources.values()) <= result.objective + TOL * result.objective
    assert "sharing_lp_seconds" in result.stats and "batch_rate_lp_seconds" in result.stats
