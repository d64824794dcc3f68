"""``--formulation auto`` on small instances: the pipeline, then the exact model from its schedule; and exact
models whose build would overrun the deadline stop building instead."""

import time

import pytest

import kvsched.csp.backends as backends
import kvsched.csp.driver as driver
import kvsched.csp.formulations.batch as batch
from kvsched.csp import Deadline, SolverOptions, SolveStatus, solve
from kvsched.csp.backends import RawSolution
from kvsched.csp.formulations import make_formulation
from kvsched.csp.formulations.base import Declined
from kvsched.errors import InputError, KvschedError
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.validate import replay


def _long_outputs() -> Instance:
    """Six requests with outputs of 20-40 tokens in tight memory: a batch-indexed model of thousands of
    variables (one per request, token and batch) for an instance the pipeline settles in a second."""
    shapes = [(3, 40), (5, 30), (2, 35), (8, 20), (4, 25), (1, 38)]
    reqs = tuple(Request(f"r{k}", 0.0, i, o) for k, (i, o) in enumerate(shapes))
    return Instance(reqs, Limits(kv_capacity=60), TimeModel("unit"))


def test_a_build_that_would_overrun_stops_and_is_declined(monkeypatch):
    inst = _long_outputs()
    form = make_formulation("batch", inst, "total-latency")
    hint = simulate(inst, make_policy("vllm")).schedule
    monkeypatch.setattr(batch, "VARIABLES_PER_SECOND", 10**12)  # the estimate lets it start
    deadline = Deadline.after(batch.MIN_BUILD_SECONDS + 0.05)
    start = time.perf_counter()
    built = form.build(hint, deadline, SolverOptions(threads=1), True)
    assert isinstance(built, Declined) and "building them took the time left" in built.reason
    assert time.perf_counter() - start < batch.MIN_BUILD_SECONDS + 0.05


def test_auto_runs_the_pipeline_then_the_exact_model_from_its_schedule(monkeypatch):
    inst = _long_outputs()
    seen = {}
    real = driver._solve_exact

    def spy(run, form, objective, solver, options, deadline, warm_start, *rest, **kw):
        if not seen:  # (the time-indexed warm start inside it is a solve of its own)
            seen["warm_start"] = warm_start
            seen["bounds"] = list(run.bounds)
        return real(run, form, objective, solver, options, deadline, warm_start, *rest, **kw)

    monkeypatch.setattr(driver, "_solve_exact", spy)
    result = solve(inst, time_limit=8, options=SolverOptions(threads=1))
    assert "then the exact batch-indexed model" in result.stats["auto"]
    # The pipeline alone leaves a gap here (261 against 244), so the exact model runs after it.
    assert "pipeline" in result.stats
    assert seen["warm_start"] is not None and seen["bounds"]  # the pipeline's schedule and bounds
    pipeline = result.stats["pipeline"]["objective"]
    assert result.objective <= pipeline + 1e-9
    assert result.best_bound >= max(b.value for b in seen["bounds"]) - 1e-9
    assert replay(inst, result.schedule).ok


def test_auto_keeps_the_pipelines_schedule_when_the_model_is_declined(monkeypatch):
    inst = _long_outputs()
    monkeypatch.setattr(batch, "VARIABLES_PER_SECOND", 1e-6)  # every model too large
    result = solve(inst, time_limit=8, options=SolverOptions(threads=1))
    assert replay(inst, result.schedule).ok
    if result.formulation == "pipeline":  # the pipeline's schedule stands, and the result says why
        assert result.status == SolveStatus.OPTIMAL or "too many to build" in result.stats["exact_model"]
    else:  # the exact solve's own first schedule was as good
        assert "too many to build" in result.stopped
        assert result.objective <= result.stats["pipeline"]["objective"] + 1e-9


@pytest.mark.parametrize("objective", ["total-latency", "makespan"])
def test_auto_never_reports_worse_than_the_exact_model_alone(monkeypatch, objective):
    # A back end that finds nothing: the result is the pipeline's schedule, with every bound in its scope.
    inst = _long_outputs()
    monkeypatch.setitem(
        backends.BACKENDS,
        "highs",
        lambda model, options, deadline: RawSolution(SolveStatus.UNKNOWN, None, None, None, 0.0),
    )
    result = solve(inst, objective=objective, time_limit=6, options=SolverOptions(threads=1))
    assert result.schedule is not None and replay(inst, result.schedule).ok
    assert all(b.value <= result.objective + 1e-9 for b in result.bounds)


def test_auto_runs_the_exact_model_alone_where_the_pipeline_finds_no_schedule(monkeypatch):
    def fails(*args, **kwargs):
        raise KvschedError("no greedy rule or policy produced a legal schedule for this instance")

    monkeypatch.setattr(driver, "solve_pipeline", fails)
    inst = _long_outputs()
    result = solve(inst, time_limit=6, options=SolverOptions(threads=1))
    assert result.formulation == "batch-indexed" and "pipeline" not in result.stats
    assert replay(inst, result.schedule).ok


@pytest.mark.parametrize("formulation", ["auto", "batch", "time"])
def test_an_illegal_warm_start_is_refused_not_dropped(formulation):
    # A schedule of another instance (its requests fit by position, its batches do not) used to be
    # skipped as "not an incumbent" and the solve reported as if it had never been given.
    inst = Instance(tuple(Request(f"r{k}", 0.0, 4, 3) for k in range(3)), Limits(kv_capacity=8))
    other = Instance(tuple(Request(f"r{k}", 0.0, 2, 1) for k in range(3)), Limits(kv_capacity=8))
    foreign = simulate(other, make_policy("vllm")).schedule
    with pytest.raises(InputError, match="warm_start: not a legal schedule of this instance"):
        solve(inst, formulation=formulation, warm_start=foreign, time_limit=5)


def test_a_legal_warm_start_is_replayed_once(monkeypatch):
    inst = Instance(tuple(Request(f"r{k}", float(k), 4, 3) for k in range(3)), Limits(kv_capacity=8))
    warm = simulate(inst, make_policy("vllm")).schedule
    calls = []
    real = driver.replay

    def counting(instance, schedule, *args, **kwargs):
        calls.append(schedule is warm)
        return real(instance, schedule, *args, **kwargs)

    monkeypatch.setattr(driver, "replay", counting)
    monkeypatch.setattr("kvsched.csp.run.replay", counting)
    result = solve(inst, formulation="batch", warm_start=warm, time_limit=5)
    assert result.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE)
    assert sum(calls) == 1  # the check's replay is the evaluation's
