"""Exact window re-solves (kvsched.csp.incumbents.window): every result replayed, never worse, improvements found."""

import numpy as np
import pytest

from kvsched.csp.incumbents import Incumbent, greedy
from kvsched.csp.incumbents import window as window_module
from kvsched.csp.incumbents.window import OpPlan, plan_of, plan_schedule, plan_usage, window_search
from kvsched.csp.objectives import OBJECTIVES
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.data import ProblemData
from kvsched.schedule.validate import replay
from kvsched.stop import Deadline


def _inst(reqs, m, *, block=1, c=None, time_model="unit"):
    requests = tuple(Request(f"r{k}", float(a), i, o) for k, (i, o, a) in enumerate(reqs))
    return Instance(requests, Limits(m, block, c, c, None), TimeModel(time_model))


def _incumbent(inst: Instance, ops: list[list[int]], slots: int) -> Incumbent:
    """A hand-made schedule from its ops (replayed strictly: it must be legal)."""
    plan = OpPlan(np.arange(slots, dtype=np.float64), tuple(np.array(o, dtype=np.int64) for o in ops))
    schedule = plan_schedule(inst, plan, 1.0)
    trace = replay(inst, schedule)
    return Incumbent("hand", schedule, OBJECTIVES["total-latency"](trace), "total-latency", {}, trace)


def _random(seed: int, n: int, block: int = 1) -> Instance:
    rng = np.random.default_rng(seed)
    reqs = [
        (int(rng.integers(1, 20)), int(rng.integers(1, 12)), float(rng.integers(0, 15))) for _ in range(n)
    ]
    peak = max(i + o - 1 for i, o, _ in reqs)
    m = -(-int(rng.integers(peak, 2 * peak)) // block) * block
    return _inst(reqs, m, block=block)


def test_a_reordering_is_found():
    # A (I=5, O=5) and B (I=5, O=1) cannot share a batch (M = 9): B first saves 4 slots of latency.
    inst = _inst([(5, 5, 0), (5, 1, 0)], 9)
    bad = _incumbent(inst, [[0, 1, 2, 3, 4], [5]], 6)
    assert bad.value == 5 + 6
    got = window_search(inst, bad, Deadline.after(5), window=10, solve_s=2.0)
    assert got.value == 1 + 6
    assert OBJECTIVES["total-latency"](replay(inst, got.schedule)) == got.value
    assert got.stats["window_accepted"] >= 1 and got.stats["window_mismatches"] == 0


def test_later_ops_are_pulled_into_the_window():
    # B (I=1, O=1) waits after the window [0, 10) while A decodes; it fits beside A until A's last op.
    inst = _inst([(1, 10, 0), (1, 1, 0), (1, 3, 0)], 10)
    bad = _incumbent(inst, [list(range(10)), [12], [10, 11, 12]], 13)
    got = window_search(inst, bad, Deadline.after(5), window=10, solve_s=2.0)
    assert got.value < bad.value
    trace = replay(inst, got.schedule)
    assert OBJECTIVES["total-latency"](trace) == got.value
    # B and C's ops moved up into A's batches: everything is done by slot 10.
    assert np.nanmax(trace.state.completion) <= 10


@pytest.mark.parametrize(("seed", "block"), [(0, 1), (2, 4)])
def test_never_worse_and_always_legal(seed, block):
    inst = _random(seed, 12, block)
    start = greedy(inst, "fcfs", preempt=True)
    got = window_search(inst, start, Deadline.after(1.0), window=8, solve_s=0.2, seed=seed)
    assert got.value <= start.value
    assert OBJECTIVES["total-latency"](replay(inst, got.schedule)) == got.value  # strict replay: legal
    assert got.stats["window_mismatches"] == 0


def test_plan_round_trip_keeps_the_value_and_fits_memory():
    inst = _random(5, 15)
    start = greedy(inst, "remaining-area", preempt=True)
    plan = plan_of(inst, start.trace if start.trace is not None else replay(inst, start.schedule))
    assert [s.size for s in plan.ops] == [r.output for r in inst.requests]
    assert plan_usage(ProblemData.of(inst), plan).max() <= inst.limits.kv_capacity
    again = replay(inst, plan_schedule(inst, plan, 1.0))
    assert OBJECTIVES["total-latency"](again) == start.value


def test_other_settings_return_the_incumbent():
    inst = _inst([(5, 5, 0), (5, 1, 0)], 9, c=16)  # a token budget: refills cost tokens
    start = greedy(inst, "fcfs", preempt=True)
    got = window_search(inst, start, Deadline.after(1))
    assert got.schedule is start.schedule and "not run" in got.stats["window"]


def test_part_of_the_later_ops_pulled_in_holds_more_after_the_window():
    # B (I=1, O=4) runs at slots 10..13; a window [0, 3) beside A takes 3 of its ops, so its one op left
    # (slot 10) holds 4 tokens instead of 1 and it completes at 11 instead of 14.
    inst = _inst([(1, 10, 0), (1, 4, 0)], 10)
    bad = _incumbent(inst, [list(range(10)), [10, 11, 12, 13]], 14)
    data = ProblemData.of(inst)
    plan = plan_of(inst, bad.trace)
    members = window_module._members(
        data, plan, 0, 3, 1.0, np.random.default_rng(0), max_ops=50, max_members=8, max_extra=8
    )
    out = window_module._solve_window(data, plan, plan_usage(data, plan), 0, 3, members, 1.0, 2.0, 0)
    assert out.gain == 3 and out.ops is not None
    assert out.ops[1].tolist() == [0, 1, 2, 10]
    trial = OpPlan(plan.starts, tuple(out.ops.get(r, s) for r, s in enumerate(plan.ops)))
    trace = replay(inst, plan_schedule(inst, trial, 1.0))
    assert OBJECTIVES["total-latency"](trace) == bad.value - 3
