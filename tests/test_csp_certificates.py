"""Certificates that cannot lie: every status and bound a solve reports is checked against an
independent brute force over engine states (tests/brute.py), with time limits short enough that
time-outs happen, on every back end, formulation and objective."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvsched.csp.backends as backends
from kvsched.csp import Bound, Deadline, ModelError, Scope, SolverOptions, SolveStatus, solve
from kvsched.csp.backends import RawSolution
from kvsched.csp.certify import Seen, certify
from kvsched.csp.objectives import OBJECTIVES
from kvsched.errors import KvschedError
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.validate import replay
from tests.brute import brute_force, contiguous_brute_force

SOLVERS = ("highs", "cbc", "cpsat")
LIMITS = (0.05, 0.2, 1.0, 2.0)
TOL = 1e-6


def _instance(reqs, m_extra, c):
    requests = tuple(Request(f"q{k}", float(a), i, o) for k, (i, o, a) in enumerate(reqs))
    peak = max(i + o - 1 for i, o, _ in reqs)
    return Instance(requests, Limits(kv_capacity=peak + m_extra, max_batch_tokens=c), TimeModel("unit"))


tiny = st.builds(
    _instance,
    st.lists(
        st.tuples(st.integers(1, 3), st.integers(1, 3), st.sampled_from([0, 0, 1])), min_size=1, max_size=3
    ),
    st.integers(0, 2),
    st.sampled_from([None, None, 3]),
)


def _check(result, instance, optimum):
    """optimal => the optimum; otherwise bound <= optimum <= objective; the schedule is legal."""
    assert result.schedule is not None and replay(instance, result.schedule).ok
    assert result.objective >= optimum - TOL
    if result.status == SolveStatus.OPTIMAL:
        assert math.isclose(result.objective, optimum, abs_tol=TOL)
    else:
        assert result.status == SolveStatus.FEASIBLE
    if result.best_bound is not None:
        assert result.best_bound <= optimum + TOL
        assert result.bound_source
    every = result.all_schedules_bound
    return every


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tiny, st.sampled_from(sorted(OBJECTIVES)), st.sampled_from(SOLVERS), st.sampled_from(LIMITS))
def test_batch_formulation_never_claims_what_brute_force_denies(inst, objective, solver, limit):
    evict = limit != 0.2  # both classes, without a separate draw
    optimum = brute_force(inst, objective, allow_eviction=evict)
    result = solve(
        inst,
        objective=objective,
        formulation="batch",
        solver=solver,
        allow_eviction=evict,
        options=SolverOptions(time_limit=limit, threads=1),
    )
    assert result.scope == (Scope.ALL if evict else Scope.NO_EVICTION)
    _check(result, inst, optimum)
    every = result.all_schedules_bound
    if every is not None:
        assert every.value <= brute_force(inst, objective) + TOL


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tiny, st.sampled_from(sorted(OBJECTIVES)), st.sampled_from(SOLVERS), st.sampled_from(LIMITS))
def test_auto_never_claims_what_brute_force_denies(inst, objective, solver, limit):
    # The pipeline, then the exact model from its schedule, in one certificate (every legal schedule).
    result = solve(
        inst, objective=objective, solver=solver, options=SolverOptions(time_limit=limit, threads=1)
    )
    assert result.scope == Scope.ALL
    _check(result, inst, brute_force(inst, objective))


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tiny, st.sampled_from(sorted(OBJECTIVES)), st.sampled_from(SOLVERS), st.sampled_from(LIMITS))
def test_time_formulation_never_claims_what_brute_force_denies(inst, objective, solver, limit):
    inst = Instance(inst.requests, Limits(kv_capacity=inst.limits.kv_capacity), inst.time_model)
    result = solve(
        inst, objective=objective, formulation="time", solver=solver, options=SolverOptions(limit, threads=1)
    )
    assert result.scope in (Scope.CONTIGUOUS, Scope.ALL)  # ALL: nothing of the class in time
    optimum = contiguous_brute_force(inst, objective) if result.scope == Scope.CONTIGUOUS else None
    _check(result, inst, optimum if optimum is not None else brute_force(inst, objective))
    every = result.all_schedules_bound
    if every is not None:
        assert every.value <= brute_force(inst, objective) + TOL


# ------------------------------------------------------------ a lying back end
def _liar(status):
    def backend(model, options, deadline):
        return RawSolution(status, None, None, 1e9, 0.0)

    return backend


@pytest.mark.parametrize("status", [SolveStatus.UNKNOWN, SolveStatus.FEASIBLE])
def test_a_garbage_bound_is_caught_not_reported(monkeypatch, status):
    # A back end that answers with a bound above every schedule: kvsched must not call it optimal,
    # and a proven bound above a schedule it has seen is a bug that is raised, never printed.
    inst = _instance([(2, 3, 0), (1, 3, 0), (3, 2, 0)], 0, None)
    monkeypatch.setitem(backends.BACKENDS, "highs", _liar(status))
    if status == SolveStatus.UNKNOWN:
        monkeypatch.setattr(backends, "solve_highs", _liar(status))
    with pytest.raises(ModelError, match="exceeds"):
        solve(inst, formulation="batch", solver="highs", options=SolverOptions(time_limit=20, threads=1))


def test_cpsat_unknown_carries_no_bound():
    # CP-SAT's best_objective_bound is read only next to a solution (OPTIMAL or FEASIBLE).
    from ortools.sat.python import cp_model

    from kvsched.csp.backends.cpsat import solve_cpsat
    from kvsched.csp.model import LinearModel

    m = LinearModel()
    xs = [m.add_var(f"x{k}", 0, 50, obj=1.0) for k in range(60)]
    for k in range(59):
        m.add_row([xs[k], xs[k + 1]], [3.0, 5.0], 7, 7 + k % 3)  # hard to satisfy fast
    raw = solve_cpsat(m, SolverOptions(threads=1), Deadline.after(0.001))
    assert raw.status in (
        SolveStatus.UNKNOWN,
        SolveStatus.INFEASIBLE,
        SolveStatus.FEASIBLE,
        SolveStatus.OPTIMAL,
    )
    if raw.x is None:
        assert raw.bound is None
    assert cp_model  # the module is importable where CP-SAT runs


def test_certify_never_raises_a_bound_to_the_objective():
    status, best = certify(10.0, Scope.ALL, [Bound(7.0, "combinatorial")])
    assert status == SolveStatus.FEASIBLE and best.value == 7.0
    status, best = certify(10.0, Scope.ALL, [Bound(10.0, "highs")])
    assert status == SolveStatus.OPTIMAL
    # A bound of a narrower class says nothing about every schedule.
    status, best = certify(10.0, Scope.ALL, [Bound(10.0, "lagrangian", Scope.CONTIGUOUS)])
    assert status == SolveStatus.FEASIBLE and best is None
    with pytest.raises(ModelError):
        certify(10.0, Scope.ALL, [Bound(9.0, "x")], [Seen(8.0, Scope.NO_EVICTION, "policy")])
    # ... but a class bound may exceed a schedule outside the class (an evicting policy).
    certify(10.0, Scope.CONTIGUOUS, [Bound(9.0, "x", Scope.CONTIGUOUS)], [Seen(8.0, Scope.ALL, "policy")])
    assert np.isfinite(best is None or best.value)


def test_no_schedule_that_could_be_validated_in_time_is_one_clear_error():
    # One request of 2 * 10^9 prompt tokens under C = 1024 needs 1,953,126 batches in any schedule: none can be
    # replayed and validated within 0.5 s, so the solve says so at once instead of running past its limit.
    inst = Instance(
        (Request("big", 0.0, 2 * 10**9, 2),),
        Limits(kv_capacity=2_100_000_000, max_batch_tokens=1024),
        TimeModel("unit"),
    )
    with pytest.raises(KvschedError, match="at least 1,953,126 batches"):
        solve(inst, options=SolverOptions(time_limit=0.5, threads=1))


def test_optimal_is_judged_from_the_objectives_origin_not_from_absolute_times():
    # A makespan counted from arrivals at 2e6 slots: 1e-6 of the value is two slots, so a relative tolerance
    # called 2,000,012 optimal against a bound of 2,000,010 while the brute force reaches 2,000,011.
    bound = [Bound(2_000_010.0, "area", Scope.ALL)]
    assert certify(2_000_012.0, Scope.ALL, bound, origin=2_000_000.0)[0] == SolveStatus.FEASIBLE
    assert certify(2_000_010.0, Scope.ALL, bound, origin=2_000_000.0)[0] == SolveStatus.OPTIMAL
    with pytest.raises(ModelError):  # and a bound a slot above a schedule is caught
        certify(2_000_009.0, Scope.ALL, bound, origin=2_000_000.0)


@pytest.mark.parametrize("shift", [0.0, 2e6])
def test_a_solve_of_shifted_arrivals_claims_only_what_the_brute_force_allows(shift):
    reqs = (Request("r0", shift, 3, 3), Request("r1", 2.891 + shift, 4, 1), Request("r2", 1.0 + shift, 4, 4))
    inst = Instance(reqs, Limits(kv_capacity=10, block_size=2), TimeModel("unit", {"slot": 2.0}))
    opt = brute_force(inst, "makespan")
    assert opt == 11.0 + shift
    res = solve(inst, objective="makespan", options=SolverOptions(time_limit=2))
    assert res.best_bound is not None and res.best_bound <= opt
    assert res.objective >= opt
    if res.status == SolveStatus.OPTIMAL:
        assert res.objective == opt
