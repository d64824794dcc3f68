"""Token statistics read per interval of consecutive entries equal the per-token path, either way found.

:func:`kvsched.schedule.tokens._fast_stats` reads a request's tokens and largest
gap per *interval* (a stretch of consecutive entries it takes part in) and the
ITL's weights per interval boundary; the intervals come from one pass over the
entries in order (many requests per entry) or from the participations sorted
by request (a few). Here both ways must give, to the bit, the statistics of the
per-token path (one element per token, sorted by time) on traces with runs,
evictions, waits between a request's batches and incomplete requests, and the
helpers must equal their plain definitions.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvsched.heuristics import make_policy, simulate
from kvsched.schedule import tokens
from kvsched.schedule.ir import Schedule
from kvsched.schedule.tokens import BatchClock, _legacy_stats
from kvsched.schedule.validate import replay
from tests.test_runs import INSTANCES

POLICIES = ("sarathi", "sarathi-ef", "rank-i", "infermax-sec6")


def _traces():
    out = {}
    for name, inst in sorted(INSTANCES.items()):
        for policy in POLICIES:
            out[f"{name}/{policy}"] = simulate(inst, make_policy(policy)).trace
    # A schedule cut short and replayed leniently: incomplete requests count in the largest TBT only.
    inst = INSTANCES["tight-unit"]
    schedule = simulate(inst, make_policy("sarathi")).schedule
    out["cut"] = replay(inst, Schedule(schedule.entries[: len(schedule.entries) * 2 // 3]), strict=False)
    return out


TRACES = _traces()


@pytest.mark.parametrize("name", sorted(TRACES))
@pytest.mark.parametrize("way", ["in-order", "sorted", "sorted-chunks"])
def test_fast_stats_equal_the_per_token_path(name, way, monkeypatch):
    trace = TRACES[name]
    clock = BatchClock.of(trace)
    assert clock.chronological()
    monkeypatch.setattr(tokens, "PASS_FROM", 0 if way == "in-order" else 10**9)
    if way == "sorted-chunks":
        monkeypatch.setattr(tokens, "CHUNK_GAPS", 5)
    got, want = tokens._fast_stats(trace, clock), _legacy_stats(trace)
    for field in ("generated", "tbt_max", "itl_values", "itl_counts"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)
        assert getattr(got, field).dtype == getattr(want, field).dtype, field


def test_the_cases_have_far_gaps_and_incomplete_requests():
    # What the equality above is worth: requests that leave and come back, and some never done.
    far = 0
    for trace in TRACES.values():
        _, _, _, came_from = tokens._intervals(BatchClock.of(trace).columns, len(trace.instance.requests))
        far += int((came_from >= 0).sum())
    assert far > 0
    assert not TRACES["cut"].state.done.all()


@pytest.mark.parametrize("name", sorted(TRACES))
def test_both_ways_find_the_same_intervals(name):
    trace = TRACES[name]
    cols, n = BatchClock.of(trace).columns, len(trace.instance.requests)
    a = tokens._intervals_in_order(cols, n)
    pos, ent = tokens._pairs(cols)  # participations by request, then entry
    # The plain definition: a new interval wherever the request changes or skips an entry.
    head = np.ones(pos.size, dtype=bool)
    head[1:] = (pos[1:] != pos[:-1]) | (ent[1:] != ent[:-1] + 1)
    at = np.flatnonzero(head)
    same_request = np.zeros(pos.size, dtype=bool)  # the participation before is the same request's
    same_request[1:] = pos[1:] == pos[:-1]
    came_from = np.where(same_request[at], ent[at - 1], -2)
    want = (pos[at], ent[at], ent[np.append(at[1:], pos.size) - 1], came_from)
    for got in (a, tokens._intervals(cols, n)):
        for x, y in zip(got, want, strict=True):
            np.testing.assert_array_equal(x, y)


def test_previous_is_each_request_s_entry_before():
    rng = np.random.default_rng(4)
    n = 30
    parts = [np.sort(rng.choice(n, rng.integers(0, 12), replace=False)) for _ in range(60)]
    prev, last = tokens._previous(parts, n)
    seen: dict[int, int] = {}
    want = []
    for entry, part in enumerate(parts):
        for p in part.tolist():
            want.append(seen.get(p, -2))
            seen[p] = entry
    np.testing.assert_array_equal(prev, want)
    np.testing.assert_array_equal(last, [seen.get(p, -2) for p in range(n)])


def test_range_max_is_the_slices_max():
    rng = np.random.default_rng(5)
    values = rng.normal(size=300)
    values[::7] = -np.inf
    lo = rng.integers(0, 300, size=2000)
    hi = np.minimum(lo + rng.integers(0, 300, size=2000), 300)
    got = tokens._range_max(values, lo, hi)
    want = [values[a:b].max() if b > a else -np.inf for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]
    np.testing.assert_array_equal(got, want)
    assert tokens._range_max(values, np.array([3]), np.array([3])).tolist() == [-np.inf]


@pytest.mark.parametrize("name", sorted(TRACES))
def test_entry_parts_are_the_positions_in_entry_order(name):
    cols = BatchClock.of(TRACES[name]).columns
    parts, sizes = cols.entry_parts()
    order = np.argsort(cols.entries(), kind="stable")
    np.testing.assert_array_equal(np.concatenate(parts), cols.positions()[order])
    np.testing.assert_array_equal(sizes, np.fromiter(map(len, parts), dtype=np.int64, count=len(parts)))
