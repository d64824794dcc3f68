"""The study tools' inputs: bad files and columns, several objectives, mixed solver scopes, win rates,
read-only and all-error databases, export over its input, empty generator axes, wrong argument types."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from kvsched.analysis import plots
from kvsched.analysis import store as store_mod
from kvsched.analysis.compare import MAX_REGRET_SCOPE, REGRET
from kvsched.analysis.regret import instance_regret, regret_table
from kvsched.analysis.report import database_report
from kvsched.analysis.spec import parse_spec
from kvsched.analysis.store import export, load_results, open_db
from kvsched.analysis.sweep import run_sweep
from kvsched.cli import main
from kvsched.errors import InputError
from tests.test_heuristics_own import POLICY_FILE
from tests.test_sweep import _A, _C, TINY, _one_error_line, _row, tiny


def _db(path: Path, rows: list[dict[str, Any]]) -> Path:
    with open_db(path, create=True) as db:
        for row in rows:
            db.write(row)
    return path


# ----------------------------------------------------------------------------- crashes
def test_plot_anytime_of_a_database_or_a_binary_file_is_one_error(one_instance_db, tmp_path, capsys):
    # Both were "internal error: UnicodeDecodeError" (exit 3).
    binary = tmp_path / "rnd.json"
    binary.write_bytes(b"\x94\xfa\x00\xff" * 25)
    for source, says in ((one_instance_db, "SQLite database"), (binary, "UTF-8")):
        assert main(["plot", "anytime", str(source), "--out", str(tmp_path / "a.png")]) == 2
        _one_error_line(capsys, str(source), says)
    assert not (tmp_path / "a.png").exists()


@pytest.mark.parametrize(
    ("option", "column"),
    [("--metric", "status"), ("--metric", "scope"), ("--x", "name"), ("--x", "kind"), ("--x", "metrics")],
)
def test_plot_load_refuses_a_text_column(one_instance_db, tmp_path, capsys, option, column):
    # --metric status was a TypeError, --x name a ValueError from pandas, --x metrics an unreadable figure.
    out = tmp_path / "m.png"
    assert main(["plot", "load", str(one_instance_db), option, column, "--out", str(out)]) == 2
    err = _one_error_line(capsys, f"{option}: column {column!r} is not numeric", "numeric columns: ")
    assert "mean_latency" in err and not out.exists()


# ----------------------------------------------------------------------------- several objectives
@pytest.fixture
def two_objectives(tmp_path: Path) -> Path:
    """One instance measured in total latency (A = 10, B = 14) and in makespan (A = 5, B = 4)."""
    mk = {"objective_name": "makespan"}
    return _db(
        tmp_path / "two.sqlite",
        [
            _row("a", "i1", "policy", "A", "ok", 10, metrics={"mean_latency": 2.5}),
            _row("b", "i1", "policy", "B", "ok", 14, metrics={"mean_latency": 3.5}),
            {**_row("am", "i1", "policy", "A", "ok", 5, metrics={"mean_latency": 2.5}), **mk},
            {**_row("bm", "i1", "policy", "B", "ok", 4, metrics={"mean_latency": 3.5}), **mk},
        ],
    )


def test_database_figures_and_report_refuse_several_objectives(two_objectives, tmp_path, capsys):
    db = str(two_objectives)
    for argv in (
        ["plot", "load", db, "--out", str(tmp_path / "l.png")],
        ["plot", "regret", db, "--out", str(tmp_path / "r.png")],
        ["report", db, "--out", str(tmp_path / "rep")],
    ):
        assert main(argv) == 2
        _one_error_line(capsys, "several objectives (total-latency, makespan)", "--objective")
    assert not any(tmp_path.glob("*.png")) and not (tmp_path / "rep").exists()
    frame = load_results(two_objectives)
    for call in (plots.load_curve_data, plots.regret_size_data):
        with pytest.raises(InputError, match="several objectives"):
            call(frame)
    with pytest.raises(InputError, match="several objectives"):
        database_report(two_objectives, tmp_path / "api")


def test_database_figures_and_report_take_one_objective(two_objectives, tmp_path, capsys):
    db = str(two_objectives)
    assert main(["plot", "load", db, "--objective", "makespan", "--out", str(tmp_path / "l.png")]) == 0
    assert main(["report", db, "--objective", "makespan", "--out", str(tmp_path / "rep")]) == 0
    page = (tmp_path / "rep" / "index.html").read_text()
    # Against the best policy on makespan B wins; A's regret is (5 - 4) / 4 = 25 %.
    assert "25" in page
    capsys.readouterr()
    assert main(["regret", db, "--objective", "nope"]) == 2
    _one_error_line(capsys, "--objective: no rows measured in 'nope'", "total-latency, makespan")


# ----------------------------------------------------------------------------- mixed solver scopes
def test_references_come_from_one_scope_when_the_solver_ran_twice(tmp_path):
    # The probe's instance: time/highs optimal at 64 (contiguous), batch/cpsat feasible at 62, bound 46 (all).
    # The old reference took 62 as "optimum" (proven) and 64 as the bound: the interval was upside down.
    path = _db(
        tmp_path / "mix.sqlite",
        [
            _row("s1", "i1", "solver", "opt", "optimal", 64, bound=64, **_C),
            _row("s2", "i1", "solver", "opt", "feasible", 62, bound=46, **_A),
            _row("a1", "i1", "policy", "A", "ok", 75),
        ],
    )
    per = instance_regret(load_results(path), "optimum").iloc[0]
    assert (per["reference"], per["scope"], bool(per["proven"])) == (62.0, "all", False)
    assert per[REGRET] == 13 and per[MAX_REGRET_SCOPE] == 29 and per[REGRET] <= per[MAX_REGRET_SCOPE]
    assert instance_regret(load_results(path), "bound").iloc[0]["reference"] == 46.0
    # Of one scope only, every row is used: the lowest value, the highest bound, proven by any optimal row.
    path = _db(
        tmp_path / "same.sqlite",
        [
            _row("s1", "i1", "solver", "opt", "feasible", 66, bound=50, **_C),
            _row("s2", "i1", "solver", "opt", "optimal", 64, bound=64, **_C),
            _row("a1", "i1", "policy", "A", "ok", 75),
        ],
    )
    per = instance_regret(load_results(path), "optimum").iloc[0]
    assert (per["reference"], per[MAX_REGRET_SCOPE], bool(per["proven"])) == (64.0, 11.0, True)


# ----------------------------------------------------------------------------- win rate and order
def test_win_rate_counts_the_instances_a_policy_ran_on_and_failures_rank_last(tmp_path):
    # A: wins i1 and i4, loses i3 (12 vs 10), fails i2. M: fails i1, i2 and i4, wins i3.
    # i2: nothing ran, so no policy is best there.
    path = _db(
        tmp_path / "win.sqlite",
        [
            _row("a1", "i1", "policy", "A", "ok", 10),
            _row("m1", "i1", "policy", "M", "error", None, error="x"),
            _row("a2", "i2", "policy", "A", "error", None, error="x"),
            _row("m2", "i2", "policy", "M", "error", None, error="x"),
            _row("a3", "i3", "policy", "A", "ok", 12),
            _row("m3", "i3", "policy", "M", "ok", 10),
            _row("a4", "i4", "policy", "A", "ok", 10),
            _row("m4", "i4", "policy", "M", "error", None, error="x"),
        ],
    )
    t = regret_table(load_results(path), "best-policy")
    assert math.isclose(t.loc["A", "win_rate"], 2 / 3) and t.loc["M", "win_rate"] == 1.0
    assert (t.loc["A", "failed"], t.loc["M", "failed"]) == (1, 3)
    # M has 0 % regret on its one instance, A 20 / 3 %: the failures, not that, decide the order.
    assert list(t.index) == ["A", "M"]


# ----------------------------------------------------------------------------- databases
def test_a_read_only_database_can_be_read(one_instance_db, monkeypatch):
    # _migrate wrote the schema version on every open: "attempt to write a readonly database".
    connect = sqlite3.connect

    def read_only(path: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        return connect(f"file:{Path(path).resolve()}?mode=ro", *args, uri=True, **kwargs)

    monkeypatch.setattr(store_mod.sqlite3, "connect", read_only)
    frame = load_results(one_instance_db)
    assert len(frame) == 3


def test_report_of_a_database_of_errors_only_writes_its_tables(tmp_path, capsys):
    # It failed with "no finished rows to plot" and left an empty --out folder behind.
    path = _db(
        tmp_path / "ae.sqlite",
        [
            _row("a1", "i1", "policy", "A", "error", None, error="x"),
            _row("b1", "i1", "policy", "B", "error", None, error="x"),
        ],
    )
    assert main(["report", str(path), "--out", str(tmp_path / "rep")]) == 0
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "not drawn (no finished rows to plot)" in page


def test_export_refuses_to_overwrite_its_input_or_another_database(one_instance_db, tmp_path):
    db = tmp_path / "x.sqlite"
    db.write_bytes(one_instance_db.read_bytes())
    with pytest.raises(InputError, match="is also the input database"):
        export(db, "csv", db)
    with pytest.raises(InputError, match="SQLite database"):
        export(db, "csv", one_instance_db)
    assert store_mod.is_database(db) and store_mod.is_database(one_instance_db)
    assert export(db, "csv", tmp_path / "x.csv") == 3


# ----------------------------------------------------------------------------- specs
def test_an_empty_generator_parameter_axis_is_refused(tmp_path, capsys):
    data = tiny()
    data["instances"][0]["params"]["rate"] = []
    with pytest.raises(
        InputError, match=r"^s.yaml: instances.0.params: rate: an axis needs at least one value"
    ):
        parse_spec(data, "s.yaml")
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(data))
    assert main(["sweep", str(spec), "--db", str(tmp_path / "r.sqlite")]) == 2
    _one_error_line(capsys, "instances.0.params: rate: an axis needs at least one value")
    assert not (tmp_path / "r.sqlite").exists()


def test_a_file_block_refuses_seeds():
    # A file is one instance whatever the seed: seeds were taken and ignored.
    data = tiny()
    data["instances"] = [{"file": ["f.json"], "seeds": 3}]
    with pytest.raises(InputError, match=r"a file block takes no n, params, seeds"):
        parse_spec(data, "s.yaml")


def test_a_warm_start_may_be_a_policy_file(tmp_path):
    # It was refused as "unknown policy", though FILE.py:CLASS is taken wherever a policy is named.
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "mine.py").write_text(POLICY_FILE)
    data = tiny(solver={**TINY["solver"], "warm_start": ["own/mine.py:Serial"]})
    spec = parse_spec(data, "s.yaml", base=tmp_path)
    solver = spec.cells(tmp_path)[0]
    assert solver.runner["warm_start"] == [f"{tmp_path / 'own' / 'mine.py'}:Serial"]
    with pytest.raises(InputError, match=r"^s.yaml: solver.warm_start.0: .*has no 'Nope'"):
        parse_spec(tiny(solver={**TINY["solver"], "warm_start": ["own/mine.py:Nope"]}), "s.yaml", tmp_path)
    summary = run_sweep(spec, tmp_path / "r.sqlite", base=tmp_path, workers=1, progress=False)
    frame = load_results(tmp_path / "r.sqlite")
    assert summary is not None and (frame["status"] != "error").all()


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda: regret_table(None), "frame: expected a results DataFrame"),
        (lambda: regret_table(pd.DataFrame()), "frame: not a results frame (no column kind"),
        (lambda: instance_regret("small.sqlite"), "frame: expected a results DataFrame"),
        (lambda: run_sweep({"name": "x"}, "w.sqlite"), "spec: expected a SweepSpec"),
        (lambda: run_sweep(parse_spec(tiny()), "w.sqlite", workers="2"), "workers: expected an integer"),
    ],
)
def test_wrong_argument_types_are_one_error_naming_the_argument(tmp_path, monkeypatch, call, says):
    # Each was a raw KeyError, TypeError or AttributeError.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as info:
        call()
    assert str(info.value).startswith(says) and "\n" not in str(info.value)
    assert not (tmp_path / "w.sqlite").exists()


def test_titles_count_apart_the_instances_without_a_reference(tmp_path):
    # An instance where every run failed has no reference: it was counted as one of the measured ones.
    from kvsched.analysis.regret import describe_reference

    path = _db(
        tmp_path / "r.sqlite",
        [
            _row("s1", "i1", "solver", "opt", "optimal", 64, bound=64, **_A),
            _row("a1", "i1", "policy", "A", "ok", 75),
            _row("s2", "i2", "solver", "opt", "error", None, error="infeasible", **_A),
            _row("a2", "i2", "policy", "A", "error", None, error="infeasible"),
        ],
    )
    frame = load_results(path)
    assert describe_reference(frame, "optimum").endswith(
        "(proven on 1 of 1 instances; 1 without a reference)"
    )
    assert describe_reference(frame, "bound").endswith("(1 instances; 1 without a reference)")
