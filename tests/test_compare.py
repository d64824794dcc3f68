"""Regret reports: policies and the exact optimum on the same instance and cost model."""

import math

import pytest

from kvsched.analysis import compare
from kvsched.csp import SolverOptions, SolveStatus
from kvsched.instances.io import load_instance
from kvsched.schedule.validate import replay
from tests.test_examples import EXAMPLES

FAST = SolverOptions(time_limit=20, threads=1)


def test_regret_on_figure15_shows_evictions_beat_the_no_eviction_class():
    inst = load_instance(EXAMPLES / "figure15.json")
    cmp = compare(inst, ["vllm", "vllm-ef"], options=FAST)
    t = cmp.table
    assert cmp.result.status == SolveStatus.OPTIMAL
    # Without evictions the best is 4 requests one after another: 4 + 8 + 12 + 16 = 40 slots.
    assert cmp.result.objective == 40
    assert t.loc["vllm-ef", "objective"] == 40 and t.loc["vllm-ef", "regret"] == 0
    # vLLM evicts (seed 003 Fig. 15) and beats that class optimum: negative regret.
    assert t.loc["vllm", "objective"] == 36 and t.loc["vllm", "regret"] == -4
    assert t.loc["vllm", "evictions"] == 2
    # The certified column is against bounds valid for every schedule.
    assert cmp.lower_bound is not None and cmp.lower_bound <= 36
    assert t.loc["vllm", "certified_max_regret"] == 36 - cmp.lower_bound
    for schedule in cmp.schedules.values():
        assert replay(inst, schedule).ok


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
    cmp = compare(inst, ["sarathi"], objective=objective, options=FAST)
    assert cmp.result.objective_name == objective
    assert cmp.table.loc["sarathi", "objective"] >= cmp.lower_bound
