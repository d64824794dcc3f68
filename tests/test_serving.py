"""vLLM-style serving metrics (TTFT, TPOT, ITL, E2EL, goodput), checked against token times read off the
records."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest

from kvsched.errors import InputError
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.io import load_instance
from kvsched.instances.model import Instance, Limits, Request
from kvsched.schedule.ir import Batch, Schedule
from kvsched.schedule.metrics import request_columns, request_metrics, run_metrics
from kvsched.schedule.serving import (
    P999_MIN_SAMPLES,
    SLO,
    Distribution,
    parse_slo,
    serving_metrics,
    serving_table,
)
from kvsched.schedule.tokens import token_stats
from kvsched.schedule.validate import replay, validate
from tests.test_examples import EXAMPLES

FIG15 = load_instance(EXAMPLES / "figure15.json")
SHAREGPT = load_instance(EXAMPLES / "sharegpt-small.json")


def _trace(instance, policy="vllm"):
    return replay(instance, simulate(instance, make_policy(policy)).schedule)


def _token_times(trace) -> dict[int, list[float]]:
    """Each request's token emission times, one batch record at a time (runs spelled out)."""
    times: dict[int, list[float]] = {}
    for rec in trace.records:
        for r in rec.generated.tolist():
            times.setdefault(r, []).append(rec.end)
    return times


@pytest.mark.parametrize(("instance", "policy"), [(FIG15, "vllm"), (SHAREGPT, "sarathi"), (SHAREGPT, "vllm")])
def test_distributions_match_the_token_times(instance, policy):
    trace = _trace(instance, policy)
    m = serving_metrics(trace)
    times = _token_times(trace)
    arrival = np.array([r.arrival for r in instance.requests])
    ttft = np.array([times[r][0] - arrival[r] for r in range(len(instance))])
    e2el = np.array([times[r][-1] - arrival[r] for r in range(len(instance))])
    itl = np.concatenate([np.diff(times[r]) for r in range(len(instance))])
    tpot = np.array(
        [(e2el[r] - ttft[r]) / (len(times[r]) - 1) for r in range(len(instance)) if len(times[r]) > 1]
    )
    for name, values in (("ttft", ttft), ("e2el", e2el), ("itl", itl), ("tpot", tpot)):
        d = getattr(m, name)
        assert d.n == values.size
        assert d.mean == pytest.approx(values.mean())
        assert d.median == d.p50 == pytest.approx(np.percentile(values, 50))
        assert d.p90 == pytest.approx(np.percentile(values, 90))
        assert d.p99 == pytest.approx(np.percentile(values, 99))
        if values.size < 1000:
            assert d.p999 is None
        else:
            assert d.p999 == pytest.approx(np.percentile(values, 99.9))
    # The same figures the run summary reports.
    run = run_metrics(trace)
    assert m.ttft.mean == pytest.approx(run.mean_ttft) and m.e2el.p99 == pytest.approx(run.p99_latency)
    assert m.total_output_tokens == run.generated_tokens and m.duration == pytest.approx(run.makespan)


def test_figure15_by_hand():
    m = serving_metrics(_trace(FIG15)).to_dict()
    # vllm on Figure 15: TTFT 1, 1, 8, 8 and latencies 4, 7, 11, 14 (seed 003 Fig. 15).
    assert m["mean_ttft"] == pytest.approx(4.5) and m["p50_ttft"] == pytest.approx(4.5)
    assert m["mean_e2el"] == pytest.approx(9.0) and m["n_itl"] == 12
    assert m["time_unit"] == "slot" and m["good_requests"] is None


def test_p999_from_a_thousand_samples():
    rng = np.random.default_rng(0)
    few, many = rng.random(P999_MIN_SAMPLES - 1), rng.random(P999_MIN_SAMPLES)
    assert Distribution.of(few).p999 is None
    assert Distribution.of(many).p999 == pytest.approx(np.percentile(many, 99.9))
    empty = Distribution.of(np.array([np.nan]))
    assert empty.n == 0 and math.isnan(empty.mean)


def test_an_infinite_sample_gives_nan_spread_without_warnings():
    """numpy's own statistics of such samples, quietly: inf - inf is NaN, not a RuntimeWarning on the
    screen."""
    values, counts = np.array([1.0, 2.0, np.inf]), np.array([2, 1, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        counted = Distribution.of_counts(values, counts)
        spelled = Distribution.of(np.repeat(values, counts))
    for d in (counted, spelled):
        assert d.n == 4 and d.mean == math.inf and math.isnan(d.std)
    with np.errstate(invalid="ignore"):
        expected = np.quantile(np.repeat(values, counts), [0.5, 0.9])
    np.testing.assert_array_equal([counted.p50, counted.p90], expected)
    np.testing.assert_array_equal([spelled.p50, spelled.p90], expected)


def test_throughput_only_in_seconds():
    slots = serving_metrics(_trace(FIG15)).to_dict()
    assert slots["output_throughput"] is None and slots["request_throughput"] is None
    assert slots["output_tokens_per_time_unit"] == pytest.approx(16 / 14)
    secs = serving_metrics(_trace(SHAREGPT)).to_dict()
    assert secs["time_unit"] == "s"
    assert secs["output_throughput"] == pytest.approx(secs["total_output_tokens"] / secs["duration"])


def test_duration_runs_from_the_first_arrival():
    # vLLM's benchmark clock starts with the first request sent: a trace whose arrivals all start 1000 s
    # late has the same latencies and the same throughputs, not a tenth of them.
    moved = tuple(dataclasses.replace(r, arrival=r.arrival + 1000.0) for r in SHAREGPT.requests)
    late = dataclasses.replace(SHAREGPT, requests=moved)
    base, shifted = (serving_metrics(_trace(i, "sarathi")) for i in (SHAREGPT, late))
    first = min(r.arrival for r in SHAREGPT.requests)
    assert base.duration == pytest.approx(_trace(SHAREGPT, "sarathi").state.clock - first)
    assert shifted.duration == pytest.approx(base.duration)
    assert shifted.to_dict()["request_throughput"] == pytest.approx(base.to_dict()["request_throughput"])
    assert shifted.e2el.mean == pytest.approx(base.e2el.mean)


def test_rates_are_named_by_their_time_unit():
    from kvsched.analysis.compare import compare

    m = run_metrics(_trace(FIG15))
    assert {"tokens_per_slot", "requests_per_slot"} <= set(
        m.to_dict("slot")
    ) and "tokens_per_s" not in m.to_dict("slot")
    assert not {k for k in m.to_dict(rates=False) if "_per_" in k}
    slots = compare(FIG15, "vllm", solver=None).table
    secs = compare(SHAREGPT, "vllm", solver=None).table
    assert "tokens_per_slot" in slots and "tokens_per_s" not in slots and "tokens_per_s" in secs


def test_goodput_counts_requests_meeting_every_slo():
    trace = _trace(FIG15)
    frame = request_metrics(trace)
    m = serving_metrics(trace, SLO(ttft=5, tpot=2))
    expected = int(((frame["ttft"] <= 5) & (frame["tpot"] <= 2)).sum())
    assert m.good_requests == expected == 2
    d = m.to_dict()
    assert d["goodput_per_time_unit"] == pytest.approx(2 / 14) and d["goodput_fraction"] == 0.5
    assert d["slo_ttft"] == 5 and d["slo_e2el"] is None
    assert serving_metrics(trace, SLO(e2el=100)).good_requests == 4


def test_pooled_engines():
    a, b = _trace(FIG15), _trace(FIG15, "sarathi")
    pooled = serving_metrics([a, None, b])
    assert pooled.num_requests == 8 and pooled.itl.n == 24


@pytest.mark.parametrize(
    ("text", "unit", "expected"),
    [
        ("ttft=200ms,tpot=50ms", "s", SLO(ttft=0.2, tpot=0.05)),
        ("ttft=0.5, e2el=3s", "s", SLO(ttft=0.5, e2el=3.0)),
        ("TTFT=4", "slot", SLO(ttft=4.0)),
    ],
)
def test_parse_slo(text, unit, expected):
    got = parse_slo(text, unit)
    for key in ("ttft", "tpot", "e2el"):
        assert getattr(got, key) == pytest.approx(getattr(expected, key)) or getattr(expected, key) is None


@pytest.mark.parametrize(
    ("text", "unit", "message"),
    [
        ("ttft=200ms", "slot", "has a unit"),
        ("itl=3", "s", "expected ttft=V"),
        ("ttft=nan", "s", "not a positive number"),
        ("ttft=-1", "s", "not a positive number"),
        ("ttft=1,ttft=2", "s", "given twice"),
        ("", "s", "at least one"),
    ],
)
def test_parse_slo_errors_name_the_flag(text, unit, message):
    with pytest.raises(InputError, match=message) as info:
        parse_slo(text, unit)
    assert str(info.value).startswith("--slo")


def test_table_renders():
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(serving_table(serving_metrics(_trace(FIG15), SLO(ttft=5))))
    text = console.export_text()
    assert "TTFT" in text and "ITL" in text and "goodput" in text and "2 of 4" in text


# ----------------------------------------------------------------------------- the commands
KEYS = ("mean_ttft", "p90_ttft", "p99_tpot", "p50_itl", "p99_e2el", "time_unit")


def test_simulate_json_summary(tmp_path):
    import json

    from kvsched.cli import main

    out = tmp_path / "s.json"
    args = [
        "simulate",
        str(EXAMPLES / "figure15.json"),
        "-p",
        "vllm",
        "--json",
        str(out),
        "--slo",
        "ttft=5,tpot=2",
    ]
    assert main(args) == 0
    doc = json.loads(out.read_text())
    assert all(k in doc for k in KEYS) and doc["time_unit"] == "slot"
    assert doc["mean_ttft"] == pytest.approx(4.5) and doc["good_requests"] == 2
    assert "tokens_per_s" not in doc and doc["output_throughput"] is None  # slots are not seconds
    assert main([*args[:4], "--slo", "ttft=5ms"]) == 2  # a unit on a slot instance


def test_solve_compare_bound_json(tmp_path):
    import json

    from kvsched.cli import main

    fig15 = str(EXAMPLES / "figure15.json")
    solve, cmp, bound = tmp_path / "solve.json", tmp_path / "cmp.json", tmp_path / "bound.json"
    # The time-indexed optimum (no evictions) is 40 on Figure 15.
    assert main(["solve", fig15, "--formulation", "time", "--time-limit", "20", "--json", str(solve)]) == 0
    doc = json.loads(solve.read_text())
    assert doc["status"] == "optimal" and doc["objective"] == 40 and all(k in doc for k in KEYS)
    assert doc["mean_e2el"] * 4 == pytest.approx(doc["objective"])  # total latency over 4 requests
    assert (
        main(["compare", fig15, "--policies", "vllm", "--no-solver", "--json", str(cmp), "--slo", "ttft=1"])
        == 0
    )
    doc = json.loads(cmp.read_text())
    row = doc["rows"][0]
    assert doc["time_unit"] == "slot" and all(k in row for k in KEYS) and row["good_requests"] == 2
    assert main(["bound", "combinatorial", fig15, "--json", str(bound)]) == 0
    doc = json.loads(bound.read_text())
    assert doc["time_unit"] == "slot" and doc["lower_bound_total_latency"] <= 36


def test_sweep_rows_carry_serving_metrics_and_goodput(tmp_path):
    from kvsched.analysis.spec import parse_spec
    from kvsched.analysis.store import load_results
    from kvsched.analysis.sweep import run_sweep
    from tests.test_sweep import TINY

    spec = parse_spec({k: v for k, v in TINY.items() if k != "solver"})  # the policies only: fast
    run_sweep(spec, tmp_path / "r.sqlite", workers=1, progress=False, slo="ttft=3")
    frame = load_results(tmp_path / "r.sqlite")
    assert len(frame) == 4 and (frame["status"] == "ok").all()
    # Run metrics spread into columns (load_results): the serving keys and the SLO used.
    assert (frame["slo_ttft"] == 3).all() and frame["time_unit"].eq("slot").all()
    for key in ("mean_ttft", "p90_ttft", "p99_tpot", "p50_itl", "p99_e2el", "good_requests"):
        assert frame[key].notna().all(), key
    assert (frame["good_requests"] <= frame["n"]).all()


def test_sweep_slo_syntax_is_checked_before_the_work(tmp_path, capsys):
    import yaml

    from kvsched.cli import main
    from tests.test_sweep import TINY

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(TINY))
    assert main(["sweep", str(spec), "--db", str(tmp_path / "r.sqlite"), "--slo", "ttft"]) == 2
    assert "--slo: expected ttft=V" in capsys.readouterr().err
    assert not (tmp_path / "r.sqlite").exists()


@pytest.mark.parametrize("value", ["200ms", True])
def test_an_slo_value_that_is_no_number_is_an_input_error(value):
    # SLO(ttft="200ms") was a TypeError from math.isfinite; unit strings are parse_slo's. numpy numbers
    # are numbers.
    with pytest.raises(InputError, match=r"^slo: ttft: must be a positive finite number"):
        SLO(ttft=value)
    assert SLO(ttft=np.float64(0.2), tpot=np.int64(1)).ttft == 0.2


def test_the_metrics_of_an_illegal_trace_say_so():
    # A replay with strict=False measures what was replayed; the count of its violations goes with the
    # figures, so they are never read as an engine's.
    sched = simulate(FIG15, make_policy("vllm")).schedule
    cut = type(sched)(sched.entries[:-1])  # the last batch dropped: its requests never finish
    trace = replay(FIG15, cut, strict=False)
    m = serving_metrics(trace)
    assert m.violations == len(trace.violations) > 0 and m.completed < m.num_requests
    assert m.to_dict()["violations"] == m.violations
    assert "ILLEGAL schedule" in str(serving_table(m).caption)
    legal = serving_metrics(_trace(FIG15))
    assert legal.violations == 0 and "ILLEGAL" not in str(serving_table(legal).caption)


@pytest.mark.parametrize("text", [None, 5, ["ttft=1"]])
def test_parse_slo_refuses_what_is_not_text(text):
    with pytest.raises(InputError, match="--slo: expected text"):
        parse_slo(text, "s")


def test_traces_in_different_time_units_are_not_pooled():
    slots, seconds = _trace(FIG15), _trace(SHAREGPT)
    with pytest.raises(InputError, match=r"^traces: .*different units"):
        serving_metrics([slots, seconds])
    # Traces of one unit pool as before (None entries, idle engines, skipped).
    assert serving_metrics([slots, None, _trace(FIG15, "sarathi")]).num_requests == 2 * len(FIG15)


def test_unit_is_the_trace_own():
    slots, seconds = _trace(FIG15), _trace(SHAREGPT)
    assert serving_metrics(seconds, unit="s").time_unit == "s"
    assert serving_metrics(slots, unit="slot").time_unit == "slot"
    for trace, unit in ((seconds, "slot"), (slots, "s"), (slots, "ms"), (slots, 1)):
        with pytest.raises(InputError, match=r"^unit: "):
            serving_metrics(trace, unit=unit)


def test_requests_and_stats_must_be_the_trace_own():
    trace, other = _trace(SHAREGPT), _trace(SHAREGPT, "sarathi")
    with pytest.raises(InputError, match=r"^requests\[\]: .*another trace"):
        serving_metrics(trace, requests=[request_metrics(_trace(FIG15))])
    with pytest.raises(InputError, match=r"^requests\[\]: .*another schedule"):
        serving_metrics(trace, requests=[request_columns(other)])
    with pytest.raises(InputError, match=r"^stats\[\]: .*another trace"):
        serving_metrics(trace, stats=[token_stats(_trace(FIG15))])
    bad = [
        (dict(requests=[5]), r"^requests\[\]: .*got int"),
        (dict(stats=[5]), r"^stats\[\]: .*got int"),
        (dict(requests=[]), r"^requests: 0 entry"),
        (dict(stats=[token_stats(trace)] * 2), r"^stats: 2 entry"),
        (dict(requests=request_metrics(trace)), r"^requests: expected a list"),
    ]
    for kwargs, message in bad:
        with pytest.raises(InputError, match=message):
            serving_metrics(trace, **kwargs)
    with pytest.raises(InputError, match=r"^stats: .*got int"):
        request_metrics(trace, stats=5)
    # The trace's own, given back: the figures computed without them.
    expected = serving_metrics(trace).to_dict()
    given = serving_metrics(trace, requests=[request_metrics(trace)], stats=[token_stats(trace)])
    assert given.to_dict() == pytest.approx(expected, nan_ok=True)
    assert serving_metrics(trace, requests=[request_columns(trace)]).to_dict() == pytest.approx(
        expected, nan_ok=True
    )


def test_serving_metrics_of_a_trace_that_generated_nothing():
    inst = Instance((Request("a", 0, 2, 2), Request("b", 0, 2, 2)), Limits(100))
    partial = Batch(0, 1, np.array([0]), np.array([1]), np.array([0]))
    for schedule in (Schedule(()), Schedule((partial,))):
        m = serving_metrics(validate(inst, schedule))
        assert m.num_requests == 2 and m.completed == 0 and m.total_output_tokens == 0
        assert m.violations > 0
        for name in ("ttft", "tpot", "itl", "e2el"):
            d = getattr(m, name)
            assert d.n == 0 and math.isnan(d.mean)
