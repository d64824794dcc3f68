"""The results database: one SQLite row per finished cell.

Plain :mod:`sqlite3`, one file, no server. Each row is committed on its own,
so an interrupted sweep keeps every cell it finished, and a rerun skips the
keys already present. :func:`load_results` reads the table into pandas with the
configuration and the run metrics spread into columns; :func:`export` writes
that frame as CSV or Parquet.

Schema (table ``cells``; see ``docs/analysis.md``)::

    key TEXT PRIMARY KEY      hash of the cell's configuration
    instance_key TEXT         hash of the instance configuration (rows to compare)
    sweep TEXT                name of the spec that wrote the row
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

Opening a database written by an older kvsched adds the columns it lacks
(:data:`ADDED`; NULL in its old rows: scope unknown, never assumed) and
records the new ``schema_version`` in table ``meta``.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from kvsched.errors import InputError

SCHEMA_VERSION = 2
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
        """Insert (or replace) one row and commit it."""
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise ValueError(f"unknown result columns: {sorted(unknown)}")
        values = [_to_sql(row.get(c)) for c in COLUMNS]
        marks = ", ".join("?" * len(COLUMNS))
        with self.conn:  # commits, so Ctrl-C loses nothing already written
            self.conn.execute(f"INSERT OR REPLACE INTO cells ({', '.join(COLUMNS)}) VALUES ({marks})", values)

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
    """Bring a database to :data:`SCHEMA_VERSION`: add the columns it lacks, record the version."""
    for name in ADDED:
        if name not in cols:
            try:
                conn.execute(f"ALTER TABLE cells ADD COLUMN {name} {_TYPES.get(name, 'TEXT')}")
            except sqlite3.OperationalError as exc:  # another process opening it added it first
                if "duplicate column" not in str(exc):
                    raise
    row = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
    try:
        current = int(row[0]) if row is not None else None
    except (TypeError, ValueError):
        current = None
    if current is not None and current >= SCHEMA_VERSION:
        # Nothing to record: a write here would make a valid read-only database unreadable.
        return
    with conn:
        conn.execute(
            "INSERT INTO meta (name, value) VALUES ('schema_version', ?) "
            "ON CONFLICT(name) DO UPDATE SET value = excluded.value WHERE CAST(value AS INTEGER) < ?",
            (str(SCHEMA_VERSION), SCHEMA_VERSION),
        )


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


def load_results(path: str | Path) -> pd.DataFrame:
    """Every row of a results database, for pandas.

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
