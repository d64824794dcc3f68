"""Sweeps: spec validation, the results database, skipping finished cells, interruption, export, regret."""

from __future__ import annotations

import copy
import math
import os
import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from kvsched.analysis import spec as spec_mod
from kvsched.analysis import store as store_mod
from kvsched.analysis import sweep as sweep_mod
from kvsched.analysis.compare import MAX_REGRET_ALL, MAX_REGRET_SCOPE, REGRET
from kvsched.analysis.regret import instance_regret, regret_table
from kvsched.analysis.spec import load_spec, parse_spec
from kvsched.analysis.store import export, load_results, open_db
from kvsched.analysis.sweep import run_sweep
from kvsched.cli import main
from kvsched.errors import InputError
from kvsched.schedule.core import Rule, ScheduleError, Violation
from tests.test_examples import EXAMPLES

EXAMPLE_SPEC = Path(spec_mod.__file__).parent / "examples" / "small.yaml"

#: Two instances (seeds 0, 1) x (the solver + two policies) = 6 cells, about a second in all.
TINY: dict[str, Any] = {
    "name": "tiny",
    "instances": [
        {
            "generator": "synthetic",
            "n": 4,
            "kv_capacity": 16,
            "seeds": 2,
            "limits": {"max_batch_tokens": 32},
            "params": {
                "arrival": "poisson",
                "rate": 1.0,
                "tick": 1,
                "prompt": "uniform",
                "prompt_lo": 2,
                "prompt_hi": 5,
                "output": "uniform",
                "output_lo": 2,
                "output_hi": 4,
            },
        }
    ],
    "policies": ["sarathi", "vllm-ef"],
    "solver": {"name": "highs", "formulation": "time", "time_limit": 10, "threads": 1},
}


def tiny(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(TINY)
    data.update(changes)
    return data


def sweep(tmp_path: Path, data: dict[str, Any] | None = None, **kw: Any):
    kw.setdefault("workers", 1)
    kw.setdefault("progress", False)
    return run_sweep(parse_spec(data or tiny()), tmp_path / "r.sqlite", **kw)


# ----------------------------------------------------------------------------- spec validation
def _bad(path: str, value: Any) -> dict[str, Any]:
    data = tiny()
    target: Any = data
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    target[keys[-1]] = value
    return data


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (_bad("instances.0.n", 0), "instances.0.n"),
        (_bad("instances.0.kv_capacity", [16, -1]), "instances.0.kv_capacity"),
        (_bad("instances.0.seeds", 0), "instances.0.seeds"),
        # A count of seeds was expanded into a list first: 1e8 of them took gigabytes, without a word.
        (_bad("instances.0.seeds", 100_000_000), "instances.0.seeds"),
        # YAML true read as 1 (n: true ran instances of one request).
        (_bad("instances.0.n", True), "instances.0.n: must be integers, not true or false"),
        (_bad("instances.0.seeds", [True]), "instances.0.seeds: must be integers, not true or false"),
        # 3 runners x 400,000 seeds: refused as a whole grid (the message names no single field).
        (_bad("instances.0.seeds", 400_000), "(top level): the grid has 1,200,000 cells"),
        (_bad("instances.0.generator", "nope"), "instances.0.generator"),
        (_bad("instances.0.params.rate", -1), "instances.0.params"),
        (_bad("instances.0.params.rat", 1), "instances.0.params"),
        (_bad("instances.0.limits.max_batch_tokens", 0), "instances.0.limits.max_batch_tokens"),
        (_bad("instances.0.time_model", "nope"), "instances.0.time_model.name"),
        (
            _bad("instances.0.time_model", {"name": "hinge", "params": {"zz": 1}}),
            "instances.0.time_model.params",
        ),
        (_bad("policies", ["sarathi", "no-such-policy"]), "policies.1"),
        (_bad("policies", [{"name": "sarathi", "params": {"bogus": 1}}]), "policies.0"),
        (_bad("policies", ["sarathi", "sarathi"]), "policies"),
        (_bad("solver.time_limit", -5), "solver.time_limit"),
        # 100,000 threads hang or abort HiGHS: refused with the spec, not in every cell at run time.
        (_bad("solver.threads", 100_000), "solver.threads"),
        (_bad("solver.name", "gurobi"), "solver.name"),
        (_bad("solver.warm_start", ["nope"]), "solver.warm_start.0"),
        (_bad("objective", "speed"), "objective"),
        (_bad("name", ""), "name"),  # names the sweep's progress line and report: an empty one names nothing
        (_bad("name", "   "), "name"),
        (tiny(tpyo=1), "tpyo"),
        (_bad("instances.0.file", "x.json"), "instances.0"),
    ],
)
def test_spec_errors_are_one_line_naming_the_field(data, field):
    with pytest.raises(InputError) as err:
        parse_spec(data, "s.yaml")
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"s.yaml: {field}"), text


def test_cli_reports_a_bad_spec_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_bad("instances.0.n", -3)))
    assert main(["sweep", str(bad), "--db", str(tmp_path / "r.sqlite")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "instances.0.n" in err
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    assert main(["sweep", str(broken)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not valid YAML" in err


def test_a_key_given_twice_is_refused_not_overwritten(tmp_path, capsys):
    # PyYAML keeps the last of two equal keys without a word: two policies: lists ran only the second.
    text = yaml.safe_dump(tiny())
    twice = tmp_path / "twice.yaml"
    twice.write_text(text + "policies: [sarathi]\n")
    with pytest.raises(
        InputError, match=r"twice.yaml: policies: given twice in one mapping \(line \d+, column 1\)"
    ):
        load_spec(twice)
    nested = tmp_path / "nested.yaml"
    nested.write_text("name: x\ninstances:\n  - generator: synthetic\n    n: 4\n    n: 5\npolicies: [vllm]\n")
    assert main(["sweep", str(nested), "--db", str(tmp_path / "r.sqlite")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "n: given twice in one mapping (line 5, column 5)" in err
    assert not (tmp_path / "r.sqlite").exists()


def test_the_example_spec_is_valid_and_expands_to_its_grid():
    spec = load_spec(EXAMPLE_SPEC)
    cells = spec.cells()
    instances = {c.instance_key for c in cells}
    # n x M x rate x seeds = 2 x 2 x 3 x 2, each with 5 policies and the solver.
    assert len(instances) == 24 and len(cells) == 24 * 6
    assert cells[0].runner["kind"] == "solver"  # longest cells first
    assert len({c.key for c in cells}) == len(cells)


def test_cell_keys_are_stable_and_independent_of_the_rest_of_the_spec():
    keys = {c.key for c in parse_spec(tiny()).cells()}
    # Equal numbers in another spelling are the same cell.
    again = tiny()
    again["instances"][0]["params"]["rate"] = 1
    assert {c.key for c in parse_spec(again).cells()} == keys
    # Adding a policy (or renaming the sweep) adds cells and keeps the others.
    more = tiny(policies=["sarathi", "vllm-ef", "vllm"], name="other")
    assert keys < {c.key for c in parse_spec(more).cells()}


# ----------------------------------------------------------------------------- running
def test_sweep_writes_one_validated_row_per_cell_and_a_rerun_skips_them(tmp_path):
    first = sweep(tmp_path)
    assert (first.total, first.written, first.skipped, first.failed) == (6, 6, 0, ())
    frame = load_results(tmp_path / "r.sqlite")
    assert len(frame) == 6 and set(frame["status"]) <= {"ok", "optimal"}
    assert set(frame["name"]) == {"sarathi", "vllm-ef", "optimum (time/highs)"}
    solver = frame[frame["kind"] == "solver"]
    policies = frame[frame["kind"] == "policy"]
    assert solver["bound"].notna().all() and solver["solver_version"].str.startswith("highspy").all()
    assert policies["solver_version"].isna().all()
    # Each solve stores the schedules its optimum ranges over and where its bound comes from.
    assert (solver["scope"] == "contiguous").all() and solver["bound_source"].notna().all()
    assert policies["scope"].isna().all() and policies["bound_source"].isna().all()
    # Nothing beats the optimum of the time-indexed class here (no policy evicts at this M).
    best = solver.set_index("instance_key")["objective"]
    assert (policies["objective"].to_numpy() >= best[policies["instance_key"]].to_numpy() - 1e-9).all()
    # Metrics come from the replayed schedule: the objective is the run's total latency.
    assert (frame["total_latency"] == frame["objective"]).all()
    assert frame["created"].str.endswith("+00:00").all()

    second = sweep(tmp_path)
    assert (second.written, second.skipped) == (0, 6)
    assert len(load_results(tmp_path / "r.sqlite")) == 6


def test_a_schedule_that_fails_validation_never_becomes_an_ok_row(tmp_path, monkeypatch):
    def reject(instance, *args, **kwargs):
        # One pass: the simulator's core checks every batch as it is made, so that is where a failure surfaces.
        raise ScheduleError([Violation(Rule.KV_CAPACITY, "injected failure", batch=0)])

    # The package re-exports the function compare(), so reach the module through sys.modules.
    monkeypatch.setattr(sys.modules["kvsched.analysis.compare"], "simulate", reject)
    summary = sweep(tmp_path, tiny(solver=None))
    frame = load_results(tmp_path / "r.sqlite")
    assert summary.errors == len(frame) == 4
    assert (frame["status"] == "error").all() and frame["error"].str.contains("injected failure").all()
    assert frame["objective"].isna().all()


def test_an_interrupted_sweep_keeps_every_finished_cell(tmp_path, monkeypatch):
    calls = []
    real = sweep_mod.run_cell

    def interrupt_after_three(cell):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(cell.key)
        return real(cell)

    monkeypatch.setattr(sweep_mod, "run_cell", interrupt_after_three)
    with pytest.raises(KeyboardInterrupt):
        sweep(tmp_path)
    with open_db(tmp_path / "r.sqlite") as db:
        assert db.finished() == set(calls) and db.count() == 3
    monkeypatch.setattr(sweep_mod, "run_cell", real)
    rest = sweep(tmp_path)
    assert (rest.skipped, rest.written) == (3, 3)


def test_infeasible_instances_and_unrunnable_policies_are_error_rows(tmp_path):
    data = tiny(solver=None)
    data["instances"][0]["kv_capacity"] = [16, 3]  # I + O - 1 > 3 for every request
    summary = sweep(tmp_path, data)
    frame = load_results(tmp_path / "r.sqlite")
    bad = frame[frame["kv_capacity"] == 3]
    assert summary.errors == len(bad) == 4
    assert bad["error"].str.contains("KV capacity M is 3").all()
    assert (frame.loc[frame["kv_capacity"] == 16, "status"] == "ok").all()
    assert sweep(tmp_path, data).skipped == 8  # errors are results too: not retried


def test_instance_files_with_an_M_axis(tmp_path):
    data = {
        "name": "files",
        "instances": [{"file": str(EXAMPLES / "figure15.json"), "kv_capacity": [8, 28]}],
        "policies": ["vllm", "vllm-ef"],
    }
    sweep(tmp_path, data)
    frame = load_results(tmp_path / "r.sqlite").set_index(["kv_capacity", "name"])
    assert frame.loc[(8, "vllm"), "objective"] == 36 and frame.loc[(8, "vllm"), "evictions"] == 2
    assert frame.loc[(8, "vllm-ef"), "objective"] == 40
    assert (frame["n"] == 4).all()
    # With M = 28 = 4 (I + O - 1) every request runs at once: 4 slots each.
    assert frame.loc[(28, "vllm"), "evictions"] == 0 and frame.loc[(28, "vllm"), "objective"] == 16


def test_process_pool_gives_the_same_rows_as_in_process(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    sweep(a, tiny(solver=None), workers=1)
    summary = sweep(b, tiny(solver=None), workers=2)
    assert summary.written == 4 and not summary.failed
    fa = load_results(a / "r.sqlite").set_index("key")
    fb = load_results(b / "r.sqlite").set_index("key")
    assert fa.index.sort_values().equals(fb.index.sort_values())
    assert (fa["objective"] == fb.loc[fa.index, "objective"]).all()


def test_ray_backend_with_a_local_instance(tmp_path):
    pytest.importorskip("ray")
    summary = sweep(tmp_path, tiny(solver=None), backend="ray", workers=2)
    assert summary.written == 4 and not summary.failed
    frame = load_results(tmp_path / "r.sqlite")
    assert (frame["status"] == "ok").all()


def test_cli_sweep_results_and_regret(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(tiny()))
    db = tmp_path / "r.sqlite"
    assert main(["sweep", str(spec), "--db", str(db), "--workers", "1"]) == 0
    assert "6 written" in capsys.readouterr().err
    assert main(["sweep", str(spec), "--db", str(db), "--workers", "1"]) == 0
    assert "6 already done, 0 written" in capsys.readouterr().err
    out_csv = tmp_path / "r.csv"
    assert main(["results", str(db), "--to", "csv", "--out", str(out_csv)]) == 0
    rows = pd.read_csv(out_csv)
    assert len(rows) == 6 and {"rate", "mean_latency", "p99_ttft", "objective", "config"} <= set(rows.columns)
    assert main(["results", str(db)]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and "scope" in out and "bound source" in out and "contiguous" in out
    table_csv = tmp_path / "regret.csv"
    assert main(["regret", str(db), "--csv", str(table_csv)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "regret vs the solver's optimum over schedules serving each request without a break" in out
    regret = pd.read_csv(table_csv)
    assert set(regret["policy"]) == {"sarathi", "vllm-ef"} and (regret["scopes"] == "contiguous").all()


def test_a_solver_cell_has_one_deadline_from_its_start_and_policy_cells_none(tmp_path, monkeypatch):
    module = sys.modules["kvsched.analysis.compare"]
    real = module.compare
    seen = []

    def spy(*args, **kwargs):
        seen.append((kwargs.get("solver"), kwargs.get("deadline")))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "compare", spy)
    data = tiny()
    data["instances"][0]["seeds"] = 1
    sweep(tmp_path, data)
    solver = [d for s, d in seen if s is not None]
    assert len(solver) == 1 and solver[0].limit == TINY["solver"]["time_limit"]
    assert all(d is None for s, d in seen if s is None)


def test_a_solver_that_cannot_take_the_instance_is_an_error_row_before_its_policies_run(
    tmp_path, monkeypatch
):
    def never(*args, **kwargs):
        raise AssertionError("a warm-start policy ran before the formulation was checked")

    data = tiny(solver={"name": "highs", "formulation": "time", "time_limit": 10, "threads": 1})
    data["instances"][0]["time_model"] = "infermax-linear"
    data["policies"] = ["sarathi"]
    monkeypatch.setattr(sys.modules["kvsched.analysis.compare"], "simulate", never)
    rows = [sweep_mod.run_cell(c) for c in parse_spec(data).cells() if c.runner["kind"] == "solver"]
    assert rows and all(r["status"] == "error" and "unit time model" in r["error"] for r in rows)


def test_an_old_database_gains_the_scope_columns_on_open(tmp_path, capsys):
    path = tmp_path / "old.sqlite"
    old = [c for c in store_mod.COLUMNS if c not in store_mod.ADDED]
    conn = sqlite3.connect(path)
    conn.executescript(
        f"CREATE TABLE cells ({', '.join(old)}); CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT);"
        "INSERT INTO meta VALUES ('schema_version', '1');"
    )
    conn.execute(
        "INSERT INTO cells (key, instance_key, sweep, kind, name, objective_name, config, status, objective, "
        "bound, runtime) VALUES ('s', 'i', 'old', 'solver', 'optimum', 'total-latency', '{}', 'optimal', 10, "
        "10, 1.0), ('p', 'i', 'old', 'policy', 'A', 'total-latency', '{}', 'ok', 12, NULL, 0.1)"
    )
    conn.commit()
    conn.close()
    frame = load_results(path)
    assert {"scope", "bound_source"} <= set(frame.columns) and frame["scope"].isna().all()
    with open_db(path) as db:
        version = db.conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()[0]
        assert int(version) == store_mod.SCHEMA_VERSION
        db.write(_row("new", "j", "solver", "opt", "optimal", 5, bound=5, **_A))
    # An old solve's scope is unknown, never assumed.
    per = instance_regret(load_results(path), "optimum")
    assert per.loc[per["name"] == "A", "scope"].isna().all() and per["regret"].tolist() == [2.0]
    assert main(["results", str(path)]) == 0
    assert "unknown" in capsys.readouterr().out


def test_results_errors_are_one_line(tmp_path, capsys):
    assert main(["regret", str(tmp_path / "missing.sqlite")]) == 2
    assert "no such results database" in capsys.readouterr().err
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database")
    assert main(["results", str(junk)]) == 2
    assert "not an SQLite results database" in capsys.readouterr().err
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE cells (x)").connection.commit()
    assert main(["results", str(other)]) == 2
    assert "not a kvsched results database" in capsys.readouterr().err


def test_parquet_export_without_pyarrow_says_how_to_get_it(tmp_path):
    try:
        import pyarrow  # noqa: F401

        pytest.skip("pyarrow is installed")
    except ImportError:
        pass
    sweep(tmp_path, tiny(solver=None))
    with pytest.raises(InputError, match="pip install pyarrow"):
        export(tmp_path / "r.sqlite", "parquet", tmp_path / "r.parquet")


# ----------------------------------------------------------------------------- regret
def _row(key: str, inst: str, kind: str, name: str, status: str, objective: float | None, **kw: Any):
    return {
        "key": key,
        "instance_key": inst,
        "sweep": "hand",
        "kind": kind,
        "name": name,
        "n": kw.pop("n", 4),
        "kv_capacity": 8,
        "seed": 0,
        "objective_name": "total-latency",
        "config": {},
        "status": status,
        "objective": objective,
        "created": "2025-01-01T00:00:00+00:00",
        **kw,
    }


_C = {"scope": "contiguous", "bound_source": "highs"}
_A = {"scope": "all", "bound_source": "combinatorial"}


@pytest.fixture
def hand_db(tmp_path: Path) -> Path:
    """Two instances with known numbers.

    i1: optimum 10 (proven; bound 10), certified bound 8; A = 10, B = 12, C cannot run.
    i2: incumbent 20 (not proven; bound 18), certified bound 15; A = 25, B = 22, C = 30.
    """
    path = tmp_path / "hand.sqlite"
    rows = [
        _row("s1", "i1", "solver", "opt", "optimal", 10, bound=10, lower_bound=8, **_C),
        _row("a1", "i1", "policy", "A", "ok", 10, lower_bound=8),
        _row("b1", "i1", "policy", "B", "ok", 12, lower_bound=8),
        _row("c1", "i1", "policy", "C", "error", None, error="cannot run"),
        _row("s2", "i2", "solver", "opt", "feasible", 20, bound=18, lower_bound=15, n=8, **_A),
        _row("a2", "i2", "policy", "A", "ok", 25, lower_bound=15, n=8),
        _row("b2", "i2", "policy", "B", "ok", 22, lower_bound=15, n=8),
        _row("c2", "i2", "policy", "C", "ok", 30, lower_bound=15, n=8),
    ]
    with open_db(path, create=True) as db:
        for row in rows:
            db.write(row)
    return path


def test_regret_table_against_the_optimum_has_the_known_numbers(hand_db):
    t = regret_table(load_results(hand_db))
    a, b, c = t.loc["A"], t.loc["B"], t.loc["C"]
    # A: 0 % and 25 %; B: 20 % and 10 %.
    assert (a["mean_regret_pct"], a["median_regret_pct"], a["max_regret_pct"]) == (12.5, 12.5, 25.0)
    assert a["mean_regret"] == 2.5 and a["stability"] == 12.5 and a["win_rate"] == 0.5
    assert (b["mean_regret_pct"], b["max_regret_pct"], b["mean_regret"]) == (15.0, 20.0, 2.0)
    assert b["stability"] == 5.0 and b["win_rate"] == 0.5
    assert (c["instances"], c["failed"], c["mean_regret_pct"], c["win_rate"]) == (1, 1, 50.0, 0.0)
    assert list(t.index) == ["A", "B", "C"]


@pytest.mark.parametrize(
    ("against", "a_pct", "b_pct"),
    [
        ("bound", (0.0, 700 / 18), (20.0, 400 / 18)),
        ("certified", (25.0, 1000 / 15), (50.0, 700 / 15)),
        ("best-policy", (0.0, 300 / 22), (20.0, 0.0)),
    ],
)
def test_regret_against_other_references(hand_db, against, a_pct, b_pct):
    per = instance_regret(load_results(hand_db), against).set_index(["instance_key", "name"])
    for name, pcts in (("A", a_pct), ("B", b_pct)):
        for inst, want in zip(("i1", "i2"), pcts, strict=True):
            assert math.isclose(per.loc[(inst, name), "regret_pct"], want, rel_tol=1e-12)
    t = regret_table(load_results(hand_db), against)
    assert math.isclose(t.loc["A", "mean_regret_pct"], sum(a_pct) / 2, rel_tol=1e-12)


def test_regret_uses_the_same_definition_as_compare(hand_db):
    per = instance_regret(load_results(hand_db), "optimum").set_index(["instance_key", "name"])
    assert per.loc[("i2", "A"), "regret"] == 5 and not per.loc[("i2", "A"), "proven"]
    assert per.loc[("i1", "A"), "proven"]


def test_each_instance_regret_has_its_scope_and_its_interval(hand_db):
    frame = load_results(hand_db)
    per = instance_regret(frame, "optimum").set_index(["instance_key", "name"])
    # i1 proven over the contiguous class: the interval is closed; i2 not proven: [25 - 20, 25 - 18].
    assert per.loc[("i1", "B"), "scope"] == "contiguous" and per.loc[("i1", "B"), "bound_source"] == "highs"
    assert per.loc[("i1", "B"), [REGRET, MAX_REGRET_SCOPE, MAX_REGRET_ALL]].tolist() == [2, 2, 4]
    assert per.loc[("i2", "A"), "scope"] == "all"
    assert per.loc[("i2", "A"), [REGRET, MAX_REGRET_SCOPE, MAX_REGRET_ALL]].tolist() == [5, 7, 10]
    # The certified reference is over every schedule; the best policy has no scope.
    assert (instance_regret(frame, "certified")["scope"] == "all").all()
    best = instance_regret(frame, "best-policy")
    assert best["scope"].isna().all() and best.loc[best["name"] == "A", REGRET].tolist() == [0, 5]
    assert regret_table(frame).loc["A", "scopes"] == "contiguous, all"


_PARENT = """
import os, sys, time
from kvsched.analysis.sweep import make_pool

pool = make_pool(1)
print(pool.submit(os.getpid).result(), flush=True)
pool.submit(time.sleep, 120)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie has ended; only its reaper is missing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_with_a_killed_sweep():
    import signal
    import subprocess
    import time

    # stderr discarded: the killed parent's resource tracker warns about its semaphores.
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        worker = int(parent.stdout.readline())
        assert _alive(worker)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        end = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < end:
            time.sleep(0.1)
        assert not _alive(worker), "the sweep's worker outlived its parent"
    finally:
        parent.kill()


def test_a_ray_address_without_the_ray_backend_is_refused(tmp_path, capsys):
    # It was ignored: the sweep ran locally, exit 0.
    assert (
        main(["sweep", str(EXAMPLE_SPEC), "--db", str(tmp_path / "r.sqlite"), "--address", "ray://x:10001"])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--address" in err and not (tmp_path / "r.sqlite").exists()


# ----------------------------------------------------------------------------- damaged databases
def _damaged(source: Path, tmp_path: Path, sql: str, *params: Any, name: str = "bad.sqlite") -> Path:
    path = tmp_path / name
    shutil.copy(source, path)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(sql, params)
    conn.close()
    return path


def _last_key(path: Path) -> str:
    """The key of the database's last row: the damaged row, so that the error must find it."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT key FROM cells ORDER BY rowid DESC LIMIT 1").fetchone()[0]
    finally:
        conn.close()


def _one_error_line(capsys: pytest.CaptureFixture[str], *fragments: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error" not in err, err
    assert all(f in err for f in fragments), err
    return err


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("config", "xx", "column config is not valid JSON"),
        ("config", "[1]", "column config is not a JSON object (a list)"),
        ("config", '{"instance": 5}', "column config: instance is not a JSON object"),
        ("config", '{"instance": {"params": [1]}}', "column config: instance.params is not a JSON object"),
        ("metrics", "{not json", "column metrics is not valid JSON"),
        ("metrics", "[1,2,3]", "column metrics is not a JSON object (a list)"),
        ("metrics", "null", "column metrics is not a JSON object (a null)"),
        ("objective", "abc", "column objective is not a number ('abc')"),
        ("n", "many", "column n is not a number ('many')"),
        ("runtime", b"\x00\x01", "column runtime is not a number"),
    ],
)
def test_a_damaged_row_is_one_error_naming_the_database_the_row_and_the_column(
    one_instance_db, tmp_path, capsys, column, value, says
):
    # Each was an "internal error" (JSONDecodeError, AttributeError, ValueError from pandas), exit 3.
    key = _last_key(one_instance_db)
    bad = _damaged(one_instance_db, tmp_path, f"UPDATE cells SET {column} = ? WHERE key = ?", value, key)
    with pytest.raises(InputError, match=f"{bad}: row {key}: ") as info:
        load_results(bad)
    assert says in str(info.value)
    for argv in (
        ["results", str(bad)],
        ["results", str(bad), "--to", "csv", "--out", str(tmp_path / "x.csv")],
        ["regret", str(bad)],
    ):
        assert main(argv) == 2
        _one_error_line(capsys, str(bad), key, says)
    assert not (tmp_path / "x.csv").exists()


def test_plot_and_report_of_a_damaged_database_are_one_error_and_write_nothing(
    one_instance_db, tmp_path, capsys
):
    key = _last_key(one_instance_db)
    bad = _damaged(one_instance_db, tmp_path, "UPDATE cells SET metrics = '[1,2,3]' WHERE key = ?", key)
    for kind in ("load", "regret"):
        assert main(["plot", kind, str(bad), "--out", str(tmp_path / f"{kind}.png")]) == 2
        _one_error_line(capsys, str(bad), key, "column metrics")
        assert not (tmp_path / f"{kind}.png").exists()
    assert main(["report", str(bad), "--out", str(tmp_path / "rep")]) == 2
    _one_error_line(capsys, str(bad), key, "column metrics")
    assert not (tmp_path / "rep").exists()


def test_null_json_columns_still_read_as_empty(one_instance_db, tmp_path):
    # An error row has no metrics; NULL (or empty) is no data, not damage.
    key = _last_key(one_instance_db)
    path = _damaged(
        one_instance_db, tmp_path, "UPDATE cells SET metrics = NULL, config = '' WHERE key = ?", key
    )
    frame = load_results(path)
    row = frame.set_index("key").loc[key]
    assert len(frame) == 3 and pd.isna(row["mean_latency"]) and pd.isna(row["rate"])


@pytest.mark.parametrize("version", ["99", "abc", "0"])
def test_a_schema_version_this_kvsched_does_not_know_is_refused(one_instance_db, tmp_path, capsys, version):
    # It was read silently (and version 'abc' overwritten with 2 on open).
    bad = _damaged(
        one_instance_db, tmp_path, "UPDATE meta SET value = ? WHERE name = 'schema_version'", version
    )
    with pytest.raises(InputError, match=f"{bad}: results database schema_version '{version}' is not one"):
        load_results(bad)
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(tiny(solver=None)))
    assert main(["sweep", str(spec), "--db", str(bad), "--workers", "1"]) == 2  # nor written to
    _one_error_line(capsys, str(bad), f"'{version}'")
    conn = sqlite3.connect(bad)
    assert conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()[0] == version
    assert conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0] == 3
    conn.close()
    if version == "99":
        assert main(["results", str(bad)]) == 2
        _one_error_line(capsys, "written by a newer kvsched?")


def _min_policy_objective(path: Path) -> float:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT MIN(objective) FROM cells WHERE kind = 'policy'").fetchone()[0]
    finally:
        conn.close()


@pytest.mark.parametrize("against", ["certified", "optimum", "bound", "best-policy"])
def test_a_lower_bound_above_a_validated_schedule_is_refused(one_instance_db, tmp_path, capsys, against):
    # regret --against certified printed -40 % / -25 % "vs a bound valid for every schedule", exit 0.
    best = _min_policy_objective(one_instance_db)
    bad = _damaged(one_instance_db, tmp_path, "UPDATE cells SET lower_bound = ?", best + 8)
    with pytest.raises(InputError, match=f"{bad}: instance .*: lower_bound {best + 8:g} of row .* is above"):
        instance_regret(load_results(bad), against)
    assert main(["regret", str(bad), "--against", against]) == 2
    _one_error_line(capsys, str(bad), f"lower_bound {best + 8:g}", "is above the objective")


def test_a_bound_within_the_relative_tolerance_is_kept(one_instance_db, tmp_path):
    best = _min_policy_objective(one_instance_db)
    close = _damaged(one_instance_db, tmp_path, "UPDATE cells SET lower_bound = ?", best * (1 + 1e-12))
    per = instance_regret(load_results(close), "certified")
    assert per["regret"].min() == pytest.approx(0.0, abs=1e-9)


def test_a_solver_bound_is_held_to_the_schedules_of_its_scope(tmp_path):
    path = tmp_path / "scoped.sqlite"
    rows = [
        # A chunking policy may beat the contiguous optimum: a contiguous bound above it is no contradiction.
        _row("s1", "i1", "solver", "opt", "optimal", 10, bound=10, lower_bound=8, **_C),
        _row("a1", "i1", "policy", "A", "ok", 9, lower_bound=8),
        # A bound over every schedule covers the policies too.
        _row("s2", "i2", "solver", "opt", "feasible", 20, bound=19, lower_bound=15, n=8, **_A),
        _row("a2", "i2", "policy", "A", "ok", 18, lower_bound=15, n=8),
    ]
    with open_db(path, create=True) as db:
        for row in rows[:2]:
            db.write(row)
    per = instance_regret(load_results(path), "bound")
    assert per["regret"].tolist() == [-1.0]
    with open_db(path) as db:
        for row in rows[2:]:
            db.write(row)
    with pytest.raises(
        InputError, match=r"instance i2 .*: bound 19 of row s2 is above the objective 18 of row a2"
    ):
        instance_regret(load_results(path), "optimum")
    # A solver's bound above its own schedule is impossible whatever its scope.
    with open_db(path) as db:
        db.write(_row("s2", "i2", "solver", "opt", "feasible", 20, bound=21, n=8, **_C))
        db.write(_row("a2", "i2", "policy", "A", "ok", 25, lower_bound=15, n=8))
    with pytest.raises(InputError, match=r"bound 21 of row s2 is above the objective 20 of row s2"):
        regret_table(load_results(path), "optimum")


@pytest.mark.parametrize(
    ("content", "says"),
    [(b"", "not a kvsched results database (it is empty)"), (b"\x5c\xf4\x05garbage", "not an SQLite")],
)
def test_report_reads_a_sqlite_name_as_a_database(tmp_path, capsys, content, says):
    # An empty or damaged .sqlite was read as an instance: "not valid JSON" / "not UTF-8 text".
    path = tmp_path / "r.sqlite"
    path.write_bytes(content)
    assert main(["report", str(path), "--out", str(tmp_path / "rep")]) == 2
    _one_error_line(capsys, str(path), says)
    assert not (tmp_path / "rep").exists()


@pytest.mark.parametrize("after", [1.5, 6.0])  # while the workers start (import), and while they solve
def test_ctrl_c_ends_a_pool_sweep_at_once_without_tracebacks(tmp_path, after):
    # Ctrl-C reaches every process of the group: workers still importing printed KeyboardInterrupt
    # tracebacks, and the sweep waited for (once hung on) the cells in flight. Now the workers ignore it,
    # the sweep ends them, and the finished cells stay in the database.
    import signal
    import subprocess
    import time

    spec = Path(sweep_mod.__file__).parent / "examples" / "small.yaml"
    db = tmp_path / "r.sqlite"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvsched.cli", "sweep", str(spec), "--db", str(db), "--workers", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's: the signal goes to all of it
    )
    time.sleep(after)
    os.killpg(proc.pid, signal.SIGINT)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=60)
    # 130, or killed by the SIGINT itself when it lands while Python starts or ends (how a shell expects a
    # Ctrl-C'd program to end; it reports both as 130).
    assert proc.returncode in (130, -signal.SIGINT) and "Traceback" not in err, err
    assert time.monotonic() - sent < 5
    left = None
    for _ in range(50):  # no worker left behind (terminated, they may take a moment to go)
        left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
        if not left:
            break
        time.sleep(0.1)
    assert not left


def test_the_makespan_regret_percent_counts_from_the_first_arrival(tmp_path):
    # A makespan is an absolute time: on an instance whose first request arrives at 50,000 s, 50,010 against
    # the optimum's 50,009 is 11% worse, not 0.002%. The first arrival is read off the rows' metrics
    # (the makespan less the serving duration, which runs from it).
    def metrics(makespan: float) -> dict:
        return {"makespan": makespan, "duration": makespan - 50_000.0}

    path = tmp_path / "makespan.sqlite"
    mk = {"objective_name": "makespan"}
    rows = [
        _row(
            "s",
            "i",
            "solver",
            "opt",
            "optimal",
            50_009.0,
            bound=50_009.0,
            metrics=metrics(50_009.0),
            **mk,
            **_A,
        ),
        _row("a", "i", "policy", "A", "ok", 50_010.0, metrics=metrics(50_010.0), **mk),
    ]
    with open_db(path, create=True) as db:
        for row in rows:
            db.write(row)
    per = instance_regret(load_results(path), "optimum").set_index("name")
    assert per.at["A", "regret_pct"] == pytest.approx(100 / 9)
