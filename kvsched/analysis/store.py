"""The results database: one SQLite row per finished cell.

Plain :mod:`sqlite3`, one file, no server. Each row is committed on its own,
so an interrupted sweep keeps every cell it finished, and a rerun skips the
keys already present. :func:`load_results` reads the table into pandas with the
configuration and the run metrics spread into columns; :func:`export` writes
that frame as CSV or Parquet.

Schema (table ``cells``; see ``docs/analysis.md``)::

    key TEXT PRIMARY KEY      hash of what the cell computes (kvsched.analysis.spec.cell_identity)
    instance_key TEXT         hash of the instance's identity (rows to compare)
    sweep TEXT                name of the spec that wrote the row (see sweep_cells)
    kind TEXT                 'policy' or 'solver'
    name TEXT                 policy label, or 'optimum (formulation/solver)'
    generator TEXT            generator kind (NULL for instance files)
    n INTEGER, seed INTEGER, kv_capacity INTEGER
    objective_name TEXT       total-latency, makespan or sum-ttft
    config TEXT               JSON: {instance, objective, runner}
    status TEXT               'ok' or 'error' (policy); optimal/feasible/... or 'error' (solver)
    error TEXT                the one-line reason when status is 'error'
    objective REAL            the schedule's objective, measured by replay
    bound REAL                the solver's proven bound over its scope
    lower_bound REAL          a bound valid for every legal schedule
    scope TEXT                the schedules the solver's optimum and bound range over:
                              all, no-eviction or contiguous (kvsched.csp.Scope; solver rows)
    bound_source TEXT         where the solver's bound comes from (a back end, or a relaxation)
    gap REAL                  the solver's relative gap
    runtime REAL              seconds (simulation, or solve)
    metrics TEXT              JSON: kvsched.schedule.metrics.RunMetrics
    anytime TEXT              JSON: [[time, incumbent, bound], ...] (solver)
    kvsched_version TEXT, solver_version TEXT
    created TEXT              UTC timestamp (ISO 8601)

Table ``sweep_cells`` (``sweep``, ``key``) says which cells each sweep covers:
a sweep writes a line for every cell of its spec, the ones it finds already
done included, so ``--sweep NAME`` gives all of them (the ``sweep`` column only
names the sweep that wrote the row).

Opening a database written by an older kvsched brings it to
:data:`SCHEMA_VERSION` in one transaction (:func:`_migrate`): it adds the
columns it lacks (:data:`ADDED`; NULL in its old rows: scope unknown, never
assumed), fills ``sweep_cells`` from the rows' ``sweep`` column, re-keys the
rows of instance files by their content (version 3; see
:func:`kvsched.analysis.spec.cell_identity`) and records the new
``schema_version`` in table ``meta``.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from kvsched.errors import InputError

#: 3: cells of instance files keyed by content, and table sweep_cells (see the module docstring).
SCHEMA_VERSION = 3
#: Columns added after schema version 1, by the version that added them (added on open, NULL in old rows).
ADDED: dict[str, int] = {"scope": 2, "bound_source": 2}
COLUMNS: tuple[str, ...] = (
    "key",
    "instance_key",
    "sweep",
    "kind",
    "name",
    "generator",
    "n",
    "seed",
    "kv_capacity",
    "objective_name",
    "config",
    "status",
    "error",
    "objective",
    "bound",
    "lower_bound",
    "scope",
    "bound_source",
    "gap",
    "runtime",
    "metrics",
    "anytime",
    "kvsched_version",
    "solver_version",
    "created",
)
_TYPES = {
    "key": "TEXT PRIMARY KEY",
    "n": "INTEGER",
    "seed": "INTEGER",
    "kv_capacity": "INTEGER",
    "objective": "REAL",
    "bound": "REAL",
    "lower_bound": "REAL",
    "gap": "REAL",
    "runtime": "REAL",
}
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS cells (" + ", ".join(f"{c} {_TYPES.get(c, 'TEXT')}" for c in COLUMNS) + ");\n"
    "CREATE INDEX IF NOT EXISTS cells_instance ON cells (instance_key);\n"
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT);\n"
    "CREATE TABLE IF NOT EXISTS sweep_cells (\n"
    "    sweep TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (sweep, key));\n"
    "CREATE INDEX IF NOT EXISTS sweep_cells_key ON sweep_cells (key);\n"
)
_SQLITE_MAGIC = b"SQLite format 3\x00"


def is_database(path: str | Path) -> bool:
    """Whether ``path`` is an SQLite file (by its header)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
    except OSError:
        return False


#: File names that are results databases whatever their content (kvsched sweep writes results.sqlite).
DB_SUFFIXES = (".sqlite", ".sqlite3", ".db")


def names_database(path: str | Path) -> bool:
    """Whether ``path`` is meant as a results database: an SQLite header, or a database's suffix.

    A command taking an instance or a database decides by this, so that an empty or damaged
    ``.sqlite`` gets the database's own error, not an instance reader's ("not valid JSON").
    """
    return is_database(path) or Path(path).suffix.lower() in DB_SUFFIXES


class ResultsDB:
    """An open results database. Use :func:`open_db`."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path

    def finished(self) -> set[str]:
        """Keys of every stored cell."""
        return {k for (k,) in self.conn.execute("SELECT key FROM cells")}

    def write(self, row: Mapping[str, Any]) -> None:
        """Insert (or replace) one row, record it as a cell of its sweep, and commit.

        A row of a ``FILE.py:CLASS`` policy whose file was hashed replaces the rows of an earlier content
        of that file (:func:`_superseded`): the same label on the same instance, one number, the latest.
        """
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise ValueError(f"unknown result columns: {sorted(unknown)}")
        values = [_to_sql(row.get(c)) for c in COLUMNS]
        marks = ", ".join("?" * len(COLUMNS))
        with self.conn:  # commits, so Ctrl-C loses nothing already written
            self.conn.execute(f"INSERT OR REPLACE INTO cells ({', '.join(COLUMNS)}) VALUES ({marks})", values)
            if row.get("sweep") is not None:
                self.conn.execute(
                    "INSERT OR IGNORE INTO sweep_cells (sweep, key) VALUES (?, ?)", (row["sweep"], row["key"])
                )
            for old in _superseded(self.conn, row):
                _drop(self.conn, old, str(row["key"]))

    def add_to_sweep(self, sweep: str, keys: Iterable[str]) -> None:
        """Record ``keys`` as cells of ``sweep`` (those already stored and those about to run); commit."""
        with self.conn:
            self.conn.executemany(
                "INSERT OR IGNORE INTO sweep_cells (sweep, key) VALUES (?, ?)", ((sweep, k) for k in keys)
            )

    def sweep_keys(self, sweep: str) -> set[str]:
        """Keys of the stored cells ``sweep`` covers (written by it, or by another sweep before it)."""
        query = "SELECT s.key FROM sweep_cells s JOIN cells c ON c.key = s.key WHERE s.sweep = ?"
        return {k for (k,) in self.conn.execute(query, (sweep,))}

    def count(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0])

    def raw_frame(self) -> pd.DataFrame:
        """The ``cells`` table as stored (JSON columns as text)."""
        return pd.read_sql_query(f"SELECT {', '.join(COLUMNS)} FROM cells ORDER BY rowid", self.conn)


def _to_sql(value: Any) -> Any:
    if isinstance(value, dict | list | tuple):
        return json.dumps(value)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return value


@contextmanager
def open_db(path: str | Path, *, create: bool = False) -> Iterator[ResultsDB]:
    """Open a results database (``create=True`` makes a new one when it is missing).

    Raises :class:`InputError` (one line) for a missing file when not creating,
    or a file that is not a kvsched results database: another program's SQLite
    database, or (when not creating) an empty one. Neither is written to.
    """
    path = Path(path)
    if not path.exists() and not create:
        raise InputError(f"{path}: no such results database")
    if path.exists() and path.stat().st_size and not is_database(path):
        raise InputError(f"{path}: not an SQLite results database")
    try:
        conn = sqlite3.connect(path, timeout=30)
    except sqlite3.Error as exc:
        raise InputError(f"{path}: cannot open ({exc})") from None
    try:
        try:
            # Before the schema is written: opening another program's database (or an empty file) to
            # read must not leave kvsched's tables in it, nor a sweep write its rows there.
            tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            if "cells" not in tables and (tables or not create):
                other = f"its tables: {', '.join(sorted(tables)[:5])}" if tables else "it is empty"
                raise InputError(f"{path}: not a kvsched results database ({other})")
            if "meta" in tables:
                _check_version(conn, path)
            conn.executescript(_SCHEMA)
            cols = {r[1] for r in conn.execute("PRAGMA table_info(cells)")}
            if not set(COLUMNS) - set(ADDED) <= cols:
                raise InputError(
                    f"{path}: not a kvsched results database (table cells lacks kvsched's columns)"
                )
            _migrate(conn, cols)
        except sqlite3.Error as exc:
            if "readonly" in str(exc):
                # A results database of an older schema that cannot be brought up to date here.
                raise InputError(f"{path}: cannot write (read-only), needed to update its schema") from None
            raise InputError(f"{path}: not a kvsched results database ({exc})") from None
        yield ResultsDB(conn, path)
    finally:
        conn.close()


def _check_version(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a database whose recorded ``schema_version`` this kvsched does not know.

    A newer layout may give a column another meaning, so reading it as ours could report
    wrong numbers, and migrating it would write our version over its own. No record (a
    database from before versions were kept) is version 1, migrated as usual.
    """
    row = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
    if row is None:
        return
    text = str(row[0]).strip()
    version = int(text) if text.isdigit() else None
    if version is not None and 1 <= version <= SCHEMA_VERSION:
        return
    newer = ": written by a newer kvsched?" if version is None or version > SCHEMA_VERSION else ""
    raise InputError(
        f"{path}: results database schema_version {row[0]!r} is not one this kvsched reads "
        f"(1 to {SCHEMA_VERSION}){newer}"
    )


def _migrate(conn: sqlite3.Connection, cols: set[str]) -> None:
    """Bring a database to :data:`SCHEMA_VERSION`: add the columns it lacks, fill ``sweep_cells`` and re-key
    the rows of instance files (from version 2 or older), record the version; all in one transaction."""
    for name in ADDED:
        if name not in cols:
            try:
                conn.execute(f"ALTER TABLE cells ADD COLUMN {name} {_TYPES.get(name, 'TEXT')}")
            except sqlite3.OperationalError as exc:  # another process opening it added it first
                if "duplicate column" not in str(exc):
                    raise
    if _version(conn) >= SCHEMA_VERSION:
        # Nothing to record: a write here would make a valid read-only database unreadable.
        return
    conn.commit()
    # IMMEDIATE: a second process opening the same old database waits, then finds it migrated.
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = _version(conn)
        if current < 3:
            # The sweeps' names as the rows knew them, before re-keying moves or merges those rows.
            conn.execute(
                "INSERT OR IGNORE INTO sweep_cells (sweep, key) "
                "SELECT sweep, key FROM cells WHERE sweep IS NOT NULL"
            )
            _rekey_files(conn)
            _merge_unhashed_policy_files(conn)
        if current < SCHEMA_VERSION:
            conn.execute(
                "INSERT INTO meta (name, value) VALUES ('schema_version', ?) "
                "ON CONFLICT(name) DO UPDATE SET value = excluded.value WHERE CAST(value AS INTEGER) < ?",
                (str(SCHEMA_VERSION), SCHEMA_VERSION),
            )
        conn.commit()
    except BaseException:
        conn.rollback()
        raise


def _version(conn: sqlite3.Connection) -> int:
    """The recorded ``schema_version`` (1 when none is: a database from before versions were kept)."""
    row = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
    try:
        return int(row[0]) if row is not None else 1
    except (TypeError, ValueError):
        return 1


def _config(text: Any) -> dict[str, Any] | None:
    """A row's ``config`` as an object, or None for one that is not (the reader names the damage later)."""
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _drop(conn: sqlite3.Connection, key: str, into: str) -> None:
    """Delete row ``key``, whose work row ``into`` now stands for: its sweeps now cover ``into``."""
    conn.execute("DELETE FROM cells WHERE key = ?", (key,))
    conn.execute("UPDATE OR IGNORE sweep_cells SET key = ? WHERE key = ?", (into, key))
    conn.execute("DELETE FROM sweep_cells WHERE key = ?", (key,))


def _rekey_files(conn: sqlite3.Connection) -> None:
    """Give each row of an instance file the key it has now (its content, not its path: version 3).

    Before, one cell run from two folders (or by an absolute path) was stored once per spelling. Those
    rows get the same key: the latest written is kept (one computation, one row), and the sweeps of the
    others now cover it. Rows of other instances keep their keys (they were already by content).
    """
    from kvsched.analysis.spec import cell_keys

    rows = conn.execute("SELECT rowid, key, instance_key, config FROM cells").fetchall()
    holder = {key: rowid for rowid, key, _, _ in rows}
    old_key = {rowid: key for rowid, key, _, _ in rows}
    # Only a file instance's config holds "sha": the other rows (most of a large database) are not decoded.
    rows = [r for r in rows if isinstance(r[3], str) and '"sha"' in r[3]]
    target: dict[int, tuple[str, str]] = {}
    for rowid, key, instance_key, text in rows:
        config = _config(text)
        instance = config.get("instance") if config else None
        if not (isinstance(instance, dict) and "file" in instance and "sha" in instance):
            continue
        keys = cell_keys(config)
        if keys is not None and keys != (key, instance_key):
            target[rowid] = keys
    groups: dict[str, list[int]] = defaultdict(list)
    for rowid, (key, _) in target.items():
        groups[key].append(rowid)
    winners: dict[int, tuple[str, str]] = {}
    for key, rowids in groups.items():
        if key in holder and holder[key] not in target:  # a row already holding the key competes too
            rowids.append(holder[key])
        keep = max(rowids)  # the latest written
        for rowid in rowids:
            if rowid != keep:
                _drop(conn, old_key[rowid], key)
        if keep in target:
            winners[keep] = target[keep]
    # Two steps, so that no new key collides with an old key another row is about to leave.
    for rowid in winners:
        conn.execute("UPDATE cells SET key = ? WHERE rowid = ?", (f"migrating {rowid}", rowid))
    for rowid, (key, instance_key) in winners.items():
        conn.execute("UPDATE cells SET key = ?, instance_key = ? WHERE rowid = ?", (key, instance_key, rowid))
        conn.execute("UPDATE OR IGNORE sweep_cells SET key = ? WHERE key = ?", (key, old_key[rowid]))
        conn.execute("DELETE FROM sweep_cells WHERE key = ?", (old_key[rowid],))


def _own_policy(config: Any) -> tuple[str, str, str, bool] | None:
    """``(file, class, params, hashed)`` of a ``FILE.py:CLASS`` policy cell's runner, else None.

    ``hashed``: the runner has its file's content hash (``files``), as every row since version 3 has.
    """
    runner = config.get("runner") if isinstance(config, dict) else None
    if (
        not isinstance(runner, dict)
        or runner.get("kind") != "policy"
        or not isinstance(runner.get("policy"), str)
    ):
        return None
    from kvsched.heuristics.own import is_file_ref

    if not is_file_ref(runner["policy"]):
        return None
    path, _, name = runner["policy"].rpartition(":")
    params = json.dumps(runner.get("params"), sort_keys=True, default=str)
    return path, name, params, isinstance(runner.get("files"), dict) and path in runner["files"]


def _superseded(conn: sqlite3.Connection, row: Mapping[str, Any]) -> list[str]:
    """Keys of the rows a new ``FILE.py:CLASS`` policy row replaces.

    Same instance, objective, label, class and parameters, another key: the row of an earlier content of
    the same file (by its absolute path), or an old row that never hashed its file (whose path was relative
    to a folder no longer known). The label is what every table and figure shows: two numbers under it on
    one instance would count the instance twice, one of them computed by code that no longer exists.
    """
    own = _own_policy(_config(row.get("config")))
    if own is None or not own[3]:
        return []
    found = conn.execute(
        "SELECT key, config FROM cells WHERE instance_key = ? AND objective_name = ? AND kind = 'policy' "
        "AND name = ? AND key != ?",
        (row.get("instance_key"), row.get("objective_name"), row.get("name"), row.get("key")),
    )
    out = []
    for key, text in found:
        other = _own_policy(_config(text))
        if other is not None and other[1:3] == own[1:3] and (not other[3] or other[0] == own[0]):
            out.append(key)
    return out


def _merge_unhashed_policy_files(conn: sqlite3.Connection) -> None:
    """Keep one row per instance, objective, label, class and parameters of an un-hashed ``FILE.py:CLASS``.

    Before version 3 such a policy's key held its path as spelt from the working directory, so one cell run
    from two folders is two rows under one label; the latest written is kept (as :func:`_superseded` keeps
    the latest), and a rerun of its sweep replaces it by a row keyed on the file's content.
    """
    rows = conn.execute(
        # (a FILE.py:CLASS runner's config holds ".py:"; the registered policies' rows are not decoded)
        "SELECT rowid, key, instance_key, objective_name, name, config FROM cells WHERE kind = 'policy' "
        "AND instr(config, '.py:') > 0 ORDER BY rowid DESC"
    ).fetchall()
    kept: dict[tuple[Any, ...], str] = {}
    for _, key, instance_key, objective, name, text in rows:
        own = _own_policy(_config(text))
        if own is None or own[3]:
            continue
        slot = (instance_key, objective, name, own[1], own[2])
        if slot in kept:
            _drop(conn, key, kept[slot])
        else:
            kept[slot] = key


#: The INTEGER and REAL columns: SQLite stores any value in any column, so a hand-edited row may hold text.
_NUMERIC: tuple[str, ...] = tuple(c for c, t in _TYPES.items() if t in ("INTEGER", "REAL"))


def _check_numbers(db: ResultsDB, frame: pd.DataFrame) -> None:
    """Refuse a row whose numeric column holds text or bytes: one line naming the row and the column.

    pandas gives such a column a non-numeric dtype (object, or str under pandas 3), so only those
    columns are looked at (a column of NULLs is one too), and SQLite finds the first offending row
    in one scan per column.
    """
    for column in _NUMERIC:
        if pd.api.types.is_numeric_dtype(frame[column]):
            continue
        bad = db.conn.execute(
            f"SELECT key, {column} FROM cells WHERE typeof({column}) NOT IN ('integer', 'real', 'null') "
            "ORDER BY rowid LIMIT 1"
        ).fetchone()
        if bad is not None:
            raise InputError(f"{db.path}: row {bad[0]}: column {column} is not a number ({bad[1]!r:.60})")


def _decode(value: Any) -> Any:
    """One JSON cell: NULL or empty text is an empty object (rows that have none, e.g. error rows)."""
    # pandas reads NULL in a text column as None, or as NaN under pandas 3's str dtype.
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return {}
    return json.loads(value)


def _json_objects(frame: pd.DataFrame, column: str, path: Path) -> list[dict[str, Any]]:
    """The JSON objects of ``column``, one per row; anything else is one line naming the row.

    Decoded in one pass; only when that fails (or gives a non-object) are the rows walked
    again to name the first bad one, so a large good database pays nothing extra.
    """
    values = frame[column].tolist()
    try:
        records = [_decode(v) for v in values]
        if all(type(r) is dict for r in records):
            return records
    except (TypeError, ValueError):  # JSONDecodeError is a ValueError; TypeError: not text (a number)
        pass
    for key, value in zip(frame["key"], values, strict=True):
        try:
            record = _decode(value)
        except (TypeError, ValueError) as exc:
            reason = "not JSON text" if isinstance(exc, TypeError) else f"not valid JSON: {exc}"
            raise InputError(f"{path}: row {key}: column {column} is {reason}") from None
        if type(record) is not dict:
            got = type(record).__name__ if record is not None else "null"
            raise InputError(f"{path}: row {key}: column {column} is not a JSON object (a {got})")
    raise AssertionError("a failed decode found no bad row")  # pragma: no cover


def _instance_params(frame: pd.DataFrame, configs: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    """``config.instance.params`` of each row ({} where absent); a non-object is one line naming the row."""
    params = []
    for key, config in zip(frame["key"], configs, strict=True):
        instance = config.get("instance", {})
        value = instance.get("params", {}) if type(instance) is dict else None
        if type(value) is not dict:
            field = "instance.params" if type(instance) is dict else "instance"
            raise InputError(f"{path}: row {key}: column config: {field} is not a JSON object")
        params.append(value)
    return params


def load_results(path: str | Path, *, sweep: str | None = None) -> pd.DataFrame:
    """Every row of a results database (or every cell of ``sweep``, shared or not), for pandas.

    The stored columns, plus: the generator parameters of each instance (e.g.
    ``rate``, ``predict_sigma``, ``groups``) and every run metric (e.g.
    ``mean_latency``, ``p99_ttft``, ``evictions``) as their own columns. A name
    that would clash with a stored column gets a ``param_`` or ``metric_``
    prefix. JSON columns ``config``, ``metrics`` and ``anytime`` stay as text.

    Raises :class:`InputError` (one line naming the database, the row's key and
    the column) for a row whose ``config`` or ``metrics`` is not a JSON object,
    or whose numeric column holds text. ``frame.attrs["source"]`` is the
    database's path, for later errors to name it.
    """
    path = Path(path)
    with open_db(path) as db:
        frame = db.raw_frame()
        if not frame.empty:
            _check_numbers(db, frame)
        if sweep is not None:
            frame = frame[frame["key"].isin(db.sweep_keys(sweep))].reset_index(drop=True)
    frame.attrs["source"] = str(path)
    if frame.empty:
        return frame
    params = pd.DataFrame.from_records(
        _instance_params(frame, _json_objects(frame, "config", path), path), index=frame.index
    )
    metrics = pd.DataFrame.from_records(_json_objects(frame, "metrics", path), index=frame.index)
    out = [frame]
    taken = set(frame.columns)
    for extra, prefix in ((params, "param_"), (metrics, "metric_")):
        renamed = extra.rename(columns={c: prefix + c for c in extra.columns if c in taken})
        taken |= set(renamed.columns)
        out.append(renamed)
    result = pd.concat(out, axis=1)
    result.attrs["source"] = str(path)
    return result


EXPORT_FORMATS = ("csv", "parquet")


def export(path: str | Path, to: str, out: str | Path) -> int:
    """Write the results of database ``path`` to ``out`` as CSV or Parquet; returns the row count."""
    from kvsched.errors import expect_path
    from kvsched.instances.io import check_not_input, same_file_key

    if to not in EXPORT_FORMATS:
        raise InputError(f"--to: unknown format {to!r} (known: {', '.join(EXPORT_FORMATS)})")
    # As the command refuses --out: writing over the input (or any results database) would destroy it.
    target = Path(expect_path(out, "out"))
    if same_file_key(target) == same_file_key(Path(expect_path(path, "path"))):
        raise InputError(f"out: {target} is also the input database; refusing to overwrite it")
    check_not_input(target, "out")
    frame = load_results(path)
    if to == "csv":
        frame.to_csv(out, index=False)
    else:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise InputError("--to parquet needs pyarrow: pip install pyarrow (or use --to csv)") from None
        frame.to_parquet(out, index=False)
    return len(frame)
