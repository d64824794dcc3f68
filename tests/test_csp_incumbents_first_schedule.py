"""The first schedule under a deadline a greedy run would overrun: a policy's, and nothing that cannot fit after it.

At 100k Azure conversation requests under the A100 fit a greedy run takes about 82 s; a 60 s solve once ran
it anyway and ended at 113 s. The estimate that decides it is made large here, so that a small instance
stands in for a large one.
"""

from __future__ import annotations

import importlib
import time

import pytest

from kvsched.csp import SolverOptions, solve
from kvsched.csp.incumbents import best_incumbent, improve
from kvsched.csp.incumbents.best import FIRST_POLICY
from kvsched.csp.incumbents.greedy import run_estimate
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.generators import Poisson, Uniform, synthetic
from kvsched.instances.model import Limits, TimeModel
from kvsched.schedule.validate import instance_cost_model, replay
from kvsched.stop import Deadline

#: The module (the package's ``greedy`` is the function).
greedy_module = importlib.import_module("kvsched.csp.incumbents.greedy")
LINEAR = TimeModel("infermax-linear", {"a0": 0.5, "a1": 0.1, "b0": 0.2, "b1": 0.05, "p0": 0.3, "p1": 0.02})


def _instance(time_model: TimeModel = LINEAR):
    limits = Limits(kv_capacity=300, block_size=1, max_batch_tokens=32, max_prefill_tokens=32)
    return synthetic(
        40, 1, limits, time_model, prompt=Uniform(5, 40), output=Uniform(2, 30), arrival=Poisson(2.0)
    )


@pytest.fixture
def slow_greedy(monkeypatch):
    """Every greedy run estimated at an hour."""
    monkeypatch.setattr(greedy_module, "COSTLY_RUN_SECONDS_PER_TOKEN", 3600.0)
    monkeypatch.setattr(greedy_module, "UNIT_RUN_SECONDS_PER_TOKEN", 3600.0)


def test_the_estimate_is_per_output_token_and_higher_under_seconds_models():
    inst = _instance()
    tokens = sum(r.output for r in inst.requests)
    unit = _instance(TimeModel("unit"))
    assert run_estimate(inst, instance_cost_model(inst)) == pytest.approx(4e-6 * tokens)
    assert run_estimate(unit, instance_cost_model(unit)) == pytest.approx(1e-6 * tokens)


def test_a_greedy_run_that_would_overrun_gives_way_to_the_policy(slow_greedy):
    inst = _instance()
    got = best_incumbent(inst, deadline=Deadline.after(30.0))
    assert got.name == f"policy:{FIRST_POLICY}" and got.stats["greedy_skipped_for_time"]
    assert any(s.startswith("greedy:") for s in got.stats["skipped"])
    trace = replay(inst, got.schedule)
    assert trace.ok and got.value == pytest.approx(
        float(sum(trace.state.completion) - sum(r.arrival for r in inst.requests))
    )
    # Without a deadline, or in unit time (where eviction is free and the greedy is fast), the greedy runs.
    assert best_incumbent(inst).name.startswith("greedy:")
    unit = _instance(TimeModel("unit"))
    assert not best_incumbent(unit, deadline=Deadline.after(30.0)).name.startswith("policy:")


def test_the_first_schedule_is_judged_by_the_whole_solves_deadline():
    # A first greedy run may take more than the incumbent stage's share: only the whole solve's deadline
    # decides whether it fits (an estimate of seconds against a share of milliseconds still runs it).
    inst = _instance()
    got = best_incumbent(inst, deadline=Deadline.after(0.001), first_deadline=Deadline.after(60.0))
    assert got.name.startswith("greedy:")
    # Judged by the share alone (a millisecond, against an estimate of a few), the policy would come first.
    assert best_incumbent(inst, deadline=Deadline.after(0.001)).name.startswith("policy:")


def test_the_local_search_prices_a_policys_incumbent_by_the_estimate(slow_greedy):
    inst = _instance()
    first = best_incumbent(inst, deadline=Deadline.after(30.0))
    started = time.perf_counter()
    got = improve(inst, first, Deadline.after(20.0))
    assert got.stats["evaluations"] == 0 and got.value == first.value
    assert time.perf_counter() - started < 5.0


def test_the_pipeline_says_it_stopped_for_time(slow_greedy):
    limits = Limits(kv_capacity=120, block_size=1, max_batch_tokens=16, max_prefill_tokens=16)
    inst = synthetic(
        15, 2, limits, LINEAR, prompt=Uniform(3, 30), output=Uniform(2, 12), arrival=Poisson(2.0)
    )
    result = solve(inst, options=SolverOptions(time_limit=8.0), deadline=Deadline.after(8.0))
    assert result.runtime < 7.5  # it ended early: the label is not the deadline's expiry
    assert result.stats["found_by"] == f"policy:{FIRST_POLICY}"
    assert result.stopped == "deadline"
    assert result.best_bound <= result.objective


class _ColdKernel:
    """A greedy kernel never compiled nor cached (a fresh install)."""

    signatures = ()


@pytest.mark.parametrize(("time_model", "first"), [(TimeModel("unit"), "mcsf"), (LINEAR, FIRST_POLICY)])
def test_a_cold_kernel_whose_compile_and_interpreted_run_would_overrun_gives_way_to_a_policy(
    monkeypatch, time_model, first
):
    best_module = importlib.import_module("kvsched.csp.incumbents.best")
    monkeypatch.setattr(best_module, "advance_jit", _ColdKernel())
    monkeypatch.setattr(best_module, "interpreted_seconds", lambda instance: 3600.0)
    inst = _instance(time_model)
    if first == "mcsf":  # (MC-SF's model: unit time, no token budget)
        inst = synthetic(
            40, 1, Limits(kv_capacity=300), time_model, prompt=Uniform(5, 40), output=Uniform(2, 30),
            arrival=Poisson(2.0),
        )  # fmt: skip
    # (10 s: less than the compile's 20 s and the interpreted run's hour.)
    got = best_incumbent(inst, deadline=Deadline.after(10.0))
    assert got.name == f"policy:{first}" and got.stats["greedy_skipped_for_time"]
    assert replay(inst, got.schedule).ok
    # Where mcsf cannot run, sarathi does.
    real = best_module._policy

    def no_mcsf(instance, name, *args):
        if name == "mcsf":
            raise best_module.KvschedError("mcsf: cannot run this instance")
        return real(instance, name, *args)

    monkeypatch.setattr(best_module, "_policy", no_mcsf)
    assert best_incumbent(inst, deadline=Deadline.after(10.0)).name == f"policy:{FIRST_POLICY}"
    # With time for the interpreted run (or the compile) the greedy runs as before.
    monkeypatch.setattr(best_module, "interpreted_seconds", lambda instance: 0.0)
    assert best_incumbent(inst, deadline=Deadline.after(10.0)).name.startswith(("greedy:", "knapsack:"))


def test_the_local_search_from_a_policy_prices_a_cold_kernels_compile(monkeypatch):
    """From a policy's schedule every candidate is a greedy run: with the kernel cold, the first must compile it
    (an interpreted run may take many times its estimate), so under a deadline shorter than the compile none
    starts."""
    lns_module = importlib.import_module("kvsched.csp.incumbents.lns")
    best_module = importlib.import_module("kvsched.csp.incumbents.best")
    inst = _instance(TimeModel("unit"))
    start = best_module._policy(inst, FIRST_POLICY, "total-latency", instance_cost_model(inst))
    monkeypatch.setattr(lns_module, "advance_jit", _ColdKernel())
    got = improve(inst, start, Deadline.after(10.0))  # (less than the compile's 20 s)
    assert got.stats["evaluations"] == 0 and got.value == start.value
    monkeypatch.undo()
    assert improve(inst, start, Deadline.after(10.0)).stats["evaluations"] > 0  # warm: the search runs


# ------------------------------------------------------- a first schedule that would overrun the limit
@pytest.fixture
def cut_at_once(monkeypatch):
    """Finishing costs an hour a request, and the simulator reads the deadline at every entry: a policy's run
    under a deadline is cut at its first entry."""
    import kvsched.heuristics.simulator as simulator

    best_module = importlib.import_module("kvsched.csp.incumbents.best")
    monkeypatch.setattr(best_module, "SECONDS_PER_REQUEST", 3600.0)
    monkeypatch.setattr(simulator, "DEADLINE_EVERY", 1)


def test_the_policys_first_schedule_is_cut_for_time_and_finished_by_the_core(slow_greedy, cut_at_once):
    # Sarathi's run alone took 4-10 s on 10k requests under the A100 fit, past a 1 s limit.
    inst = _instance()
    got = best_incumbent(inst, deadline=Deadline.after(30.0))
    assert got.name == f"policy:{FIRST_POLICY}+reserved-batches"
    assert 0 < got.stats["cut_for_time"] <= len(inst) and got.stats["greedy_skipped_for_time"]
    trace = replay(inst, got.schedule)
    assert trace.ok and got.value == pytest.approx(
        float(sum(trace.state.completion) - sum(r.arrival for r in inst.requests))
    )
    # Without a deadline the policy runs whole.
    assert _policy_of(inst).name == f"policy:{FIRST_POLICY}"


def _policy_of(inst):
    best_module = importlib.import_module("kvsched.csp.incumbents.best")
    return best_module._policy(inst, FIRST_POLICY, "total-latency", instance_cost_model(inst))


def test_with_a_schedule_in_hand_nothing_that_would_overrun_runs(slow_greedy, monkeypatch):
    # A warm start (compare's policies) makes a first schedule unnecessary: neither the greedy nor the
    # policy runs where its estimate does not fit.
    inst = _instance()
    warm = _policy_of(inst)
    best_module = importlib.import_module("kvsched.csp.incumbents.best")

    def refuse(*args, **kwargs):
        raise AssertionError("nothing should run")

    monkeypatch.setattr(best_module, "_policy", refuse)
    monkeypatch.setattr(best_module, "run_variant", refuse)
    got = best_incumbent(inst, deadline=Deadline.after(30.0), given=warm)
    assert got.schedule is warm.schedule and got.stats["greedy_skipped_for_time"]
    assert got.stats["tried"] == {warm.name: warm.value}
    assert any(s.startswith("greedy:") for s in got.stats["skipped"])
    # The pipeline takes the warm start as its first schedule (a simulation's own trace: no second replay).
    driver = importlib.import_module("kvsched.csp.driver")
    real = driver.replay
    replayed = []
    monkeypatch.setattr(driver, "replay", lambda *a, **k: replayed.append(a) or real(*a, **k))
    sim = simulate(inst, make_policy(FIRST_POLICY))
    result = solve(inst, warm_start=sim, deadline=Deadline.after(8.0))
    assert result.stats["found_by"] == "warm start" and result.objective == pytest.approx(warm.value)
    assert result.stopped == "deadline" and result.best_bound <= result.objective
    assert not replayed and replay(inst, result.schedule).ok
