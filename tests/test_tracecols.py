"""A trace's per-entry columns (:mod:`kvsched.schedule.tracecols`) are its records' fields.

:func:`~kvsched.schedule.tracecols.read_trace` reads every record once with
C-level getters, takes a run's batch count from the records' indices and joins
arrays by their bytes; here each column must equal what the records say read
the plain way, whatever the trace (runs, mixed runs, paged KV, evictions), and
the fallbacks (indices that do not follow each other, arrays of another dtype)
must give the same columns.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvsched.heuristics import make_policy, simulate
from kvsched.schedule import tokens, tracecols
from kvsched.schedule.ir import Schedule
from kvsched.schedule.records import RunRecord
from kvsched.schedule.tokens import BatchClock, _legacy_stats, token_stats
from kvsched.schedule.tracecols import read_trace
from kvsched.schedule.validate import replay
from tests.test_runs import INSTANCES


@pytest.fixture(scope="module", params=sorted(INSTANCES))
def trace(request):
    return simulate(INSTANCES[request.param], make_policy("sarathi")).trace


def _expected(entries):
    """The columns read record by record (the plain way)."""
    recs = [x for x in entries if type(x) is not RunRecord]
    runs = [x for x in entries if type(x) is RunRecord]
    return {
        "is_run": np.array([type(x) is RunRecord for x in entries], dtype=bool),
        "starts": np.array([x.start for x in entries], dtype=np.float64),
        "lengths": np.array([x.repeat if type(x) is RunRecord else 1 for x in entries], dtype=np.int64),
        "rec_ends": np.array([r.end for r in recs], dtype=np.float64),
        "rec_blocks": np.array([r.kv_blocks for r in recs], dtype=np.int64),
        "rec_items": np.array([r.num_items for r in recs], dtype=np.int64),
        "rec_tokens": np.array([r.num_tokens for r in recs], dtype=np.int64),
        "rec_evicted": np.array([r.num_evicted for r in recs], dtype=np.int64),
        "rec_sizes": np.array([r.generated.size for r in recs], dtype=np.int64),
        "run_decodes": np.array([r.requests.size for r in runs], dtype=np.int64),
        "run_blocks": np.array([r.kv_blocks for r in runs], dtype=np.int64),
        "run_chunk": np.array([r.chunk_tokens for r in runs], dtype=np.int64),
        "durations": np.concatenate([r.run.durations for r in runs]) if runs else np.zeros(0),
        "positions": np.concatenate([r.generated for r in recs] + [r.requests for r in runs]),
    }


def _assert_columns(entries) -> None:
    cols, durations = read_trace(entries)
    want = _expected(entries)
    for name, value in want.items():
        if name == "durations":
            got = durations
        elif name == "positions":
            got = cols.positions()
        else:
            got = getattr(cols, name)
        np.testing.assert_array_equal(got, value, err_msg=name)
        assert got.dtype == value.dtype, name
    runs = [x for x in entries if type(x) is RunRecord]
    assert cols.runs == runs
    assert cols.run_unit_blocks == all(r.block_size == 1 for r in runs)
    np.testing.assert_array_equal(cols.rec_at, np.flatnonzero(~want["is_run"]))
    np.testing.assert_array_equal(cols.run_at, np.flatnonzero(want["is_run"]))
    owner = np.concatenate(
        [np.repeat(cols.rec_at, want["rec_sizes"]), np.repeat(cols.run_at, want["run_decodes"])]
    )
    np.testing.assert_array_equal(cols.entries(), owner)


def test_columns_are_the_records_fields(trace):
    assert any(type(x) is RunRecord for x in trace.entries)
    _assert_columns(trace.entries)


def test_indices_that_do_not_follow_each_other_count_the_durations(trace, monkeypatch):
    # A run's batch count comes from the next entry's index; with indices shifted (no core
    # applied them so) the durations are counted instead: the same columns.
    entries = [replace(x, index=3 * k) for k, x in enumerate(trace.entries)]
    _assert_columns(entries)
    seen = []
    real = tracecols._lengths
    monkeypatch.setattr(tracecols, "_lengths", lambda *a: seen.append(real(*a)) or seen[-1])
    cols, _ = read_trace(entries)
    assert not np.array_equal(seen[0], cols.lengths)  # the indices' lengths were wrong, and not taken


def test_arrays_of_another_dtype_or_large_are_concatenated():
    parts = [np.array([1, 2], dtype=np.int64), np.array([3], dtype=np.int32), np.zeros(0, dtype=np.int64)]
    joined = tracecols._joined(parts, np.int64, 3)
    np.testing.assert_array_equal(joined, [1, 2, 3])
    assert joined.dtype == np.int64 and joined.flags.writeable
    strided = [np.arange(10, dtype=np.int64)[::3], np.arange(4, dtype=np.int64)]
    for total in (8, 1000):  # joined by bytes, then by numpy (large arrays)
        joined = tracecols._joined(strided, np.int64, total)
        np.testing.assert_array_equal(joined, np.concatenate(strided))
        assert joined.flags.writeable
    assert tracecols._joined([], np.float64, 0).size == 0


def test_an_empty_trace():
    cols, durations = read_trace([])
    assert cols.num_entries == 0 and durations.size == 0 and cols.positions().size == 0
    assert cols.entries().size == 0 and cols.runs == []


def test_incomplete_requests_count_only_in_the_itl(monkeypatch):
    # A schedule cut short and replayed leniently leaves requests incomplete: their gaps count
    # in their largest TBT but not in the pooled ITL, as on the per-token path.
    inst = INSTANCES["tight-unit"]
    schedule = simulate(inst, make_policy("sarathi")).schedule
    cut = Schedule(schedule.entries[: len(schedule.entries) * 2 // 3])
    trace = replay(inst, cut, strict=False)
    assert not trace.state.done.all() and trace.state.done.any()
    clock = BatchClock.of(trace)
    assert clock.chronological()
    reference = _legacy_stats(trace)
    for chunk in (None, 5):
        if chunk:
            monkeypatch.setattr(tokens, "CHUNK_GAPS", chunk)
        stats = tokens._fast_stats(trace, clock)
        for field in ("generated", "tbt_max", "itl_values", "itl_counts"):
            np.testing.assert_array_equal(getattr(stats, field), getattr(reference, field), err_msg=field)
    assert token_stats(trace).itl_counts.sum() < sum(r.output - 1 for r in inst.requests)
