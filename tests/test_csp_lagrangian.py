"""Reduced-cost windows: a valid bound, windows that keep an optimum, and a better incumbent."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsched.csp import SolverOptions, SolveStatus, solve
from kvsched.csp.lagrangian import lagrangian
from kvsched.csp.timeindexed import TimeIndexed
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.validate import replay

from .test_csp_timeindexed import brute_force

FAST = SolverOptions(time_limit=20, threads=1)

tight_instances = st.builds(
    lambda reqs, extra, cap_c: Instance(
        tuple(Request(f"q{k}", float(a), i, o) for k, (i, o, a) in enumerate(reqs)),
        Limits(kv_capacity=max(i + o - 1 for i, o, _ in reqs) + extra, max_batch_tokens=cap_c),
        TimeModel("unit"),
    ),
    st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(0, 2)), min_size=2, max_size=3),
    st.integers(0, 3),
    st.sampled_from([None, 5]),
)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tight_instances, st.sampled_from(["total-latency", "sum-ttft"]))
def test_bound_is_below_the_brute_force_optimum_and_windows_keep_one(inst, objective):
    best = brute_force(inst, objective, span=7)
    ti = TimeIndexed(inst, objective)
    hint = ti.heuristic_starts()
    lag = lagrangian(ti, hint, FAST)
    assert lag is not None and lag.bound <= best + 1e-9
    for window, start in zip(lag.windows(ti, ti.value(hint), hint), hint, strict=True):
        assert window.first <= start <= window.last
    result = solve(inst, formulation="time", objective=objective, options=FAST)
    assert result.status == SolveStatus.OPTIMAL and result.objective == pytest.approx(best)
    assert result.stats["lagrangian_bound"] <= best + 1e-9


def _sharegpt_like(n: int, seed: int) -> Instance:
    rng = np.random.default_rng(seed)
    prompts = np.maximum(1, rng.lognormal(1.5, 0.8, n).astype(int))
    outputs = np.maximum(1, rng.lognormal(2.2, 0.6, n).astype(int))
    reqs = tuple(
        Request(f"r{k}", 0.0, int(p), int(o)) for k, (p, o) in enumerate(zip(prompts, outputs, strict=True))
    )
    peaks = prompts + outputs - 1
    return Instance(
        reqs, Limits(kv_capacity=max(int(peaks.max()), int(0.4 * peaks.sum()))), TimeModel("unit")
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_narrowed_windows_prove_the_same_optimum_with_a_much_smaller_model(seed):
    inst = _sharegpt_like(12, seed)
    strong = solve(inst, formulation="time", options=FAST)
    plain = solve(inst, formulation="time", options=FAST, strengthen=False)
    assert strong.status == plain.status == SolveStatus.OPTIMAL
    assert strong.objective == plain.objective
    assert strong.stats["mean_window"] < plain.stats["mean_window"] / 2
    assert strong.stats["variables"] < plain.stats["variables"] / 2
    assert strong.stats["lagrangian_bound"] <= strong.objective
    assert replay(inst, strong.schedule).ok


def test_makespan_keeps_the_objective_windows():
    inst = _sharegpt_like(6, 2)
    ti = TimeIndexed(inst, "makespan")
    hint = ti.heuristic_starts()
    assert lagrangian(ti, hint, FAST) is None
    assert (
        solve(inst, formulation="time", objective="makespan", options=FAST).stats["lagrangian_bound"] is None
    )


def test_local_search_never_worsens_and_stays_legal():
    inst = _sharegpt_like(25, 3)
    ti = TimeIndexed(inst)
    start = ti.heuristic_starts()
    better = ti.improve(start, moves=300)
    assert ti.value(better) <= ti.value(start)
    assert replay(inst, ti.schedule_of(better)).ok
    assert np.array_equal(better, ti.improve(start, moves=300))  # seeded: reproducible


def test_windows_keep_the_hint_of_identical_requests_in_symmetry_order():
    # Requests 0 and 2 are identical; the hint starts the later one first. The model sorts
    # identical starts (its symmetry rows), so the windows must hold the sorted hint.
    reqs = (Request("a", 0.0, 4, 3), Request("b", 0.0, 1, 5), Request("c", 0.0, 4, 3))
    inst = Instance(reqs, Limits(kv_capacity=9), TimeModel("unit"))
    ti = TimeIndexed(inst)
    hint = ti.list_schedule(np.array([1, 2, 0]))
    assert hint.tolist() == [4, 0, 0] and replay(inst, ti.schedule_of(hint)).ok
    lag = lagrangian(ti, hint, FAST)
    windows = lag.windows(ti, ti.value(hint), hint)
    model = ti.build(ti.value(hint), hint, windows=windows).model
    assert model.violations(model.hint) == []
