"""Figures: the data each plot is drawn from matches the replayed trace, and every plot writes a file."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvsched.analysis import plots
from kvsched.analysis.spec import parse_spec
from kvsched.analysis.store import load_results
from kvsched.analysis.sweep import run_sweep
from kvsched.cli import main
from kvsched.csp import Scope, SolverOptions, solve
from kvsched.errors import InputError
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.io import load_instance
from kvsched.schedule.ir import Phase
from kvsched.schedule.metrics import run_metrics
from kvsched.schedule.validate import replay
from tests.test_examples import EXAMPLES
from tests.test_sweep import TINY

FIG15 = EXAMPLES / "figure15.json"


@pytest.fixture(scope="module")
def fig15():
    inst = load_instance(FIG15)
    return inst, {name: simulate(inst, make_policy(name)).schedule for name in ("vllm", "vllm-ef", "sarathi")}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> pd.DataFrame:
    """A small sweep: two loads x two sizes, two policies and the solver."""
    data = copy.deepcopy(TINY)
    data["instances"][0]["n"] = [3, 5]
    data["instances"][0]["params"]["rate"] = [0.5, 2.0]
    db = tmp_path_factory.mktemp("plots") / "r.sqlite"
    run_sweep(parse_spec(data), db, workers=1, progress=False)
    return load_results(db)


def test_gantt_boxes_match_the_trace(fig15):
    inst, schedules = fig15
    schedule = schedules["vllm"]
    trace = replay(inst, schedule)
    seg = plots.gantt_segments(inst, schedule)
    work = seg[seg["kind"] != "evicted"]
    assert len(work) == sum(b.size for b in schedule.batches)
    for rec, batch in zip(trace.records, schedule.batches, strict=True):
        boxes = work[work["batch"] == rec.index]
        assert (boxes["start"] == rec.start).all() and (boxes["end"] == rec.end).all()
        assert sorted(boxes["request"]) == sorted(batch.requests.tolist())
        phases = dict(zip(batch.requests.tolist(), (Phase(int(p)).label for p in batch.phases), strict=True))
        assert all(phases[r] == k for r, k in zip(boxes["request"], boxes["kind"], strict=True))
        assert len(boxes) == rec.num_items and (boxes["kind"] == "decode").sum() == rec.num_decodes
    # Seed 003 Fig. 15: vLLM evicts r1 after its prefill and r3 after its prefill, each until its refill.
    evicted = seg[seg["kind"] == "evicted"]
    assert len(evicted) == run_metrics(trace).evictions == 2
    assert evicted[["id", "start", "end"]].values.tolist() == [["r1", 1.0, 4.0], ["r3", 8.0, 11.0]]
    refill = seg[seg["kind"] == "refill"]
    assert refill["start"].tolist() == evicted["end"].tolist()


def test_merged_boxes_cover_the_same_time(fig15):
    inst, schedules = fig15
    raw = plots.gantt_segments(inst, schedules["vllm"])
    merged = plots.gantt_segments(inst, schedules["vllm"], merge=True)
    assert len(merged) < len(raw)

    def span(f):
        return (f["end"] - f["start"]).groupby([f["request"], f["kind"]]).sum()

    pd.testing.assert_series_equal(span(raw), span(merged))


def test_gantt_kv_line_is_the_trace_kv(fig15):
    inst, schedules = fig15
    trace = replay(inst, schedules["vllm"])
    fig = plots.plot_gantt(inst, schedules["vllm"], title="vllm")
    kv_axis = fig.axes[1]
    line = kv_axis.lines[0]
    assert np.array_equal(line.get_ydata(), np.repeat([r.kv_tokens for r in trace.records], 2))
    assert np.array_equal(line.get_xdata()[::2], [r.start for r in trace.records])
    capacity = kv_axis.lines[1]
    assert set(capacity.get_ydata()) == {inst.limits.kv_capacity}


def test_kv_plot_has_one_line_per_schedule_and_M(fig15):
    inst, schedules = fig15
    fig = plots.plot_kv(inst, schedules)
    labels = [line.get_label() for line in fig.axes[0].lines]
    assert labels == [*schedules, "M"]
    for name, line in zip(schedules, fig.axes[0].lines, strict=False):
        kv = plots.kv_usage(replay(inst, schedules[name]))["kv_tokens"].to_numpy()
        assert np.array_equal(line.get_ydata(), np.repeat(kv, 2))


def test_token_gaps_are_the_tbt_samples(fig15):
    inst, schedules = fig15
    trace = replay(inst, schedules["vllm"])
    gaps = plots.token_gaps(trace)
    assert len(gaps) == sum(r.output - 1 for r in inst.requests)
    assert gaps.max() == run_metrics(trace).max_tbt == 4  # the evicted requests wait out the eviction


def test_tbt_cdf_is_the_share_of_gaps_at_or_below(fig15):
    # The right panel is drawn from the token statistics' counts: at each value drawn, the share of
    # every gap (spelled out by token_gaps) at or below it.
    inst, schedules = fig15
    trace = replay(inst, schedules["vllm"])
    gaps = np.sort(plots.token_gaps(trace))
    line = plots.plot_cdfs(inst, {"vllm": schedules["vllm"]}, traces={"vllm": trace}).axes[1].lines[0]
    x, y = line.get_xdata()[1:], line.get_ydata()[1:]
    assert set(x) == set(gaps) and y[-1] == 1
    np.testing.assert_allclose(y, np.searchsorted(gaps, x, side="right") / gaps.size)


def test_anytime_points_close_at_the_final_result():
    inst = load_instance(EXAMPLES / "tiny.json")
    res = solve(inst, formulation="time", options=SolverOptions(time_limit=10, threads=1))
    pts = plots.anytime_points(res)
    last = pts.iloc[-1]
    assert (last["time"], last["incumbent"], last["bound"]) == (res.runtime, res.objective, res.best_bound)
    assert plots.anytime_points([[0.5, 3, None], [0.1, 4, 1]])["time"].tolist() == [0.1, 0.5]


def test_load_curve_data_is_the_mean_over_seeds(results):
    data = plots.load_curve_data(results)  # rate varies: it is the default x
    assert data.columns[2] == "rate" and set(data["rate"]) == {0.5, 2.0}
    ok = results[results["name"] == "sarathi"]
    want = ok.groupby("rate")["mean_latency"].mean()
    got = data[data["name"] == "sarathi"].set_index("rate")["mean"]
    pd.testing.assert_series_equal(got, want, check_names=False)
    with pytest.raises(InputError, match="--x: no column 'nope'"):
        plots.load_curve_data(results, x="nope")


def test_regret_size_data_per_n(results):
    data = plots.regret_size_data(results)
    assert set(data["n"]) == {3, 5} and set(data["name"]) == {"sarathi", "vllm-ef"}
    assert (data["count"] == 4).all()  # two loads x two seeds per size


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_every_plot_writes_a_non_empty_file(tmp_path, fig15, results, suffix):
    inst, schedules = fig15
    res = solve(inst, formulation="time", options=SolverOptions(time_limit=10, threads=1))
    figures = {
        "gantt": plots.plot_gantt(inst, schedules["vllm"]),
        "kv": plots.plot_kv(inst, schedules),
        "cdf": plots.plot_cdfs(inst, schedules),
        "anytime": plots.plot_anytime(res),
        "load": plots.plot_load(results),
        "regret": plots.plot_regret_vs_size(results),
    }
    for name, fig in figures.items():
        path = plots.save_figure(fig, tmp_path / f"{name}{suffix}")
        assert path.stat().st_size > 1000, name


def test_save_rejects_unknown_formats(tmp_path, fig15):
    inst, schedules = fig15
    with pytest.raises(InputError, match=r"\.png, \.svg or \.pdf"):
        plots.save_figure(plots.plot_kv(inst, schedules), tmp_path / "x.txt")


def test_cli_plot_commands(tmp_path, capsys, results):
    db = tmp_path / "r.sqlite"
    # Rebuild a database for the CLI (the fixture's frame lives in another folder).
    data = copy.deepcopy(TINY)
    run_sweep(parse_spec(data), db, workers=1, progress=False)
    runs = [
        ["gantt", str(FIG15), "--policy", "vllm"],
        ["gantt", str(FIG15), "--solve", "--time-limit", "10", "--threads", "1"],
        ["kv", str(FIG15), "--policies", "vllm,vllm-ef"],
        ["cdf", str(FIG15), "--policies", "vllm"],
        ["anytime", str(FIG15), "--time-limit", "10", "--threads", "1"],
        ["load", str(db), "--x", "seed"],
        ["regret", str(db), "--against", "certified"],
    ]
    for k, args in enumerate(runs):
        out = tmp_path / f"p{k}.png"
        assert main(["plot", *args, "--out", str(out)]) == 0, args
        assert out.stat().st_size > 1000
    assert main(["plot", "gantt", str(FIG15), "--out", str(tmp_path / "g.png")]) == 2
    assert "exactly one of --policy" in capsys.readouterr().err
    assert main(["plot", "kv", str(FIG15), "--out", str(tmp_path / "g.gif")]) == 2
    assert ".png, .svg or .pdf" in capsys.readouterr().err


def test_plot_policies_start_only_within_the_time_limit(tmp_path, capsys):
    # --policies all ran every policy whatever --time-limit said (94 s for a 2 s limit on 2,000 requests).
    out = tmp_path / "c.png"
    assert (
        main(["plot", "cdf", str(FIG15), "--policies", "all", "--time-limit", "0.001", "--out", str(out)])
        == 0
    )
    err = capsys.readouterr().err
    assert "35 of 36 policies not run or not finished: the time limit ran out" in err
    assert out.stat().st_size > 1000  # the one policy that ran is drawn


def test_plot_draws_the_policies_that_can_run(tmp_path, capsys):
    # A whole-prompt policy cannot run prompts over the budget: a line, as in compare, not the end of the plot.
    out = tmp_path / "k.png"
    chunked = str(EXAMPLES / "chunked-prefill.json")
    assert main(["plot", "kv", chunked, "--policies", "vllm,sarathi", "--out", str(out)]) == 0
    assert "kvsched plot: vllm could not run: policy 'vllm' cannot run request" in capsys.readouterr().err
    assert main(["plot", "kv", chunked, "--policies", "vllm", "--out", str(out)]) == 2
    assert "--policies: none of vllm could run this instance" in capsys.readouterr().err


def test_anytime_from_a_solve_result_file(tmp_path):
    result = tmp_path / "res.json"
    assert main(["solve", str(FIG15), "--time-limit", "10", "--threads", "1", "--json", str(result)]) == 0
    out = tmp_path / "a.svg"
    assert main(["plot", "anytime", str(result), "--out", str(out)]) == 0
    assert Path(out).read_text().lstrip().startswith("<?xml")


def test_anytime_plot_names_the_scope_and_draws_the_bound_over_every_schedule():
    inst = load_instance(EXAMPLES / "tiny.json")
    res = solve(inst, formulation="time", options=SolverOptions(time_limit=10, threads=1))
    assert res.scope == Scope.CONTIGUOUS and res.all_schedules_bound is not None
    ax = plots.plot_anytime(res).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    # The curves are the anytime points: the best schedule and the bound over the result's scope.
    pts = plots.anytime_points(res)
    inc = pts.dropna(subset=["incumbent"])
    assert list(lines["best schedule"].get_xdata()) == inc["time"].tolist()
    assert list(lines["best schedule"].get_ydata()) == inc["incumbent"].tolist()
    scoped = [k for k in lines if k.startswith("bound over contiguous schedules")]
    assert len(scoped) == 1 and res.bound_source in scoped[0]
    # The time-indexed scope is narrower than every schedule: the certified bound is drawn too.
    every = res.all_schedules_bound
    line = lines[f"bound over every schedule ({every.source})"]
    assert set(line.get_ydata()) == {every.value}
    assert "contiguous" in ax.get_title()
    # Plain points (from a result file) have no scope to name.
    plain = plots.plot_anytime([[0.1, 4, 1]]).axes[0]
    assert [line.get_label() for line in plain.get_lines()] == ["best schedule", "bound"]


def test_many_schedules_get_a_legend_below_the_axes_not_over_them():
    inst = load_instance(EXAMPLES / "figure15.json")
    few = {name: simulate(inst, make_policy(name)).schedule for name in ("vllm", "sarathi")}
    fig = plots.plot_cdfs(inst, few)
    assert fig.axes[0].get_legend() is not None and not fig.legends
    many = {f"{name} {k}": s for k in range(6) for name, s in few.items()}  # 12 lines
    for fig in (plots.plot_cdfs(inst, many), plots.plot_kv(inst, many)):
        assert fig.axes[0].get_legend() is None and len(fig.legends) == 1
        assert len(fig.legends[0].get_texts()) == len(many) + (fig.axes[0].get_ylabel() == "KV tokens held")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_requests": -1}, r"^max_requests: expected an int >= 1, got -1$"),
        ({"max_requests": 0}, r"^max_requests: expected an int >= 1, got 0$"),
        ({"max_requests": "x"}, r"^max_requests: expected an int >= 1, got 'x'$"),
        ({"max_requests": True}, r"^max_requests: expected an int >= 1, got True$"),
        ({"max_requests": 2.0}, r"^max_requests: expected an int >= 1, got 2.0$"),
        ({"title": 5}, r"^title: expected a str \(or None for the default title\), got int$"),
        ({"trace": 5}, r"^trace: expected a Trace"),
    ],
)
def test_gantt_checks_its_keywords(fig15, kwargs, message):
    inst, schedules = fig15
    with pytest.raises(InputError, match=message):
        plots.plot_gantt(inst, schedules["vllm"], **kwargs)


def test_gantt_takes_any_int_count_and_no_title(fig15):
    inst, schedules = fig15
    fig = plots.plot_gantt(inst, schedules["vllm"], max_requests=np.int64(2), title=None)
    assert len(fig.axes[0].get_yticks()) == 2 and fig.axes[0].get_title(loc="left").startswith("schedule")


@pytest.mark.parametrize("plot", [plots.plot_kv, plots.plot_cdfs])
def test_kv_and_cdf_plots_check_their_keywords(fig15, plot):
    inst, schedules = fig15
    with pytest.raises(InputError, match=r"^title: expected a str"):
        plot(inst, schedules, title=5)
    for traces in (5, [replay(inst, schedules["vllm"])]):
        with pytest.raises(InputError, match=r"^traces: expected a mapping of the schedules' names"):
            plot(inst, schedules, traces=traces)
    with pytest.raises(InputError, match=r"^traces\['vllm'\]: expected a Trace .* got int$"):
        plot(inst, schedules, traces={"vllm": 5})
    with pytest.raises(InputError, match=r"^instance: expected an Instance"):
        plot(None, {})
    # Another instance's replay would draw its KV or its gaps under this instance's name.
    tiny = load_instance(EXAMPLES / "tiny.json")
    foreign = replay(tiny, simulate(tiny, make_policy("vllm")).schedule)
    with pytest.raises(InputError, match=r"^traces\['vllm'\]: a replay of another instance \(tiny\)$"):
        plot(inst, schedules, traces={"vllm": foreign})
    with pytest.raises(InputError, match=r"^trace: a replay of another instance"):
        plots.plot_gantt(inst, schedules["vllm"], trace=foreign)
    same = load_instance(EXAMPLES / "figure15.json")  # equal, not the same object: accepted
    assert plots.plot_gantt(inst, schedules["vllm"], trace=replay(same, schedules["vllm"]))
    assert plot(
        inst, schedules, traces={"vllm": replay(inst, schedules["vllm"]), "sarathi": None}, title=None
    )


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ([1, 2], r"^source: point 0: expected \(time, incumbent, bound\).* got 1$"),
        ("x", r"^source: expected a solve's Result or its anytime points .* got str$"),
        (None, r"^source: expected a solve's Result .* got NoneType$"),
        ([(0, 1, "a")], r"^source: point 0: .* got \(0, 1, 'a'\)$"),
        ([(0, 1, 1), (1, 1)], r"^source: point 1: .* got \(1, 1\)$"),
        ([(0, 1, 1, 1)], r"^source: point 0: "),
        ([(float("nan"), 1, 1)], r"^source: point 0: .*finite time >= 0"),
        ([(-1, 1, 1)], r"^source: point 0: "),
        ([(0, float("inf"), 1)], r"^source: point 0: "),
        ([(True, 1, 1)], r"^source: point 0: "),
    ],
)
def test_anytime_points_are_checked(source, message):
    with pytest.raises(InputError, match=message):
        plots.plot_anytime(source)
    with pytest.raises(InputError, match=message):
        plots.anytime_points(source)


def test_anytime_points_take_every_form_of_a_point():
    from kvsched.csp import AnytimePoint

    nan = float("nan")
    source = [AnytimePoint(0.3, 5.0, None), np.array([0.1, nan, 2.0]), (np.float64(0.2), 4, None)]
    pts = plots.anytime_points(iter(source))  # a generator too: read once
    assert pts["time"].tolist() == [0.1, 0.2, 0.3]
    # A missing incumbent or bound (None or NaN) is NaN, and not drawn.
    assert pts["incumbent"].isna().tolist() == [True, False, False]
    assert pts["bound"].isna().tolist() == [False, True, True]
    assert plots.plot_anytime(source, title=None).axes[0].get_title() == "solver progress"


def test_save_figure_path_faults_are_one_input_error(tmp_path, fig15):
    import os

    inst, schedules = fig15
    fig = plots.plot_gantt(inst, schedules["vllm"], max_requests=3)
    assert plots.save_figure(fig, tmp_path / "new" / "g.png").stat().st_size > 1000  # the folder is created
    with pytest.raises(InputError, match=r"^path: expected a file path .* got NoneType$"):
        plots.save_figure(fig, None)
    with pytest.raises(InputError, match=r"^path: .*x\.txt: use a \.png, \.svg or \.pdf file name$"):
        plots.save_figure(fig, tmp_path / "x.txt")
    (tmp_path / "d.png").mkdir()
    with pytest.raises(InputError, match=r"^save_figure: .*d\.png is a folder, not a file$"):
        plots.save_figure(fig, tmp_path / "d.png")
    if os.path.isdir("/proc/self"):
        with pytest.raises(InputError, match=r"^save_figure: /proc/x\.png cannot be written \(.+\)$"):
            plots.save_figure(fig, "/proc/x.png")


def test_a_gantt_of_the_first_requests_reads_only_the_entries_that_hold_them():
    # The boxes of the requests shown are every box they have; later entries are not spelled out.
    from kvsched.instances.generators import generate

    inst = generate("synthetic", n=200, seed=3, arrival="poisson", rate=0.5, tick=1)
    sim = simulate(inst, make_policy("sarathi"))
    prefix = plots._shown_prefix(sim.schedule, sim.trace, 10)
    assert 0 < len(prefix.entries) < len(sim.schedule.entries)
    full = plots.gantt_segments(inst, sim.schedule)
    part = plots.gantt_segments(inst, prefix)
    assert (
        full[full["request"] < 10]
        .reset_index(drop=True)
        .equals(part[part["request"] < 10].reset_index(drop=True))
    )
    assert plots._shown_prefix(sim.schedule, sim.trace, len(inst)) is sim.schedule


def test_an_ecdf_is_drawn_through_at_most_its_quantile_points(monkeypatch):
    monkeypatch.setattr(plots, "ECDF_POINTS", 64)
    fig = plots.Figure()
    ax = fig.subplots()
    values = np.random.default_rng(0).exponential(size=10_000)
    plots._ecdf(ax, values, "x")
    x, y = ax.get_lines()[0].get_data()
    assert len(x) <= 65 and y[0] == 0.0 and y[-1] == 1.0 and x[-1] == values.max()
    # Each point lies on the exact empirical CDF.
    exact = np.searchsorted(np.sort(values), x[1:], side="right") / values.size
    assert np.allclose(y[1:], exact)


# ----------------------------------------------------------------------------- a trace is its schedule's replay
def test_a_trace_of_another_schedule_is_refused(fig15):
    inst, _ = fig15
    vllm = simulate(inst, make_policy("vllm"))
    other = simulate(inst, make_policy("sarathi-ef")).trace
    with pytest.raises(InputError, match=r"^trace: not the replay of the schedule drawn"):
        plots.plot_gantt(inst, vllm.schedule, trace=other)
    for plot in (plots.plot_kv, plots.plot_cdfs):
        with pytest.raises(InputError, match=r"^traces\['vllm'\]: not the replay"):
            plot(inst, {"vllm": vllm.schedule}, traces={"vllm": other})
    plots.plot_gantt(inst, vllm.schedule, trace=vllm.trace)  # its own replay is drawn
    plots.plot_kv(inst, {"vllm": vllm.schedule}, traces={"vllm": replay(inst, vllm.schedule)})


def test_same_batch_count_other_starts_is_refused(fig15):
    from dataclasses import replace as changed

    from kvsched.schedule.ir import Run, Schedule

    inst, _ = fig15
    sim = simulate(inst, make_policy("vllm"))
    # The same batches, all one slot later: as many batches, other starts (a replay of another schedule).
    late = Schedule(
        tuple(
            changed(e, start=e.start + 1, end=e.end + 1) if type(e) is Run else changed(e, start=e.start + 1)
            for e in sim.schedule.entries
        )
    )
    with pytest.raises(InputError, match="start at other times"):
        plots.check_replay_of(late, sim.trace)


def test_a_trace_under_a_name_no_schedule_has_is_refused(fig15):
    inst, _ = fig15
    vllm = simulate(inst, make_policy("vllm"))
    for plot in (plots.plot_kv, plots.plot_cdfs):
        with pytest.raises(InputError, match=r"^traces: 'typo' name no schedule"):
            plot(inst, {"vllm": vllm.schedule}, traces={"typo": vllm.trace})


def test_the_replay_check_accepts_runs_that_end_with_a_last_chunk():
    from kvsched.schedule.records import RunRecord
    from tests.test_chunk_runs import INSTANCES, _coalesce

    seen_tail = False
    for inst in INSTANCES.values():
        plain = simulate(inst, make_policy("sarathi"), coalesce=False)
        coalesced = _coalesce(plain.schedule, plain.trace.records)
        trace = replay(inst, coalesced)
        seen_tail |= any(type(e) is RunRecord and e.tail is not None for e in trace.entries)
        assert plots.check_replay_of(coalesced, trace) is trace
        assert plots.check_replay_of(plain.schedule, replay(inst, plain.schedule)) is not None
    assert seen_tail
