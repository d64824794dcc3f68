"""The certified pipeline: what it hands back is ready to report without another replay."""

import numpy as np
import pytest

from kvsched.csp import SolverOptions, solve
from kvsched.csp.objectives import OBJECTIVES
from kvsched.csp.result import SolveStatus
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.validate import replay
from kvsched.stop import Deadline


def _congested(n: int = 60) -> Instance:
    rng = np.random.default_rng(0)
    reqs = tuple(
        Request(f"r{k}", float(rng.integers(0, 3 * n)), int(rng.integers(5, 40)), int(rng.integers(2, 20)))
        for k in range(n)
    )
    return Instance(reqs, Limits(kv_capacity=2 * max(r.peak_kv for r in reqs)), TimeModel("unit"))


def test_a_pipeline_that_runs_out_of_work_says_so_not_gap():
    """Ending early with a gap left is "converged" (its stages had nothing more to do); it used to say
    "gap", as if a gap target had been met, though the pipeline takes none. (30 requests end in about 2 s
    alone: a limit far above that, so that a loaded machine does not price a stage out, which says
    "deadline".)"""
    result = solve(
        _congested(30),
        formulation="auto",
        options=SolverOptions(time_limit=60.0),
        deadline=Deadline.after(60.0),
    )
    assert result.runtime < 60.0
    assert "out_of_time" not in result.stats
    assert result.status == SolveStatus.FEASIBLE and result.gap > 0
    assert result.stopped == "converged"


def test_a_pipeline_whose_stages_are_priced_out_says_deadline_not_converged(monkeypatch):
    """A stage left out because its next step would not fit is not a stage out of work: 100k requests had a
    60 s solve end at 22 s as "converged" with a 75% gap, its Lagrangian and local search priced out."""
    from kvsched.csp import pipeline

    # The Lagrangian needs twice the best schedule's replay, or LAGRANGIAN_MIN_SECONDS where the replay is
    # kept: make both look too long to fit.
    real = pipeline._lagrangian
    monkeypatch.setattr(pipeline, "LAGRANGIAN_MIN_SECONDS", 1e6)

    def priced_out(log, objective, best, deadline, gap=0.0):
        slow = type(best)(
            best.name, best.schedule, best.value, best.objective, {**best.stats, "replay_s": 1e6}
        )
        return real(log, objective, slow, deadline, gap)

    monkeypatch.setattr(pipeline, "_lagrangian", priced_out)
    result = solve(
        _congested(),
        formulation="auto",
        options=SolverOptions(time_limit=20.0),
        deadline=Deadline.after(20.0),
    )
    assert result.stats["lagrangian"] == "not run: no time left"
    assert "lagrangian" in result.stats["out_of_time"]
    assert result.status == SolveStatus.FEASIBLE and result.gap > 0
    assert result.stopped == "deadline"


def test_a_kept_replay_lets_the_lagrangian_run_however_long_the_replay_took(monkeypatch):
    """At 100k requests the best schedule's replay took 12 s and the Lagrangian was priced out of the 20 s
    left, though that replay was kept and its first pricings take about a second."""
    from kvsched.csp import pipeline

    real = pipeline._lagrangian

    def slow_replay(log, objective, best, deadline, gap=0.0):
        assert log.trace_of(best.value) is not None  # the incumbents stage keeps the best one's replay
        slow = type(best)(
            best.name, best.schedule, best.value, best.objective, {**best.stats, "replay_s": 1e6}
        )
        return real(log, objective, slow, deadline, gap)

    monkeypatch.setattr(pipeline, "_lagrangian", slow_replay)
    result = solve(_congested(), formulation="auto", deadline=Deadline.after(20.0))
    assert result.stats.get("lagrangian_iterations", 0) > 0
    assert "lagrangian" not in result.stats.get("out_of_time", [])


def test_a_local_search_that_runs_out_of_moves_is_not_out_of_time():
    from kvsched.csp.incumbents import best_incumbent, improve

    inst = _congested(20)
    start = best_incumbent(inst, deadline=Deadline.after(10.0))
    better = improve(inst, start, Deadline.after(30.0), kick_patience=2)
    assert better.stats["out_of_time"] is False
    stopped = improve(inst, start, Deadline.after(1e-6))
    assert stopped.stats["out_of_time"] is True


def test_a_local_search_incumbent_comes_with_its_replay():
    """The command reports from the result's trace inside the limit; an incumbent the local search found
    once came without it, and replaying a 10k schedule for its metrics took 4.9 s past a 60 s limit."""
    inst = _congested()
    result = solve(
        inst, formulation="auto", options=SolverOptions(time_limit=4.0), deadline=Deadline.after(4.0)
    )
    assert result.stats.get("improved_by") == "large-neighbourhood search"
    assert result.trace is not None
    again = replay(inst, result.schedule)
    assert OBJECTIVES["total-latency"](result.trace) == OBJECTIVES["total-latency"](again) == result.objective


def test_a_solve_proven_by_its_first_bounds_skips_the_stages_left(monkeypatch):
    """Three requests far apart under a seconds model: the isolated bound meets the first schedule, so the
    LPs, the running caps and the local search (which cannot change the answer) are not run."""
    from kvsched.csp import driver

    monkeypatch.setattr(driver, "AUTO_EXACT_MAX", 0)  # the pipeline, not the exact model, at this size
    linear = TimeModel(
        "infermax-linear", {"a0": 0.5, "a1": 0.1, "b0": 0.2, "b1": 0.05, "p0": 0.3, "p1": 0.02}
    )
    reqs = tuple(Request(f"r{k}", 100.0 * k, 3, 2) for k in range(3))
    inst = Instance(reqs, Limits(kv_capacity=14, max_batch_tokens=4, max_prefill_tokens=4), linear)
    result = solve(inst, formulation="auto", options=SolverOptions(time_limit=20.0))
    assert result.status == SolveStatus.OPTIMAL and result.stopped == ""
    assert result.stats["proven_by"] == "the bounds portfolio"
    assert "batch_rate_lp_seconds" not in result.stats and "sharing_lp_seconds" not in result.stats
    assert "improved_by" not in result.stats


def test_a_gap_target_met_by_the_first_bounds_skips_the_stages_left():
    # --gap was read only by the exact models' back ends: a pipeline solve ran to its deadline with a
    # 0.006% gap against --gap 0.01. Now it stops between stages once the certified gap is within it.
    inst = _congested(30)
    loose = solve(inst, options=SolverOptions(time_limit=60.0, gap=0.99), deadline=Deadline.after(60.0))
    assert loose.stopped == "gap" and loose.stats["gap_met_by"] == "the bounds portfolio"
    assert loose.status == SolveStatus.FEASIBLE and 0 < loose.gap <= 0.99
    assert "improved_by" not in loose.stats and "lagrangian_seconds" not in loose.stats
    assert replay(inst, loose.schedule).ok
    # A target the solve cannot meet leaves it as it was.
    tight = solve(inst, options=SolverOptions(time_limit=60.0, gap=1e-9), deadline=Deadline.after(60.0))
    assert tight.stopped != "gap" and "gap_met_by" not in tight.stats


def test_the_makespan_gap_counts_from_the_first_arrival():
    # The makespan is an absolute time: relative to it, the same schedules of a trace starting at 50,000 s
    # had a gap of 0.006% where the trace from 0 had 2.3%.
    base = _congested(30)
    shifted = Instance(
        tuple(Request(r.id, r.arrival + 50_000.0, r.prompt, r.output) for r in base.requests),
        base.limits,
        base.time_model,
    )
    first = min(r.arrival for r in shifted.requests)
    result = solve(shifted, objective="makespan", options=SolverOptions(time_limit=20.0))
    assert result.best_bound is not None and result.objective > first
    span = result.objective - first
    assert result.gap == pytest.approx(max(0.0, result.objective - result.best_bound) / span)


def test_ctrl_c_in_a_compiled_kernel_keeps_the_best_schedule_and_runs_no_stage_after(monkeypatch):
    """Ctrl-C inside a numba kernel arrives as a SystemError caused by the KeyboardInterrupt (the dispatcher
    wraps it): it ended a solve as an internal error, losing the validated schedule. It is an interrupt,
    and no stage starts after it; any other SystemError is still raised."""
    from kvsched.csp import pipeline

    def ctrl_c_in_a_kernel(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise SystemError(
                "CPUDispatcher(<function price_blocks>) returned a result with an exception set"
            ) from exc

    def no_stage(*args, **kwargs):
        raise AssertionError("a stage ran after Ctrl-C")

    monkeypatch.setattr(pipeline, "_lagrangian", ctrl_c_in_a_kernel)
    monkeypatch.setattr(pipeline, "_running_caps", no_stage)
    monkeypatch.setattr(pipeline, "improve", no_stage)
    inst = _congested()
    result = solve(inst, formulation="auto", options=SolverOptions(time_limit=20.0))
    assert result.stopped == "interrupted" and result.stats["interrupted"] == "during the Lagrangian"
    assert OBJECTIVES["total-latency"](replay(inst, result.schedule)) == result.objective

    def a_bug(*args, **kwargs):
        raise SystemError("a real one")

    monkeypatch.setattr(pipeline, "_lagrangian", a_bug)
    with pytest.raises(SystemError, match="a real one"):
        solve(inst, formulation="auto", options=SolverOptions(time_limit=20.0))
