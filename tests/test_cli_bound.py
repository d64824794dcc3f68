"""``kvsched bound``: combinatorial and fluid bounds, checked against what the policies achieve."""

import json

import pytest

from kvsched.cli import main
from kvsched.csp.bounds import lower_bounds
from kvsched.heuristics import POLICIES, make_policy, simulate
from kvsched.instances.io import load_instance
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
