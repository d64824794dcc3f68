"""Metrics read off coalesced runs equal those of the same schedule stepped batch by batch.

:mod:`kvsched.schedule.tokens` computes the token gaps of a run of ``k`` decode
batches in closed form (internal gaps once per run, a boundary gap per request
and run) and the per-batch columns of :func:`run_metrics` without spelling the
runs out. Here every metric of a coalesced simulation must equal, to the bit,
the metric of the same simulation without coalescing, and both must equal the
per-token reference path (one array element per token, sorted by time).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvsched.heuristics import make_policy, simulate
from kvsched.schedule import tokens
from kvsched.schedule.ir import Batch, Schedule
from kvsched.schedule.metrics import batch_metrics, request_columns, request_metrics, run_metrics
from kvsched.schedule.records import RunRecord
from kvsched.schedule.serving import SLO, Distribution, serving_metrics
from kvsched.schedule.tokens import BatchClock, _legacy_stats, tbt_quantiles, token_stats
from kvsched.schedule.validate import replay
from tests.test_runs import INSTANCES


def _same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def _assert_same_dict(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert _same(a[key], b[key]), (key, a[key], b[key])


def _assert_same_stats(a: tokens.TokenStats, b: tokens.TokenStats) -> None:
    for field in ("generated", "tbt_max", "itl_values", "itl_counts"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


def _assert_same_quantiles(a: tuple, b: tuple) -> None:
    for name, x, y in zip(("tbt_p50", "tbt_p99"), a, b, strict=True):
        np.testing.assert_array_equal(x, y, err_msg=name)


@pytest.fixture(scope="module", params=sorted(INSTANCES))
def pair(request):
    inst = INSTANCES[request.param]
    plain = simulate(inst, make_policy("sarathi"), coalesce=False)
    fast = simulate(inst, make_policy("sarathi"))
    assert any(type(e) is RunRecord for e in fast.trace.entries)
    assert not any(type(e) is RunRecord for e in plain.trace.entries)
    return inst, fast.trace, plain.trace


def test_request_and_run_metrics_equal_stepped(pair):
    _, fast, plain = pair
    assert request_metrics(fast).equals(request_metrics(plain))
    assert run_metrics(fast) == run_metrics(plain)
    assert run_metrics(fast, requests=request_columns(fast)) == run_metrics(plain)
    assert run_metrics(fast, requests=request_metrics(fast)) == run_metrics(plain)


@pytest.mark.parametrize("slo", [None, SLO(ttft=0.5, tpot=0.05, e2el=20.0)])
def test_serving_metrics_equal_stepped(pair, slo):
    _, fast, plain = pair
    _assert_same_dict(serving_metrics(fast, slo).to_dict(), serving_metrics(plain, slo).to_dict())
    # Several traces pooled (engines of one run): the same pooled figures either way.
    _assert_same_dict(
        serving_metrics([fast, plain], slo).to_dict(), serving_metrics([plain, plain], slo).to_dict()
    )


def test_token_stats_equal_the_per_token_path(pair, monkeypatch):
    _, fast, plain = pair
    reference = _legacy_stats(plain)
    _assert_same_stats(token_stats(fast), reference)
    _assert_same_stats(token_stats(plain), reference)
    _assert_same_stats(_legacy_stats(fast), reference)
    quantiles = tokens._legacy(plain)[1:]
    _assert_same_quantiles(tbt_quantiles(fast), quantiles)
    _assert_same_quantiles(tbt_quantiles(plain), quantiles)
    # Small chunks: the gaps and the per-request order statistics a few at a time.
    monkeypatch.setattr(tokens, "CHUNK_GAPS", 7)
    _assert_same_stats(tokens._fast_stats(fast, BatchClock.of(fast)), reference)
    g, values = tokens._gaps(fast, BatchClock.of(fast))
    _assert_same_quantiles(tokens._group_order_stats(g, *tokens._ranked(values)), quantiles)


def test_tbt_quantiles_only_when_read(pair, monkeypatch):
    _, fast, _ = pair
    calls = []
    real = tokens._group_order_stats
    monkeypatch.setattr(tokens, "_group_order_stats", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(tokens, "_QUANTILES", type(tokens._QUANTILES)())
    cols = request_columns(fast)
    run_metrics(fast, requests=cols)
    serving_metrics(fast, requests=[cols])
    assert not calls  # no TBT SLO here: the run and serving metrics never sort a request's gaps
    assert list(cols) == list(request_metrics(fast).drop(columns="cls").columns)
    np.testing.assert_array_equal(cols["tbt_p99"], request_metrics(fast)["tbt_p99"].to_numpy())
    assert len(calls) == 1  # computed once, kept with the trace


def test_batch_clock_is_the_batch_by_batch_clock(pair):
    _, fast, plain = pair
    clock = BatchClock.of(fast)
    bm = batch_metrics(plain)
    np.testing.assert_array_equal(clock.ends, bm["end"].to_numpy())
    np.testing.assert_array_equal(clock.starts(), bm["start"].to_numpy())
    assert clock.num_batches == fast.num_batches == len(bm) and clock.chronological()


def test_itl_distribution_of_counts_is_numpys():
    rng = np.random.default_rng(3)
    for size in (1, 2, 5, 999, 1000, 4321):
        values = np.round(rng.exponential(1.0, size), 2)  # many equal values
        distinct, counts = np.unique(values, return_counts=True)
        a, b = Distribution.of(values), Distribution.of_counts(distinct, counts)
        assert (a.n, a.median, a.p50, a.p90, a.p99, a.p999) == (b.n, b.median, b.p50, b.p90, b.p99, b.p999)
        assert b.mean == pytest.approx(a.mean, rel=1e-12) and b.std == pytest.approx(
            a.std, rel=1e-12, abs=1e-15
        )
    empty = Distribution.of_counts(np.zeros(0), np.zeros(0, dtype=np.int64))
    assert empty.n == 0 and math.isnan(empty.mean) and empty.p999 is None


def test_linear_quantiles_are_numpys_to_the_bit():
    rng = np.random.default_rng(5)
    qs = [0.0, 0.5, 0.9, 0.99, 0.999, 1.0, 1 / 3]
    for size in (1, 2, 3, 7, 100, 999, 1000, 4321):
        for values in (rng.exponential(1.0, size), np.round(rng.exponential(1.0, size), 1), np.ones(size)):
            expected = np.quantile(values, qs, method="linear")
            got = tokens.linear_quantiles(np.sort(values), qs)
            assert got.tolist() == expected.tolist(), size
            d = Distribution.of(values)
            assert (d.p50, d.p90, d.p99) == tuple(np.quantile(values, [0.5, 0.9, 0.99]).tolist())


def test_a_trace_going_back_in_time_takes_the_per_token_path():
    inst = INSTANCES["tight-unit"]
    result = simulate(inst, make_policy("sarathi"), coalesce=False)
    batches = list(result.schedule.entries)
    # Move one batch back before its predecessor: illegal (overlap), replayed leniently.
    k = len(batches) // 2
    b = batches[k]
    batches[k] = Batch(batches[k - 1].start - 0.5, b.duration, b.requests, b.tokens, b.phases, b.evicted)
    trace = replay(inst, Schedule(tuple(batches)), strict=False)
    assert not trace.ok and not BatchClock.of(trace).chronological()
    _assert_same_stats(token_stats(trace), _legacy_stats(trace))
    _assert_same_quantiles(tbt_quantiles(trace), tokens._legacy(trace)[1:])
    assert (request_metrics(trace)["tbt_max"].dropna() >= 0).all()


def test_token_stats_are_computed_once_per_trace():
    inst = INSTANCES["tight-unit"]
    trace = simulate(inst, make_policy("sarathi")).trace
    first = token_stats(trace)
    assert token_stats(trace) is first  # the request frame and the serving metrics share it
    trace.entries.pop()  # a trace that changed is measured again
    again = token_stats(trace)
    assert again is not first and again.generated.sum() < first.generated.sum()
