"""The batch-rate LP (kvsched.csp.bounds.fluid_lp): below the optimum and below every legal schedule."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.csp import SolverOptions, driver, solve
from kvsched.csp.bounds.fluid_lp import SOURCE, _op_costs, fluid_lp_anytime, fluid_lp_bound
from kvsched.csp.bounds.separable import separable_forms
from kvsched.csp.certificate import Scope
from kvsched.csp.objectives import OBJECTIVES
from kvsched.errors import KvschedError
from kvsched.heuristics import POLICIES, make_policy, simulate
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.validate import instance_cost_model, replay
from kvsched.stop import Deadline
from tests.brute import brute_force
from tests.strategies import budget_trio, build_legal_schedule, instances

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
#: Interval lengths and windows: fine and coarse grids, a window short enough to use the overflow.
GRIDS = ((0.3, 50.0), (1.0, 50.0), (2.5, 3.0))

tiny = instances(max_requests=3, max_prompt=3, max_output=3, cost="unit")


def _bounds(inst: Instance) -> list[float]:
    out = []
    for step, window in GRIDS:
        got = fluid_lp_bound(inst, step=step, window=window)
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


def _many(n: int, model: TimeModel, seed: int) -> Instance:
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


@pytest.mark.parametrize("model", MODELS)
def test_bound_below_every_policy(model):
    """Every policy's validated schedule on a congested random instance is above the bound."""
    inst = _many(12, model, 7)
    bounds = [*_bounds(inst), fluid_lp_bound(inst).bound.value]
    for name in POLICIES:
        try:
            trace = replay(inst, simulate(inst, make_policy(name)).schedule)
        except KvschedError:  # a policy that refuses this instance (e.g. whole refills over the budget)
            continue
        value = OBJECTIVES["total-latency"](trace)
        for bound in bounds:
            assert bound <= value + TOL * max(1.0, value), name


def test_refill_costs_are_the_least_over_the_chunk():
    """The generating op's least own term: no chunk size c of a refill is cheaper (brute force over c)."""
    for model in MODELS:
        for f in separable_forms(
            instance_cost_model(Instance((Request("a", 0, 1, 1),), Limits(kv_capacity=99), model)), 64
        ):
            s = np.arange(2, 40, dtype=np.float64)
            got = _op_costs(f, s)
            for k, sv in enumerate(s):
                c = np.arange(1, sv + 1)
                chunk = (
                    (f.per_token + f.prefill_token) * c + f.prefill + f.prefill_quad * (c * c + 2 * (sv - c) * c)
                    + f.prefill_kv * (sv - c) + f.prefill_sq * c * c
                )  # fmt: skip
                decode = f.per_token + f.decode + f.decode_kv * (sv - 1)
                assert got[k] <= min(chunk.min(), decode) + 1e-12


def test_refuses_unit_time_and_returns_nothing_when_empty_handed():
    inst = Instance((Request("a", 0, 2, 2),), Limits(kv_capacity=8), TimeModel("unit"))
    assert fluid_lp_bound(inst).bound is None
    inst = replace(inst, time_model=LINEAR)
    got = fluid_lp_bound(inst, Deadline(time.monotonic(), 1.0))
    assert got.bound is None or got.bound.value <= brute_force(inst, "total-latency") + TOL


def test_the_pipeline_reports_the_batch_rate_lp(monkeypatch):
    monkeypatch.setattr(driver, "AUTO_EXACT_MAX", 0)  # the pipeline, not the exact model, at this size
    reqs = tuple(Request(f"r{k}", 0.4 * k, 3 + k % 3, 2 + k % 4) for k in range(8))
    inst = Instance(reqs, Limits(kv_capacity=14, max_batch_tokens=4, max_prefill_tokens=4), LINEAR)
    result = solve(inst, formulation="auto", options=SolverOptions(time_limit=20.0))
    sources = {b.source: b.value for b in result.bounds}
    assert SOURCE in sources and sources[SOURCE] > 0
    assert max(sources.values()) <= result.objective + TOL * result.objective


def test_a_coarse_grid_is_not_run_and_the_anytime_rounds_are_valid():
    inst = _many(12, LINEAR, 3)
    assert fluid_lp_bound(inst, cells=1, coarsest=0.25).status == "grid too coarse"
    opt_above = OBJECTIVES["total-latency"](replay(inst, simulate(inst, make_policy("sarathi")).schedule))
    rounds = fluid_lp_anytime(inst, Deadline.after(5.0))
    assert rounds and all(r.bound is None or r.bound.value <= opt_above + TOL * opt_above for r in rounds)


def test_a_passed_deadline_stops_the_build():
    """The model build checks the deadline too: a spent one gives no bound and says why, and nothing is solved."""
    inst = _many(12, LINEAR, 3)
    got = fluid_lp_bound(inst, Deadline(time.monotonic() - 2.0, 1.0))
    assert got.bound is None and got.status == "deadline while building" and got.cells == 0


def test_a_stepped_fit_gets_the_flat_forms_machine_row_too(monkeypatch):
    """Each separable form's machine row holds for every schedule: the flat one (largest fixed part) joins
    the half-full batch's hull edge, which only tightens the LP, and the bound stays below the optimum."""
    from kvsched.costmodel.coeffile import resolve_cost_model
    from kvsched.csp.bounds import fluid_lp

    a100 = TimeModel(*resolve_cost_model("llama-2-7b_a100-80gb_tp1"))
    forms = separable_forms(instance_cost_model(Instance((Request("a", 0, 2, 2),), Limits(8), a100)), 512)
    first, flat = fluid_lp.machine_forms(forms, 512)
    assert first is fluid_lp.pick_form(forms, 512)
    assert flat.fixed > first.fixed and flat.per_token < first.per_token
    linear = separable_forms(instance_cost_model(Instance((Request("a", 0, 2, 2),), Limits(8), LINEAR)), 8)
    assert len(fluid_lp.machine_forms(linear, 8)) == 1
    inst = _many(10, STEPPED, 5)
    both = fluid_lp_bound(inst, step=1.0, window=50.0).bound.value
    monkeypatch.setattr(fluid_lp, "machine_forms", lambda forms, tau: [fluid_lp.pick_form(forms, tau)])
    one = fluid_lp_bound(inst, step=1.0, window=50.0).bound.value
    assert both >= one * (1 - 1e-6)
    above = OBJECTIVES["total-latency"](replay(inst, simulate(inst, make_policy("sarathi")).schedule))
    assert both <= above + TOL * above
