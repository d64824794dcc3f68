"""The greedy's fill pass: legal schedules, the same decisions in both kernels, more of the KV used."""

import numpy as np
import pytest

from kvsched.csp.incumbents import decide, greedy
from kvsched.csp.incumbents.best import FREE_EVICTION_VARIANTS
from kvsched.csp.incumbents.lns import improve
from kvsched.stop import Deadline
from tests.incumbent_instances import budget_instance, make_instance, objective_value, random_instance


def _kv_used(log) -> np.ndarray:
    """KV each batch holds once its items ran (context plus tokens, summed over its items)."""
    return np.add.reduceat(log.context + log.tokens, log.item_ptr[:-1])


@pytest.mark.parametrize("seed", range(8))
def test_fill_runs_the_same_in_both_kernels_and_replays(seed):
    """Arrivals, blocks, budgets C/P, max_running, unit or linear time: every schedule is replayed by the core."""
    rng = np.random.default_rng(300 + seed)
    inst = random_instance(rng, int(rng.integers(2, 40)))
    for rule in ("remaining-area", "remaining-output", "fcfs"):
        for preempt in (True, False):
            fast = greedy(inst, rule, preempt=preempt, fill=True)  # replayed strictly inside
            slow = greedy(inst, rule, preempt=preempt, fill=True, jit=False)
            assert fast.schedule.same_as(slow.schedule)
            assert fast.value == slow.value == objective_value(inst, fast)


@pytest.mark.parametrize("seed", range(4))
def test_fill_with_budget_options_runs_the_same_in_both_kernels(seed):
    rng = np.random.default_rng(400 + seed)
    inst = budget_instance(rng, int(rng.integers(5, 40)), "unit" if seed % 2 else "infermax-linear")
    for kw in ({}, {"refill_weight": 64.0, "min_chunk": 5, "fit_chunk": True}, {"lookahead": 4}):
        fast = greedy(inst, "remaining-area", fill=True, **kw)
        slow = greedy(inst, "remaining-area", fill=True, jit=False, **kw)
        assert fast.schedule.same_as(slow.schedule)
        assert fast.value == slow.value == objective_value(inst, fast)


def test_fill_swaps_in_a_larger_request_closer_to_completion():
    # M = 10, FCFS. The walk runs r0 (5) and r1 (3); r2 (4 tokens, one output) does not fit the 2 left.
    # Swapping r1 (5 tokens to go) for r2 (1 to go) uses 9 of the 10 tokens instead of 8.
    inst = make_instance([(5, 3, 0), (3, 5, 0), (4, 1, 0)], 10)
    for jit in (True, False):
        plain, filled = decide(inst, "fcfs", jit=jit), decide(inst, "fcfs", fill=True, jit=jit)
        assert _kv_used(plain)[0] == 8 and _kv_used(filled)[0] == 9
        assert sorted(filled.requests[: filled.item_ptr[1]].tolist()) == [0, 2]
    assert greedy(inst, "fcfs", fill=True).value < greedy(inst, "fcfs").value


def test_fill_swaps_one_run_item_for_two():
    # M = 10, FCFS. The walk runs r0 (4) and r1 (5); r2 and r3 (3 each, one output) do not fit the 1 left.
    # r1 out, both in: three items and the whole KV, since 1/1 + 1/1 > 1/4.
    inst = make_instance([(4, 5, 0), (5, 4, 0), (3, 1, 0), (3, 1, 0)], 10)
    for jit in (True, False):
        plain, filled = decide(inst, "fcfs", jit=jit), decide(inst, "fcfs", fill=True, jit=jit)
        assert _kv_used(plain)[0] == 9 and _kv_used(filled)[0] == 10
        assert sorted(filled.requests[: filled.item_ptr[1]].tolist()) == [0, 2, 3]
    assert greedy(inst, "fcfs", fill=True).value < greedy(inst, "fcfs").value


def test_fill_does_not_swap_for_a_request_further_from_completion():
    # As above, but r2 and r3 have more tokens to go than r1 (1/6 + 1/6 < 1/2): the walk's batch stands.
    inst = make_instance([(4, 5, 0), (5, 2, 0), (3, 6, 0), (3, 6, 0)], 10)
    assert decide(inst, "fcfs", fill=True).requests.tolist()[:2] == decide(inst, "fcfs").requests.tolist()[:2]


def test_fill_replaces_no_holder_where_eviction_costs():
    # M = 12, FCFS. r0 and r1 hold 4 and 5 after batch 0; at 1 their decodes take 11 and r2, r3 (3 each,
    # one output) arrive. Where eviction is free, r1 is evicted for both; with a token budget only an
    # admission may be replaced, and there is none: the holders run as without the pass.
    reqs = [(4, 5, 0), (5, 4, 0), (3, 1, 1), (3, 1, 1)]

    def batch1(log):
        items = log.requests[log.item_ptr[1] : log.item_ptr[2]]
        return sorted(items.tolist()), log.evicted[log.ev_ptr[1] : log.ev_ptr[2]].tolist()

    free = make_instance(reqs, 12)
    assert batch1(decide(free, "fcfs")) == ([0, 1], [])
    assert batch1(decide(free, "fcfs", fill=True)) == ([0, 2, 3], [1])
    budget = make_instance(reqs, 12, c=20, p=20)
    assert batch1(decide(budget, "fcfs")) == batch1(decide(budget, "fcfs", fill=True)) == ([0, 1], [])


def test_free_eviction_variants_fill_and_lns_keeps_it():
    # Every free-eviction variant fills but one (remaining-output without filling, for Azure code 10k).
    assert [v.rule for v in FREE_EVICTION_VARIANTS if not v.fill] == ["remaining-output"]
    inst = make_instance([(4, 10, 0), (5, 10, 0), (3, 1, 0), (3, 1, 0), (6, 3, 2), (2, 8, 3)], 14)
    start = greedy(inst, "remaining-area", fill=True)
    assert start.schedule.meta["params"]["fill"] is True
    better = improve(inst, start, Deadline.after(1.0), window=3)
    assert better.value <= start.value == objective_value(inst, start)
