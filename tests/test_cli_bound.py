"""``kvsched bound``: combinatorial and fluid bounds, checked against what the policies achieve."""

import dataclasses
import json

import pytest

from kvsched.cli import main
from kvsched.csp.bounds import lower_bounds
from kvsched.csp.objectives import OBJECTIVES
from kvsched.heuristics import POLICIES, make_policy, simulate
from kvsched.instances.io import load_instance
from kvsched.instances.model import TimeModel
from kvsched.schedule.metrics import run_metrics
from kvsched.schedule.validate import replay
from tests.test_examples import EXAMPLES

FIG15 = str(EXAMPLES / "figure15.json")


def test_combinatorial_bounds_are_the_library_ones(tmp_path):
    out = tmp_path / "b.json"
    assert main(["bound", "combinatorial", FIG15, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())["combinatorial"]
    lb = lower_bounds(load_instance(FIG15))
    assert doc["total-latency (lower)"] == lb.total_latency == 30
    assert doc["makespan (lower)"] == lb.makespan


def test_fluid_bound_holds_for_every_policy(tmp_path):
    out = tmp_path / "b.json"
    assert main(["bound", "fluid", FIG15, "--json", str(out)]) == 0
    fluid = json.loads(out.read_text())["fluid"]
    bound = fluid["throughput (tokens per time unit, upper)"]
    inst = load_instance(FIG15)
    tokens = sum(r.output for r in inst.requests)
    for name in POLICIES:
        trace = replay(inst, simulate(inst, make_policy(name)).schedule)
        makespan = run_metrics(trace).makespan
        assert tokens / makespan <= bound + 1e-9, name
    assert fluid["binding"] == "memory"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--d0", "1"], "--d0/--d1: give both"),
        (["--cost-model", "infermax-linear"], "is not seed 002's Eq. (1)"),
    ],
)
def test_bad_fluid_input_is_one_line(capsys, extra, message):
    assert main(["bound", "fluid", FIG15, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("cost", [[], ["--cost-model", "infermax-linear"]])
def test_portfolio_bounds_hold_for_every_policy(tmp_path, cost):
    out = tmp_path / "b.json"
    tiny = str(EXAMPLES / "tiny.json")
    assert main(["bound", "portfolio", tiny, *cost, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    inst = load_instance(tiny)
    if cost:
        inst = dataclasses.replace(inst, time_model=TimeModel(name=cost[1], params={}))
    for name in ("sarathi", "sarathi-ef", "mcsf", "rank-o"):
        trace = replay(inst, simulate(inst, make_policy(name)).schedule)
        for objective, key in (("total-latency", "total_latency"), ("makespan", "makespan")):
            best = doc[f"lower_bound_{key}"]
            assert best == doc["portfolio"][f"{objective} (lower, best)"] > 0
            assert best <= OBJECTIVES[objective](trace) + 1e-9, (name, objective)


def test_all_on_a_seconds_model_says_which_kinds_do_not_apply(capsys):
    assert main(["bound", "all", str(EXAMPLES / "tiny.json"), "--cost-model", "infermax-linear"]) == 0
    out = capsys.readouterr().out
    assert "portfolio bounds" in out and "not computed: combinatorial" in out and "not computed: fluid" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["all", "--d0", "-1", "--d1", "1"], "--d0: -1 must be a positive"),
        (["fluid", "--d0", "1", "--d1", "nan"], "--d1: nan must be a finite number >= 0"),
        (["all", "--d1", "1"], "--d0/--d1: give both"),
        (["portfolio", "--saturated"], "--saturated: applies to the fluid bound"),
    ],
)
def test_bad_fluid_flags_are_an_error_even_under_all(capsys, args, message):
    # ``all`` once listed a bad --d0 as "not computed" and exited 0.
    assert main(["bound", args[0], FIG15, *args[1:]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_bound_says_when_the_time_limit_cut_the_portfolio(capsys):
    # The portfolio skips the stages it has no time to start: the printout says so instead of looking whole.
    assert main(["bound", "all", FIG15, "--time-limit", "0.001"]) == 0
    out = capsys.readouterr().out
    assert "not computed: portfolio: the stages not started before --time-limit ran out" in out
    assert main(["bound", "all", FIG15]) == 0
    assert "not computed: portfolio" not in capsys.readouterr().out
