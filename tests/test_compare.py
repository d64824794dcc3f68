"""Regret reports: policies and the exact optimum on the same instance and cost model."""

import dataclasses
import importlib
import math
import time

import pytest

from kvsched.analysis import compare
from kvsched.analysis.compare import MAX_REGRET_ALL, MAX_REGRET_SCOPE, REGRET, REGRET_PCT
from kvsched.cli import main
from kvsched.csp import Scope, SolverOptions, SolveStatus
from kvsched.errors import InputError
from kvsched.instances.io import load_instance
from kvsched.instances.model import TimeModel
from kvsched.schedule.validate import replay
from kvsched.stop import Deadline
from tests.test_examples import EXAMPLES

# The module (``kvsched.analysis.compare`` the attribute is the function).
compare_mod = importlib.import_module("kvsched.analysis.compare")

FAST = SolverOptions(time_limit=20, threads=1)
#: Where a test checks only that what the solve reports is true, not that it proves an optimum: tiny.json's
#: makespan and sum-ttft solves run to their limit (20 s of 20 s on a slow machine) without closing the gap.
QUICK = SolverOptions(time_limit=2, threads=1)


def test_regret_on_figure15_shows_evictions_beat_the_no_eviction_class():
    inst = load_instance(EXAMPLES / "figure15.json")
    cmp = compare(inst, ["vllm", "vllm-ef"], formulation="time", options=FAST)
    t = cmp.table
    assert cmp.result.status == SolveStatus.OPTIMAL
    # Without evictions the best is 4 requests one after another: 4 + 8 + 12 + 16 = 40 slots.
    assert cmp.result.objective == 40
    assert t.loc["vllm-ef", "objective"] == 40 and t.loc["vllm-ef", REGRET] == 0
    # vLLM evicts (seed 003 Fig. 15) and beats that class optimum: negative regret.
    assert t.loc["vllm", "objective"] == 36 and t.loc["vllm", REGRET] == -4
    assert t.loc["vllm", "evictions"] == 2
    # The certified column is against bounds valid for every schedule.
    assert cmp.lower_bound is not None and cmp.lower_bound <= 36
    assert t.loc["vllm", MAX_REGRET_ALL] == 36 - cmp.lower_bound
    for schedule in cmp.schedules.values():
        assert replay(inst, schedule).ok


def test_the_default_formulation_ranges_over_every_schedule():
    # The API's default is the CLI's: auto, here the exact batch model, whose optimum allows evictions.
    cmp = compare(load_instance(EXAMPLES / "figure15.json"), ["vllm"], options=FAST)
    assert cmp.result.status == SolveStatus.OPTIMAL and cmp.result.scope == Scope.ALL
    assert cmp.result.objective == 36 and cmp.table.loc["vllm", REGRET] == 0


def test_unrunnable_policy_is_reported_not_fatal():
    inst = load_instance(EXAMPLES / "chunked-prefill.json")
    cmp = compare(inst, ["vllm", "sarathi"], solver=None)
    # vllm prefills whole prompts, which exceed this instance's prefill budget.
    assert isinstance(cmp.table.loc["vllm", "error"], str)
    assert math.isfinite(cmp.table.loc["sarathi", "objective"])
    assert cmp.result is None


@pytest.mark.parametrize("objective", ["makespan", "sum-ttft"])
def test_other_objectives(objective):
    inst = load_instance(EXAMPLES / "tiny.json")
    cmp = compare(inst, ["sarathi"], objective=objective, options=QUICK)
    assert cmp.result.objective_name == objective
    assert cmp.table.loc["sarathi", "objective"] >= cmp.lower_bound


# ----------------------------------------------------------------------------- scope and intervals
def test_every_regret_names_its_reference_and_the_scope_beside_it():
    inst = load_instance(EXAMPLES / "figure15.json")
    cmp = compare(inst, ["vllm", "vllm-ef"], formulation="time", options=FAST)
    t = cmp.table
    assert cmp.result.scope == Scope.CONTIGUOUS
    assert (t["scope"] == "contiguous").all()
    for column in (REGRET, REGRET_PCT, MAX_REGRET_SCOPE, MAX_REGRET_ALL):
        assert column in t.columns
    # A proven optimum closes the interval: the regret against the scope's optimum is known exactly.
    assert (t[MAX_REGRET_SCOPE] == t[REGRET]).all()


def test_an_unproven_optimum_gives_an_interval_that_contains_the_true_regret(monkeypatch):
    inst = load_instance(EXAMPLES / "figure15.json")
    exact = compare(inst, ["vllm", "vllm-ef"], options=FAST)
    optimum = exact.result.objective
    real = compare_mod.solve

    def unproven(*args, **kwargs):
        # As a time-out would leave it: a schedule worse than the optimum and a weaker (true) bound.
        res = real(*args, **kwargs)
        return dataclasses.replace(res, status=SolveStatus.FEASIBLE, best_bound=optimum - 6.0, gap=0.2)

    monkeypatch.setattr(compare_mod, "solve", unproven)
    t = compare(inst, ["vllm", "vllm-ef"], options=FAST).table
    true_regret = t["objective"] - optimum
    assert (t[REGRET] <= true_regret).all() and (true_regret <= t[MAX_REGRET_SCOPE]).all()
    assert (t[MAX_REGRET_SCOPE] - t[REGRET] == 6.0).all()


# ----------------------------------------------------------------------------- checked before running
@pytest.fixture
def no_simulation(monkeypatch):
    """Fail the test if any policy runs."""

    def simulate(*args, **kwargs):
        raise AssertionError("a policy ran before the configuration was checked")

    monkeypatch.setattr(compare_mod, "simulate", simulate)


def _seconds_based(name: str = "tiny.json"):
    inst = load_instance(EXAMPLES / name)
    return dataclasses.replace(inst, time_model=TimeModel("infermax-linear", {}))


def test_a_formulation_that_cannot_take_the_instance_fails_before_any_policy_runs(no_simulation):
    t0 = time.perf_counter()
    with pytest.raises(InputError, match="unit time model"):
        compare(_seconds_based(), "all", formulation="time", options=FAST)
    assert time.perf_counter() - t0 < 5  # milliseconds, not the 36 policies


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"options": SolverOptions(time_limit=0)}, "time_limit"),
        ({"options": SolverOptions(time_limit=float("nan"))}, "time_limit"),
        ({"options": SolverOptions(threads=0)}, "threads"),
        ({"options": SolverOptions(gap=1.5)}, "gap"),
        ({"solve_options": {"allow_evictions": False}}, "solve_options: unknown 'allow_evictions'"),
        ({"solver": "gurobi"}, "solver"),
        ({"formulation": "tokens"}, "formulation"),
        ({"objective": "latency"}, "objective"),
    ],
)
def test_a_bad_solver_configuration_fails_before_any_policy_runs(no_simulation, kwargs, match):
    inst = load_instance(EXAMPLES / "tiny.json")
    with pytest.raises(InputError, match=match) as err:
        compare(inst, ["sarathi"], **kwargs)
    assert "\n" not in str(err.value)


def test_skipping_solver_errors_runs_the_policies_but_not_the_solve(monkeypatch):
    def solve(*args, **kwargs):
        raise AssertionError("the solve ran although its formulation cannot take the instance")

    monkeypatch.setattr(compare_mod, "solve", solve)
    cmp = compare(_seconds_based(), ["sarathi"], formulation="time", options=FAST, skip_solver_errors=True)
    assert cmp.result is None and "unit time model" in cmp.solver_error
    assert math.isfinite(cmp.table.loc["sarathi", "objective"])


def test_cli_compare_rejects_a_formulation_before_running_policies(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(compare_mod, "simulate", lambda *a, **k: pytest.fail("a policy ran"))
    args = ["compare", str(EXAMPLES / "tiny.json"), "--cost-model", "infermax-linear", "--time-limit", "5"]
    assert main([*args, "--formulation", "time"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unit time model" in err and len(err.splitlines()) == 1


# ----------------------------------------------------------------------------- the deadline
def test_the_deadline_reaches_the_solve_and_the_policies_count_against_it(spy):
    inst = load_instance(EXAMPLES / "figure15.json")
    calls = spy(compare_mod, "solve")
    deadline = Deadline.after(30)
    compare(inst, ["vllm"], options=FAST, deadline=deadline)
    assert [call["deadline"] for call in calls] == [deadline]


def test_a_spent_deadline_still_gives_a_validated_schedule_and_true_bounds():
    inst = load_instance(EXAMPLES / "figure15.json")
    cmp = compare(inst, ["vllm", "vllm-ef"], options=FAST, deadline=Deadline(end=0.0, limit=1.0))
    res = cmp.result
    assert res.schedule is not None and replay(inst, res.schedule).ok
    assert cmp.lower_bound is not None and cmp.lower_bound <= 36  # vllm's 36 is the true optimum
    if res.best_bound is not None:
        assert res.best_bound <= res.objective
    # No time was left to start a policy: each row says so, and the solver's row stands.
    assert (cmp.table.loc[["vllm", "vllm-ef"], "error"] == compare_mod.NOT_RUN).all()
    assert (cmp.table[MAX_REGRET_ALL].dropna() >= 0).all() and cmp.table[MAX_REGRET_ALL].notna().any()


def test_no_policy_starts_past_its_share_of_the_time_limit(monkeypatch):
    inst = load_instance(EXAMPLES / "figure15.json")
    real = compare_mod.simulate

    def slow(*args, **kwargs):
        time.sleep(1.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(compare_mod, "simulate", slow)
    names = ["vllm", "vllm-ef", "sarathi", "mcsf", "kfcfs"]
    # Without a solver the policies may use the whole limit: three start by 2.5 s, the fourth would at 3 s.
    cmp = compare(inst, names, solver=None, deadline=Deadline.after(2.5))
    errors = cmp.table.loc[names, "error"]
    assert errors.isna().tolist() == [True, True, True, False, False]
    assert (errors.dropna() == compare_mod.NOT_RUN).all()
    # With a solver they may start only in the first half: two by 1.4 s.
    cmp = compare(inst, names, options=FAST, deadline=Deadline.after(2.8))
    assert cmp.table.loc[names, "error"].isna().tolist() == [True, True, False, False, False]
    assert cmp.result is not None and replay(inst, cmp.result.schedule).ok


def test_a_policy_still_running_at_the_time_limit_is_stopped(monkeypatch):
    # A slow policy on 100k requests ran for 17 minutes inside compare --time-limit 20: simulate now gets the
    # policies' deadline, and a policy it stops is a row of its own (no figures), not a stalled command.
    import kvsched.heuristics.simulator as simulator
    from kvsched.instances.generators import generate

    monkeypatch.setattr(simulator, "DEADLINE_EVERY", 1)  # check at every entry: a tiny run can be cut
    inst = generate("synthetic", n=300, seed=1)
    cmp = compare(inst, ["vllm", "sarathi"], solver=None, deadline=Deadline.after(0.01))
    errors = cmp.table.loc[["vllm", "sarathi"], "error"].tolist()
    assert errors[0] == compare_mod.CUT and errors[1] in (compare_mod.CUT, compare_mod.NOT_RUN)
    assert "vllm" not in cmp.schedules


def test_a_policy_cut_for_time_starts_the_solve_finished_against_reserved_peaks(monkeypatch, spy):
    # compare --time-limit 10 on 10k requests under the A100 fit: the policies' share cut sarathi, and the
    # solve then ran it again, uncut, as its first schedule (12.5 s). The cut run, finished by the core,
    # is the solve's start instead (not a row of the policy's: that says it did not finish).
    import kvsched.heuristics.simulator as simulator
    from kvsched.heuristics import SimResult
    from kvsched.instances.generators import generate

    monkeypatch.setattr(simulator, "DEADLINE_EVERY", 1)
    calls = spy(compare_mod, "solve")
    inst = generate("synthetic", n=300, seed=1)
    cmp = compare(inst, ["vllm", "sarathi"], options=FAST, deadline=Deadline.after(0.02))
    assert cmp.table.loc["vllm", "error"] == compare_mod.CUT and "vllm" not in cmp.schedules
    (start,) = [call["warm_start"] for call in calls]
    assert isinstance(start, SimResult) and start.cut > 0 and replay(inst, start.schedule).ok
    latency = start.trace.state.completion.sum() - sum(r.arrival for r in inst.requests)
    assert cmp.result is not None and cmp.result.objective <= latency + 1e-6
    assert replay(inst, cmp.result.schedule).ok


def test_the_makespan_regret_percent_counts_from_the_origin():
    import pandas as pd

    table = pd.DataFrame({"objective": [50_010.0, 50_009.0]}, index=["orca", "optimum"])
    compare_mod.add_regret(table, 50_009.0, 50_009.0, None, origin=50_000.0)
    assert table[REGRET_PCT].tolist() == pytest.approx([100 / 9, 0.0])
    with pytest.raises(InputError, match="origin"):
        compare_mod.add_regret(table, 1.0, 1.0, None, origin="0")


def test_without_a_deadline_every_policy_runs():
    inst = load_instance(EXAMPLES / "figure15.json")
    cmp = compare(inst, ["vllm", "sarathi"], solver=None)
    assert cmp.table["error"].isna().all()


def test_cli_compare_prints_the_scope_and_what_each_regret_is_against(capsys):
    args = ["compare", str(EXAMPLES / "figure15.json"), "--policies", "vllm,vllm-ef", "--time-limit", "10"]
    assert main([*args, "--threads", "1", "--formulation", "time"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for text in ("scope", "contiguous", "regret vs solver", "max regret vs all schedules", "(certified)"):
        assert text in out, text
    assert "the proven optimum over that scope" in out


def test_cli_compare_lists_the_policies_a_spent_limit_left_unrun_on_one_line(capsys):
    args = [
        "compare",
        str(EXAMPLES / "figure15.json"),
        "--policies",
        "vllm,sarathi,mcsf",
        "--time-limit",
        "1e-6",
    ]
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "3 of 3 policies not run: the time limit ran out before them (vllm, sarathi, mcsf)" in out
    assert "could not run" not in out


def test_cli_compare_hands_the_solve_one_deadline_from_the_command_start(spy):
    import kvsched.analysis as analysis

    calls = spy(analysis, "compare")
    # A short limit: the test is about the deadline handed on, and the solve runs to it.
    args = ["compare", str(EXAMPLES / "tiny.json"), "--policies", "sarathi", "--time-limit", "2"]
    assert main([*args, "--threads", "1"]) == 0
    (deadline,) = [call["deadline"] for call in calls]
    assert deadline.limit == 2 and deadline.end - time.monotonic() < 2


def test_nothing_to_compare_and_a_deadline_that_is_not_one_are_one_error_each():
    inst = load_instance(EXAMPLES / "figure15.json")
    with pytest.raises(InputError, match="nothing to compare"):
        compare(inst, [], solver=None)
    with pytest.raises(InputError, match="deadline: expected a kvsched Deadline"):
        compare(inst, ["vllm"], solver=None, deadline=2.0)
