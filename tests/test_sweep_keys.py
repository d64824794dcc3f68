"""What a sweep cell's key identifies: the work (file contents, runner, settings), not where it was run from.

The same spec run from two folders and by an absolute path is one set of cells; an edited ``FILE.py:CLASS``
policy reruns its cells and replaces their rows; ``--sweep NAME`` gives every cell the sweep covers, those an
earlier sweep wrote too; a database of schema version 2 (keys with paths) is read, migrated and resumed
without counting an instance twice.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from kvsched.analysis import store as store_mod
from kvsched.analysis.regret import regret_table
from kvsched.analysis.spec import config_hash, parse_spec
from kvsched.analysis.store import load_results, open_db
from kvsched.analysis.sweep import run_sweep
from kvsched.cli import main
from kvsched.errors import InputError
from tests.test_examples import EXAMPLES
from tests.test_heuristics_own import POLICY_FILE
from tests.test_sweep import tiny

#: POLICY_FILE run longest-waiting-last instead of first: another schedule of figure15.
EDITED_POLICY_FILE = POLICY_FILE.replace("r = int(active[0])", "r = int(active[-1])")
MINE = {"name": "own/mine.py:Serial", "label": "mine"}


def _project(root: Path, spec: dict[str, Any], name: str = "r.yaml") -> Path:
    """``root/s/`` holding the spec, figure15.json and own/mine.py; returns the spec's path."""
    folder = root / "s"
    (folder / "own").mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLES / "figure15.json", folder / "figure15.json")
    (folder / "own" / "mine.py").write_text(POLICY_FILE)
    (folder / name).write_text(yaml.safe_dump(spec))
    return folder / name


def _sweep_line(capsys: pytest.CaptureFixture[str]) -> str:
    return next(line for line in capsys.readouterr().err.splitlines() if line.startswith("sweep "))


def _rows(db: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT key, instance_key, name, sweep FROM cells ORDER BY rowid").fetchall()
    finally:
        conn.close()


# ----------------------------------------------------------------------------- one cell, wherever it runs
def test_one_spec_run_from_two_folders_and_by_an_absolute_path_writes_each_cell_once(
    tmp_path, monkeypatch, capsys
):
    # Each spelling of the spec's path was a new key per cell: 3 rows per cell, "instances 3" for one file.
    spec = {"name": "r", "instances": [{"file": ["figure15.json"]}], "policies": ["sarathi", MINE]}
    path = _project(tmp_path, spec)
    db = tmp_path / "r.sqlite"
    monkeypatch.chdir(path.parent)
    assert main(["sweep", "r.yaml", "--db", "../r.sqlite", "--workers", "1", "--no-progress"]) == 0
    assert "2 cells, 0 already done, 2 written" in _sweep_line(capsys)
    monkeypatch.chdir(tmp_path)
    for spelt in ("s/r.yaml", str(path), "./s/../s/r.yaml"):
        assert main(["sweep", spelt, "--db", "r.sqlite", "--workers", "1", "--no-progress"]) == 0
        assert "2 cells, 2 already done, 0 written" in _sweep_line(capsys)
    rows = _rows(db)
    assert len(rows) == 2 and len({instance for _, instance, _, _ in rows}) == 1
    # The row names the file by its absolute path (provenance); the key does not hold it.
    config = json.loads(load_results(db).set_index("name").loc["sarathi", "config"])
    assert config["instance"]["file"] == str(path.parent / "figure15.json")
    table = regret_table(load_results(db), "best-policy")
    assert table["instances"].tolist() == [1, 1]


def test_generator_cells_keep_the_keys_they_had():
    # A database written before file contents were keyed holds these cells: they must not run again.
    for cell in parse_spec(tiny()).cells():
        assert cell.key == config_hash(
            {"instance": cell.instance, "objective": cell.objective, "runner": cell.runner}
        )
        assert cell.instance_key == config_hash(cell.instance)


def test_a_length_mean_makes_new_cells_since_it_counts_the_lengths_drawn():
    # prompt_mean=3000 gave lengths of mean 2121 (the clip ignored); it now gives 3000, another instance, so
    # the same parameters must not find the old cells. Cells without a mean keep their keys (above).
    data = tiny()
    data["instances"][0]["params"] = {"prompt_mean": [20]}
    for cell in parse_spec(data).cells():
        assert cell.instance["means"] == "of the lengths drawn"
        old = {k: v for k, v in cell.instance.items() if k != "means"}
        assert cell.instance_key != config_hash(old)


# ----------------------------------------------------------------------------- an edited policy file
def test_editing_a_policy_file_reruns_its_cells_and_replaces_their_rows(tmp_path):
    # The key held only the policy's path: an edited file's rerun said "already done" and kept the old number.
    data = tiny(solver=None, policies=["sarathi", MINE])
    data["instances"][0]["seeds"] = 1
    data["instances"].append({"file": ["figure15.json"]})
    path = _project(tmp_path, data)
    spec = parse_spec(data, base=path.parent)
    db = tmp_path / "r.sqlite"
    first = run_sweep(spec, db, base=path.parent, workers=1, progress=False)
    assert (first.total, first.written) == (4, 4)
    before = load_results(db).set_index(["name", "instance_key"])["objective"]

    (path.parent / "own" / "mine.py").write_text(EDITED_POLICY_FILE)
    spec = parse_spec(data, base=path.parent)
    again = run_sweep(spec, db, base=path.parent, workers=1, progress=False)
    assert (again.skipped, again.written) == (2, 2)  # the two cells of mine, not sarathi's
    after = load_results(db)
    assert len(after) == 4  # replaced, not added: one number per label and instance
    fresh = tmp_path / "fresh.sqlite"
    run_sweep(spec, fresh, base=path.parent, workers=1, progress=False)
    fresh_objectives = load_results(fresh).set_index(["name", "instance_key"])["objective"]
    pd.testing.assert_series_equal(
        after.set_index(["name", "instance_key"])["objective"].sort_index(), fresh_objectives.sort_index()
    )
    assert after.set_index(["name", "instance_key"])["objective"].loc["sarathi"].equals(before.loc["sarathi"])
    assert not before.loc["mine"].equals(fresh_objectives.loc["mine"])  # the edit changes a schedule
    # The sweep still covers its cells (the replaced keys moved to the new rows).
    assert len(load_results(db, sweep=spec.name)) == 4
    assert run_sweep(spec, db, base=path.parent, workers=1, progress=False).skipped == 4


# ----------------------------------------------------------------------------- --sweep NAME
def test_sweep_filter_gives_the_cells_shared_with_an_earlier_sweep(tmp_path, capsys):
    # They kept the first sweep's name: --sweep b kept vllm-ef alone, compared with itself as best policy.
    block = {"file": [str(EXAMPLES / "figure15.json")], "kv_capacity": [8, 28]}
    db = tmp_path / "r.sqlite"
    for name, policies in (("a", ["sarathi", "vllm"]), ("b", ["sarathi", "vllm", "vllm-ef"])):
        run_sweep(
            parse_spec({"name": name, "instances": [block], "policies": policies}),
            db,
            workers=1,
            progress=False,
        )
    frame = load_results(db)
    assert len(frame) == 6 and (frame["sweep"] == "b").sum() == 2  # the column names the writer only
    assert len(load_results(db, sweep="b")) == 6 and len(load_results(db, sweep="a")) == 4
    out = tmp_path / "b.csv"
    assert main(["regret", str(db), "--sweep", "b", "--against", "best-policy", "--csv", str(out)]) == 0
    table = pd.read_csv(out, index_col=0)
    assert sorted(table.index) == ["sarathi", "vllm", "vllm-ef"] and (table["instances"] == 2).all()
    assert main(["regret", str(db), "--sweep", "a", "--against", "best-policy", "--csv", str(out)]) == 0
    assert sorted(pd.read_csv(out, index_col=0).index) == ["sarathi", "vllm"]
    assert main(["regret", str(db), "--sweep", "nope"]) == 2
    assert "no rows of sweep 'nope'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- a version-2 database
def _old_config(config: dict[str, Any], file: str, policy_folder: str) -> dict[str, Any]:
    """``config`` as kvsched wrote it at schema version 2: paths as spelt, policy files not hashed."""
    old = json.loads(json.dumps(config))
    if "file" in old["instance"]:
        old["instance"]["file"] = file
    runner = old["runner"]
    if runner.pop("files", None) is not None:
        runner["policy"] = f"{policy_folder}/mine.py:Serial"
    return old


def _downgrade(db: Path, spellings: list[tuple[str, str, str]]) -> None:
    """Make ``db`` a version-2 database of the same cells, run once per (sweep, file, policy folder).

    Keys as version 2 computed them: a hash of the configuration with the paths in it.
    """
    conn = sqlite3.connect(db)
    with conn:
        rows = conn.execute(f"SELECT {', '.join(store_mod.COLUMNS)} FROM cells").fetchall()
        conn.execute("DELETE FROM cells")
        for sweep, file, folder in spellings:
            for values in rows:
                row = dict(zip(store_mod.COLUMNS, values, strict=True))
                config = _old_config(json.loads(row["config"]), file, folder)
                if config == json.loads(row["config"]) and sweep != spellings[0][0]:
                    continue  # a generator cell of a registered policy: one key, the later run skipped it
                row.update(
                    sweep=sweep,
                    config=json.dumps(config),
                    key=config_hash(config),
                    instance_key=config_hash(config["instance"]),
                )
                marks = ", ".join("?" * len(row))
                conn.execute(
                    f"INSERT OR REPLACE INTO cells ({', '.join(row)}) VALUES ({marks})", list(row.values())
                )
        conn.execute("DROP TABLE sweep_cells")
        conn.execute("UPDATE meta SET value = '2' WHERE name = 'schema_version'")
    conn.close()


def test_a_version_2_database_is_read_migrated_and_resumed_without_counting_an_instance_twice(tmp_path):
    data = tiny(solver=None, policies=["sarathi", MINE], name="keys")
    data["instances"][0]["seeds"] = 1
    data["instances"].append({"file": ["figure15.json"]})
    path = _project(tmp_path, data)
    spec = parse_spec(data, base=path.parent)
    db = tmp_path / "r.sqlite"
    run_sweep(spec, db, base=path.parent, workers=1, progress=False)
    new_keys = {key for key, *_ in _rows(db)}
    expected = load_results(db).set_index(["name", "n"])["objective"].sort_index()
    # Run once from s/ (sweep old1) and once from its parent (old2), as version 2 stored them.
    _downgrade(db, [("old1", "figure15.json", "own"), ("old2", "s/figure15.json", "s/own")])
    old = _rows(db)
    assert len(old) == 7 and len({instance for _, instance, _, _ in old}) == 3  # the file counted twice

    # Read-only, it cannot be migrated: one line saying so (its keys with paths would count the file twice).
    read_only = tmp_path / "ro.sqlite"
    shutil.copy(db, read_only)
    connect = sqlite3.connect
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            store_mod.sqlite3,
            "connect",
            lambda path, *a, **kw: connect(f"file:{Path(path).resolve()}?mode=ro", *a, uri=True, **kw),
        )
        with pytest.raises(InputError, match=r"ro.sqlite: cannot write \(read-only\), needed to update"):
            load_results(read_only)

    frame = load_results(db)  # migrates
    with open_db(db) as opened:
        version = opened.conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()[0]
        assert int(version) == store_mod.SCHEMA_VERSION == 3
        # A sweep covers the rows it wrote (its second run skipped sarathi's generator cell, and version 2
        # did not record that), and the rows merged into them.
        assert opened.sweep_keys("old1") == set(frame["key"])
        assert opened.sweep_keys("old2") == set(
            frame.loc[(frame["name"] == "mine") | frame["generator"].isna(), "key"]
        )
    assert len(frame) == 4 and frame["instance_key"].nunique() == 2
    assert frame.groupby("name").size().to_dict() == {"mine": 2, "sarathi": 2}
    # Nothing computed is lost: the same numbers, and sarathi's cells are found by a rerun.
    pd.testing.assert_series_equal(frame.set_index(["name", "n"])["objective"].sort_index(), expected)
    assert set(frame.loc[frame["name"] == "sarathi", "key"]) <= new_keys
    table = regret_table(frame, "best-policy")
    assert table["instances"].to_dict() == {"mine": 2, "sarathi": 2}

    # The policy file's old rows never hashed it: its cells run once more, and replace them.
    rerun = run_sweep(spec, db, base=path.parent, workers=1, progress=False)
    assert (rerun.skipped, rerun.written) == (2, 2)
    after = load_results(db)
    assert len(after) == 4 and set(after["key"]) == new_keys
    assert regret_table(after, "best-policy")["instances"].to_dict() == {"mine": 2, "sarathi": 2}
    assert len(load_results(db, sweep="old1")) == len(load_results(db, sweep="keys")) == 4
    assert run_sweep(spec, db, base=path.parent, workers=1, progress=False).skipped == 4
