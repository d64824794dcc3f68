"""The time-indexed formulation: optimal on small instances, in agreement across back ends
and with brute force through the semantic core."""

import importlib
import itertools

import highspy
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsched.csp import SolverOptions, SolveStatus, solve
from kvsched.csp.objectives import OBJECTIVES
from kvsched.csp.timeindexed import TimeIndexed
from kvsched.errors import InputError
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.conventions import mcsf_instance
from kvsched.schedule.core import ScheduleError
from kvsched.schedule.validate import replay

FAST = SolverOptions(time_limit=20, threads=1)
SOLVERS = ("highs", "cbc", "cpsat")


def brute_force(instance: Instance, objective: str, span: int) -> float:
    """Best objective over every start-slot vector within ``span`` slots of arrival,
    judged by the semantic core alone (an illegal schedule raises there)."""
    ti = TimeIndexed(instance, objective)
    measure = OBJECTIVES[objective]
    best = float("inf")
    ranges = [range(int(e), int(e) + span) for e in ti.earliest]
    for starts in itertools.product(*ranges):
        try:
            schedule = ti.schedule_of(np.array(starts))
        except ScheduleError:
            continue
        best = min(best, measure(replay(instance, schedule)))
    return best


def test_mcsf_algorithm1_counterexample_eq1():
    # Seed 004 Eq. (1): s=1, M=4, o=(1,1,2,3). Algorithm 1 starts (0,0,2,4): sum(p+o) = 13;
    # the optimum is 12, e.g. starts (0,1,1,3). In kvsched's units (O = o+1, completion = p+o+1)
    # those are 17 and 16.
    inst = mcsf_instance(1, [1, 1, 2, 3], 4)
    ti = TimeIndexed(inst)
    assert ti.value(np.array([0, 0, 2, 4])) == 17
    legal = replay(inst, ti.schedule_of(np.array([0, 1, 1, 3])))
    assert [r.kv_tokens for r in legal.records] == [1, 4, 4, 4, 2, 3, 4]
    for solver in SOLVERS:
        result = solve(inst, formulation="time", solver=solver, options=FAST)
        assert result.status == SolveStatus.OPTIMAL
        assert result.objective == 16 and result.best_bound == 16
    assert brute_force(inst, "total-latency", span=6) == 16


def test_mcsf_algorithm1_counterexample_ip_convention():
    # The paper's IP (o rounds): s=1, M=6, o=(2,3,3,4,5): Algorithm 1 gives 25, the optimum 23.
    inst = mcsf_instance(1, [2, 3, 3, 4, 5], 6, convention="ip")
    assert TimeIndexed(inst).value(np.array([0, 0, 0, 3, 5])) == 25
    for solver in SOLVERS:
        assert solve(inst, formulation="time", solver=solver, options=FAST).objective == 23


small_instances = st.builds(
    lambda reqs, m_extra, block, cap_c, cap_run: _instance(reqs, m_extra, block, cap_c, cap_run),
    st.lists(
        st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(0, 2)),  # I, O, arrival
        min_size=1,
        max_size=3,
    ),
    st.integers(0, 4),
    st.sampled_from([1, 1, 2]),
    st.sampled_from([None, 5]),
    st.sampled_from([None, 2]),
)


def _instance(reqs, m_extra, block, cap_c, cap_run):
    requests = tuple(Request(f"q{k}", float(a), i, o) for k, (i, o, a) in enumerate(reqs))
    peak = max(-(-(i + o - 1) // block) * block for i, o, _ in reqs)
    limits = Limits(kv_capacity=peak + m_extra, block_size=block, max_batch_tokens=cap_c, max_running=cap_run)
    return Instance(requests, limits, TimeModel("unit"))


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(small_instances, st.sampled_from(sorted(OBJECTIVES)))
def test_all_back_ends_agree_with_brute_force(inst, objective):
    expected = brute_force(inst, objective, span=7)
    for solver in SOLVERS:
        result = solve(inst, formulation="time", objective=objective, solver=solver, options=FAST)
        assert result.status == SolveStatus.OPTIMAL, solver
        assert result.objective == pytest.approx(expected), solver
        assert replay(inst, result.schedule).ok


@settings(max_examples=30, deadline=None, derandomize=True)
@given(small_instances, st.sampled_from(sorted(OBJECTIVES)))
def test_warm_start_satisfies_the_model_and_its_objective(inst, objective):
    ti = TimeIndexed(inst, objective)
    starts = ti.heuristic_starts()
    model = ti.build(ti.value(starts), starts).model
    assert model.violations(model.hint) == []
    assert model.objective_value(model.hint) == pytest.approx(ti.value(starts))
    assert ti.value(starts) == pytest.approx(OBJECTIVES[objective](replay(inst, ti.schedule_of(starts))))


list_instances = st.builds(
    lambda reqs, m_extra, block, cap_c, cap_p, cap_run: Instance(
        tuple(Request(f"q{k}", float(a), i, o) for k, (i, o, a) in enumerate(reqs)),
        Limits(
            kv_capacity=max(-(-(i + o - 1) // block) * block for i, o, _ in reqs) + m_extra,
            block_size=block,
            max_batch_tokens=cap_c,
            max_prefill_tokens=cap_p,
            max_running=cap_run,
        ),
        TimeModel("unit"),
    ),
    st.lists(st.tuples(st.integers(1, 5), st.integers(1, 6), st.integers(0, 3)), min_size=1, max_size=6),
    st.integers(0, 6),
    st.sampled_from([1, 1, 2]),
    st.sampled_from([None, 7]),
    st.sampled_from([None, 6]),
    st.sampled_from([None, 2]),
)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(list_instances, st.randoms(use_true_random=False))
def test_list_schedule_is_first_fit_as_judged_by_the_semantic_core(inst, rnd):
    # Reference: place each request at the earliest slot where the requests placed so far
    # (and it) still replay legally through the core.
    ti = TimeIndexed(inst)
    order = list(range(len(inst)))
    rnd.shuffle(order)
    got = ti.list_schedule(np.array(order))
    placed: list[int] = []
    for i in order:
        placed.append(i)
        sub = Instance(tuple(inst.requests[j] for j in placed), inst.limits, inst.time_model)
        starts = np.array([got[j] for j in placed])
        TimeIndexed(sub).schedule_of(starts)  # raises if illegal
        for earlier in range(int(ti.earliest[i]), int(got[i])):
            starts[-1] = earlier
            with pytest.raises(ScheduleError):
                TimeIndexed(sub).schedule_of(starts)
    assert replay(inst, ti.schedule_of(got)).ok


def _medium_instance(n=14):
    rng = np.random.default_rng(3)
    reqs = tuple(Request(f"r{k}", 0.0, int(rng.integers(2, 30)), int(rng.integers(2, 30))) for k in range(n))
    return Instance(reqs, Limits(kv_capacity=80), TimeModel("unit"))


def test_a_timeout_returns_the_incumbent_and_a_bound():
    inst = _medium_instance()
    result = solve(
        inst, formulation="time", solver="highs", options=SolverOptions(time_limit=0.05, threads=1)
    )
    assert result.schedule is not None and replay(inst, result.schedule).ok
    assert result.status in (SolveStatus.FEASIBLE, SolveStatus.OPTIMAL)
    assert result.objective <= result.stats["upper_bound"]
    if result.best_bound is not None:
        assert result.best_bound <= result.objective + 1e-9


def test_nonzeros_estimate_matches_the_built_model():
    inst = _medium_instance()
    ti = TimeIndexed(inst, "total-latency")
    hint = ti.heuristic_starts()
    wins = ti.windows(ti.value(hint))
    built = ti.build(ti.value(hint), hint, windows=wins, symmetry=False)
    rows = sum(len(built.model.rows[r].idx) for r, _, _ in built.resource_rows)
    # Rows clipped at the horizon's ends lose a few entries; the estimate is never below them.
    assert rows <= ti.nonzeros(wins) <= 1.1 * rows


def test_a_model_too_large_for_the_limit_returns_the_incumbent_and_a_valid_bound(monkeypatch):
    solve_module = importlib.import_module("kvsched.csp.formulations.time")

    inst = _medium_instance()
    full = solve(inst, formulation="time", solver="highs", options=SolverOptions(time_limit=3, threads=1))
    monkeypatch.setattr(solve_module, "MIN_NONZEROS", 0)
    monkeypatch.setattr(solve_module, "NONZEROS_PER_SECOND", 1)
    result = solve(inst, formulation="time", solver="highs", options=SolverOptions(time_limit=3, threads=1))
    # The model is declined before it is built; the first fast schedule (any class) is the answer.
    assert "nonzeros, too many to build" in result.stopped
    assert replay(inst, result.schedule).ok
    assert result.status == SolveStatus.FEASIBLE and result.gap > 0
    # The portfolio's bounds hold for every schedule: below the class optimum and the schedule returned.
    assert result.best_bound == result.all_schedules_bound.value <= min(full.objective, result.objective)


def test_cpsat_reports_anytime_progress():
    inst = mcsf_instance(1, [2, 3, 3, 4, 5], 6, convention="ip")
    result = solve(inst, formulation="time", solver="cpsat", options=FAST)
    assert result.anytime and result.anytime[-1].incumbent == result.objective


@pytest.mark.parametrize("suffix", [".mps", ".lp"])
def test_export_solves_to_the_same_optimum(tmp_path, suffix):
    inst = mcsf_instance(1, [1, 1, 2, 3], 4)
    path = tmp_path / f"model{suffix}"
    result = solve(inst, formulation="time", solver="highs", options=FAST, export=path)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.readModel(str(path))
    h.run()
    assert h.getInfo().objective_function_value == pytest.approx(result.objective)


def test_warm_start_from_a_schedule_in_the_class():
    inst = mcsf_instance(1, [1, 1, 2, 3], 4)
    ti = TimeIndexed(inst)
    optimal = ti.schedule_of(np.array([0, 1, 1, 3]))
    result = solve(inst, formulation="time", solver="highs", options=FAST, warm_start=optimal)
    assert result.stats["warm_start"] == "warm start" and result.stats["upper_bound"] == 16


@pytest.mark.parametrize(
    ("instance", "message"),
    [
        (
            Instance((Request("a", 0, 2, 2),), Limits(8), TimeModel("infermax-linear")),
            "needs the unit time model",
        ),
        (
            Instance((Request("a", 0.5, 2, 2),), Limits(8), TimeModel("unit")),
            "'a': arrival 0.5 is not on the slot",
        ),
        (
            Instance((Request("a", 0, 9, 2),), Limits(16, max_batch_tokens=8), TimeModel("unit")),
            "needs chunked prefill",
        ),
    ],
)
def test_instances_outside_the_class_are_refused_clearly(instance, message):
    with pytest.raises(InputError, match=message):
        solve(instance, formulation="time")


def test_highs_thread_count_can_change_within_a_process():
    # HiGHS keeps a process-wide thread pool; a later solve with another count must still run.
    inst = mcsf_instance(1, [1, 1, 2, 3], 4)
    for threads in (1, 2, 1):
        result = solve(
            inst, formulation="time", solver="highs", options=SolverOptions(time_limit=20, threads=threads)
        )
        assert result.status == SolveStatus.OPTIMAL and result.best_bound == 16


@settings(max_examples=15, deadline=None, derandomize=True)
@given(small_instances, st.sampled_from(sorted(OBJECTIVES)))
def test_profile_and_cumulative_memory_rows_agree(inst, objective):
    values = []
    for cumulative in (True, False):
        ti = TimeIndexed(inst, objective, cumulative=cumulative)
        starts = ti.heuristic_starts()
        model = ti.build(ti.value(starts), starts).model
        assert model.violations(model.hint) == []
        from kvsched.csp.backends import solve_model

        raw = solve_model(model, "highs", FAST)
        values.append(raw.objective)
    assert values[0] == pytest.approx(values[1])
