"""Combinatorial lower bounds hold for every legal schedule, chunked and evicting ones included."""

import pytest
from hypothesis import given, settings

from kvsched.csp import SolverOptions, solve
from kvsched.csp.bounds import lower_bounds
from kvsched.csp.objectives import OBJECTIVES
from kvsched.errors import InputError
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.conventions import mcsf_instance
from kvsched.schedule.validate import replay
from tests.strategies import instances, legal_schedules


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(legal_schedules(instances(cost="unit")))
def test_bounds_hold_for_random_legal_schedules(built):
    bounds = lower_bounds(built.instance)
    trace = replay(built.instance, built.schedule)
    for name, measure in OBJECTIVES.items():
        assert bounds.for_objective(name) <= measure(trace) + 1e-9, name


def test_bounds_by_hand():
    # Two requests at 0: (I=4, O=3) and (I=2, O=2), M = 8, C = 4 (so the 4-token prompt fits one batch).
    inst = Instance(
        (Request("a", 0, 4, 3), Request("b", 0, 2, 2)),
        Limits(kv_capacity=8, max_batch_tokens=4),
        TimeModel("unit"),
    )
    b = lower_bounds(inst)
    # alone: a needs 1 + 2 = 3 batches, b needs 1 + 1 = 2: isolated total 5.
    assert b.isolated == 5
    # areas: a = 4 + 5 + 6 = 15, b = 2 + 3 = 5; by area: ceil(5/8) = 1, ceil(20/8) = 3 -> sorted max(2,1)+max(3,3) = 5.
    assert b.total_latency == 5
    assert b.makespan_area == 3 and b.makespan_tokens == 3 and b.makespan == 3  # 9 tokens, C = 4
    assert b.sum_ttft == 2


def test_bounds_below_the_optimum_and_tight_when_memory_binds():
    inst = mcsf_instance(1, [1, 1, 2, 3], 4)
    b = lower_bounds(inst)
    opt = solve(inst, options=SolverOptions(time_limit=10, threads=1)).objective
    assert b.total_latency <= opt == 16


def test_chunk_budget_counts_in_the_isolated_bound():
    inst = Instance(
        (Request("a", 1, 10, 2),), Limits(kv_capacity=16, max_prefill_tokens=4), TimeModel("unit")
    )
    assert lower_bounds(inst).isolated == 3 + 1  # ceil(10/4) prefill batches + 1 decode


def test_bounds_need_unit_time():
    inst = Instance((Request("a", 0, 2, 2),), Limits(kv_capacity=8), TimeModel("infermax-linear"))
    with pytest.raises(InputError, match="unit time model"):
        lower_bounds(inst)
