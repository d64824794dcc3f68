"""The seconds Lagrangian and the batch-count bound: below the brute-force optimum and every legal schedule;
the compiled pricing equals the reference."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.csp import SolverOptions, driver, pipeline, solve
from kvsched.csp.bounds import chain_lagrangian, portfolio
from kvsched.csp.bounds.batch_count import SOURCE as BATCH_COUNT
from kvsched.csp.bounds.batch_count import batch_count_bound, unit_copy
from kvsched.csp.bounds.chain import warm_incumbent
from kvsched.csp.bounds.seconds_lagrangian import (
    SOURCE,
    evaluate,
    evaluate_reference,
    prepare,
    seconds_lagrangian,
)
from kvsched.csp.certificate import Scope
from kvsched.csp.objectives import OBJECTIVES
from kvsched.errors import InputError
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
MODELS = (LINEAR, STEPPED, HINGE)
TOL = 1e-9


def _random_multipliers(data, rng: np.random.Generator, scale: float):
    nw = data.windows
    mu = rng.exponential(scale, (len(data.forms), nw)) * (rng.random((len(data.forms), nw)) < 0.7)
    y = rng.exponential(scale / max(1, data.capacity), nw) * (rng.random(nw) < 0.5)
    z = rng.exponential(scale / max(1, data.budget or 1), nw) if data.budget is not None else np.zeros(0)
    alpha = rng.random(nw)
    return mu, y, z, alpha


tiny = instances(max_requests=3, max_prompt=3, max_output=3, cost="unit")


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(tiny, st.sampled_from(MODELS), st.integers(0, 2**16))
def test_bound_below_the_brute_force_optimum(inst, model, seed):
    """Evictions allowed, with and without budgets and arrivals: the ascent's bound and the value at
    random multipliers are below the optimum."""
    inst = replace(inst, time_model=model)
    opt = brute_force(inst, "total-latency", allow_eviction=True)
    trace = warm_incumbent(inst)
    got = seconds_lagrangian(inst, incumbent=trace, max_iterations=40)
    assert got.bound.value <= opt + TOL * max(1.0, opt)
    data = prepare(inst, trace)
    rng = np.random.default_rng(seed)
    for scale in (0.5, 5.0):
        mu, y, z, alpha = _random_multipliers(data, rng, scale)
        assert evaluate(data, mu, y, z, alpha).value <= opt + TOL * max(1.0, opt)


@pytest.mark.parametrize("evict", [True, False])
@pytest.mark.parametrize("model", MODELS)
def test_bound_below_the_optimum_with_budgets(evict, model):
    inst = budget_trio(model)
    opt = brute_force(inst, "total-latency", allow_eviction=evict)
    got = seconds_lagrangian(inst, incumbent=warm_incumbent(inst), max_iterations=60)
    assert got.bound.scope == Scope.ALL and got.bound.source == SOURCE
    assert 0 < got.bound.value <= opt + TOL * max(1.0, opt)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(instances(cost="infermax-linear"), st.sampled_from(MODELS), st.integers(0, 2**16))
def test_every_value_is_below_every_legal_schedule(inst, model, seed):
    """Random legal schedules (chunks, pauses, evictions, idling) through the core: every Lagrangian
    value, at the ascent's multipliers or random ones, is below each; their op slots are chains."""
    inst = replace(inst, time_model=model)
    built = build_legal_schedule(inst, seed, instance_cost_model(inst))
    trace = replay(inst, built.schedule)
    value = OBJECTIVES["total-latency"](trace)
    data = prepare(inst, trace)
    assert data.prev is not None  # the slot argument: a legal schedule's op slots form chains
    rng = np.random.default_rng(seed)
    mu, y, z, alpha = _random_multipliers(data, rng, 2.0)
    assert evaluate(data, mu, y, z, alpha, prev=data.prev).value <= value + TOL * max(1.0, value)
    got = seconds_lagrangian(inst, incumbent=trace, max_iterations=15)
    assert got.bound.value <= value + TOL * max(1.0, value)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(
    instances(max_requests=4, max_prompt=6, max_output=4, cost="unit"),
    st.sampled_from(MODELS),
    st.integers(0, 2**16),
)
def test_compiled_and_reference_pricings_agree(inst, model, seed):
    inst = replace(inst, time_model=model)
    data = prepare(inst, warm_incumbent(inst))
    rng = np.random.default_rng(seed)
    for scale in (0.3, 3.0):
        mu, y, z, alpha = _random_multipliers(data, rng, scale)
        fast = evaluate(data, mu, y, z, alpha)
        assert fast.value == pytest.approx(evaluate_reference(data, mu, y, z, alpha), rel=1e-9, abs=1e-9)
        # Seeded with its own optimum chains, the band gives the same value.
        again = evaluate(data, mu, y, z, alpha, prev=fast.chains)
        assert again.value == pytest.approx(fast.value, rel=1e-9, abs=1e-9)


def test_refuses_what_it_does_not_bound():
    inst = Instance((Request("a", 0, 2, 2),), Limits(kv_capacity=8), TimeModel("unit"))
    with pytest.raises(InputError):
        seconds_lagrangian(inst, incumbent=warm_incumbent(inst))
    inst = replace(inst, time_model=LINEAR)
    with pytest.raises(InputError):
        seconds_lagrangian(inst, "makespan", incumbent=warm_incumbent(inst))


def test_an_expired_deadline_still_returns_a_valid_bound():
    inst = Instance(
        (Request("a", 0, 3, 2), Request("b", 0, 1, 2)), Limits(kv_capacity=4, max_batch_tokens=3), LINEAR
    )
    got = seconds_lagrangian(inst, incumbent=warm_incumbent(inst), deadline=Deadline(end=0.0, limit=1.0))
    assert got.iterations == 0 and got.bound.value == 0.0


def test_zero_multipliers_price_each_request_alone():
    """At mu = y = z = 0 every op costs nothing: each chain runs from its earliest slot, one op per slot."""
    reqs = tuple(Request(f"r{k}", 0.3 * k, 5, 3) for k in range(4))
    inst = Instance(reqs, Limits(kv_capacity=40, max_batch_tokens=2, max_prefill_tokens=2), LINEAR)
    data = prepare(inst, warm_incumbent(inst))
    got = evaluate(
        data, np.zeros((len(data.forms), data.windows)), np.zeros(data.windows), np.zeros(data.windows)
    )
    expected = np.sum(data.delta * (data.earliest + data.output) - data.arrival)
    assert got.value == pytest.approx(expected)
    assert np.all(data.earliest == np.floor(data.arrival / data.delta) + 2)  # three chunks of <= 2 tokens


# ------------------------------------------------------------------ the batch-count bound
@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(tiny, st.sampled_from(MODELS))
def test_batch_count_bound_below_the_brute_force_optimum(inst, model):
    """With the unit copy's exact optimum as its batch count (the strongest input it can get)."""
    inst = replace(inst, time_model=model)
    opt = brute_force(inst, "total-latency", allow_eviction=True)
    unit_opt = brute_force(unit_copy(inst), "total-latency", allow_eviction=True)
    assert batch_count_bound(inst, unit_opt) <= opt + TOL * max(1.0, opt)


@pytest.mark.parametrize("model", MODELS)
def test_batch_count_bound_below_the_optimum_with_budgets(model):
    inst = Instance(
        (Request("a", 0, 3, 2), Request("b", 0, 1, 2), Request("c", 0, 1, 2)),
        Limits(kv_capacity=4, max_batch_tokens=3, max_prefill_tokens=2),
        model,
    )
    opt = brute_force(inst, "total-latency", allow_eviction=True)
    unit_opt = brute_force(unit_copy(inst), "total-latency", allow_eviction=True)
    assert 0 < batch_count_bound(inst, unit_opt) <= opt + TOL * max(1.0, opt)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(instances(cost="infermax-linear"), st.sampled_from(MODELS), st.integers(0, 2**16))
def test_batch_count_bound_below_every_legal_schedule(inst, model, seed):
    inst = replace(inst, time_model=model)
    built = build_legal_schedule(inst, seed, instance_cost_model(inst))
    value = OBJECTIVES["total-latency"](replay(inst, built.schedule))
    copy = unit_copy(inst)
    unit = max(b.value for b in portfolio(copy, "total-latency"))
    unit = max(unit, chain_lagrangian(copy, max_iterations=20).bound.value)
    assert batch_count_bound(inst, unit) <= value + TOL * max(1.0, value)


def test_the_pipeline_reports_the_batch_count_bound(monkeypatch):
    monkeypatch.setattr(driver, "AUTO_EXACT_MAX", 0)  # the pipeline, not the exact model, at this size
    # The two LPs before these bounds refine their grids while their shares last (60% of the stage, then 85% of
    # the rest), which left the seconds Lagrangian ~2% of the stage: under load it got no pricing in and this
    # test failed. Small LP shares leave these bounds about a third of the stage; the LPs have tests of their own.
    monkeypatch.setattr(pipeline, "SHARING_LP_SHARE", 0.1)
    monkeypatch.setattr(pipeline, "FLUID_LP_SHARE", 0.1)
    reqs = tuple(Request(f"r{k}", 0.0, 3 + k % 3, 2 + k % 4) for k in range(8))
    inst = Instance(reqs, Limits(kv_capacity=14, max_batch_tokens=4, max_prefill_tokens=4), LINEAR)
    # Warm, the solve converges in 2-3 s; the first solve of a process (imports, first calls of just-compiled
    # kernels) took 5 s of a 10 s limit on a slow machine and left the seconds Lagrangian no time: 20 s.
    result = solve(inst, formulation="auto", options=SolverOptions(time_limit=20.0))
    sources = {b.source: b.value for b in result.bounds}
    assert BATCH_COUNT in sources and SOURCE in sources
    assert max(sources.values()) <= result.objective + TOL * result.objective


def test_a_start_predicted_to_overrun_is_not_made(monkeypatch):
    # The data and the first pricing check no deadline (at 100k requests: 9 s and 14-17 s): the pipeline
    # skips the stage, and seconds_lagrangian itself starts no pricing predicted to overrun.
    monkeypatch.setattr(driver, "AUTO_EXACT_MAX", 0)
    import kvsched.csp.bounds.seconds_lagrangian as sl

    monkeypatch.setattr(sl, "PRICING_SECONDS_PER_OP", 1e6)
    reqs = tuple(Request(f"r{k}", 0.0, 3 + k % 3, 2 + k % 4) for k in range(8))
    inst = Instance(reqs, Limits(kv_capacity=14, max_batch_tokens=4, max_prefill_tokens=4), LINEAR)
    got = seconds_lagrangian(inst, incumbent=warm_incumbent(inst), deadline=Deadline.after(30.0))
    assert got.iterations == 0 and got.seconds < 5
    result = solve(inst, formulation="auto", options=SolverOptions(time_limit=10.0))
    assert "predicted to take" in result.stats["seconds_lagrangian"]
    assert SOURCE not in {b.source for b in result.bounds}


@pytest.mark.parametrize("policy", ["sarathi", "vllm-v1", "sarathi-ef"])
def test_incumbent_chains_read_runs_as_their_batches(policy):
    # The chains read a run of decode batches whole; spelled out batch by batch they are the same slots.
    import math

    from kvsched.csp.bounds.seconds_lagrangian import incumbent_chains
    from kvsched.heuristics import make_policy, simulate
    from kvsched.instances.generators import Poisson, Uniform, synthetic
    from kvsched.schedule.records import RunRecord

    limits = Limits(kv_capacity=400, block_size=1, max_batch_tokens=32, max_prefill_tokens=32)
    inst = synthetic(
        60, 3, limits, LINEAR, prompt=Uniform(5, 70), output=Uniform(2, 40), arrival=Poisson(rate=3.0)
    )
    trace = simulate(inst, make_policy(policy)).trace
    assert any(type(e) is RunRecord for e in trace.entries)  # runs to read whole
    data = prepare(inst, trace)
    got = incumbent_chains(data.release, data.earliest, data.output, data.offset, data.delta, trace)
    want = np.full(int(data.output.sum()), -1, dtype=np.int64)
    done = np.zeros(data.output.size, dtype=np.int64)
    for rec in trace.records:  # every batch spelled out
        for r in np.asarray(rec.generated, dtype=np.int64):
            want[data.offset[r] + done[r]] = math.floor(rec.start / data.delta)
            done[r] += 1
    assert got is not None and np.array_equal(got, want)


def test_slots_count_from_the_first_arrival():
    # From time 0, three requests arriving at 1e6 s made 1.9e8 slots of 5.4 ms (4.7 GB, 9-16 s of a 2 s solve).
    reqs = (Request("r0", 2.197, 3, 1), Request("r1", 1.0, 2, 4), Request("r2", 1.0, 1, 4))
    inst = Instance(reqs, Limits(kv_capacity=10), TimeModel("infermax-linear"))
    late = replace(inst, requests=tuple(replace(r, arrival=r.arrival + 1e6) for r in reqs))
    from kvsched.heuristics import make_policy, simulate

    got = []
    for case in (inst, late):
        trace = simulate(case, make_policy("sarathi")).trace
        data = prepare(case, trace)
        assert data.horizon < 1_000 and data.prev is not None
        got.append(seconds_lagrangian(case, incumbent=trace, max_iterations=20).bound.value)
    assert got[1] == pytest.approx(got[0], rel=1e-7)
