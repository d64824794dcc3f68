"""The brute force itself (tests/brute.py): the candidates it skips without building are ones the core rejects."""

from collections import Counter

import pytest

from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.core import Rule
from tests.brute import _brute_force
from tests.strategies import budget_trio


def _instance(reqs, **limits):
    requests = tuple(Request(f"r{k}", float(a), i, o) for k, (a, i, o) in enumerate(reqs))
    return Instance(requests, Limits(**limits), TimeModel("unit"))


TRIO = budget_trio(TimeModel("unit"))
RUNNING = _instance([(0, 3, 1), (0, 3, 1), (1, 2, 2)], kv_capacity=6, block_size=2, max_running=2)
BLOCKS = _instance(
    [(0, 2, 2), (0, 3, 1), (1, 1, 2)], kv_capacity=6, block_size=3, max_batch_tokens=4, max_running=2
)


@pytest.mark.parametrize(
    ("instance", "objective", "evict", "optimum", "rules"),
    [
        # The optima are those of the search that built and checked every candidate (before 2026-11-27).
        (TRIO, "total-latency", True, 9.0, {Rule.TOKEN_BUDGET, Rule.PREFILL_BUDGET, Rule.KV_CAPACITY}),
        (TRIO, "makespan", False, 5.0, {Rule.TOKEN_BUDGET, Rule.PREFILL_BUDGET, Rule.KV_CAPACITY}),
        (RUNNING, "sum-ttft", True, 4.0, {Rule.MAX_RUNNING, Rule.KV_CAPACITY}),
        (BLOCKS, "total-latency", True, 6.0, {Rule.TOKEN_BUDGET, Rule.MAX_RUNNING, Rule.KV_CAPACITY}),
    ],
)
def test_every_skipped_candidate_is_rejected_by_the_core(instance, objective, evict, optimum, rules):
    # Each budget the search skips on (C, P, max_running, M in blocks of 2 and 3) is met here; every skipped
    # candidate is built and checked (an accepted one fails inside the search), and the optimum is the same.
    broken = Counter()
    assert _brute_force(instance, objective, evict, verify_skips=broken) == optimum
    assert set(broken) == rules
