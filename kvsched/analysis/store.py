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
            conn.executescript(_SCHEMA)
            cols = {r[1] for r in conn.execute("PRAGMA table_info(cells)")}
            if not set(COLUMNS) - set(ADDED) <= cols:
                raise InputError(
                    f"{path}: not a kvsched results database (table cells lacks kvsched's columns)"
                )
            _migrate(conn, cols)
        except sqlite3.Error as exc:
            raise InputError(f"{path}: not a kvsched results database ({exc})") from None
        yield ResultsDB(conn, path)
    finally:
        conn.close()


def _migrate(conn: sqlite3.Connection, cols: set[str]) -> None:
    """Bring a database to :data:`SCHEMA_VERSION`: add the columns it lacks, record the version."""
    for name in ADDED:
        if name not in cols:
            try:
                conn.execute(f"ALTER TABLE cells ADD COLUMN {name} {_TYPES.get(name, 'TEXT')}")
            except sqlite3.OperationalError as exc:  # another process opening it added it first
                if "duplicate column" not in str(exc):
                    raise
    with conn:
        conn.execute(
            "INSERT INTO meta (name, value) VALUES ('schema_version', ?) "
            "ON CONFLICT(name) DO UPDATE SET value = excluded.value WHERE CAST(value AS INTEGER) < ?",
            (str(SCHEMA_VERSION), SCHEMA_VERSION),
        )


def _json_column(series: pd.Series) -> pd.DataFrame:
    records = [json.loads(v) if isinstance(v, str) and v else {} for v in series]
    return pd.DataFrame.from_records(records, index=series.index)


def load_results(path: str | Path) -> pd.DataFrame:
    """Every row of a results database, for pandas.

    The stored columns, plus: the generator parameters of each instance (e.g.
    ``rate``, ``predict_sigma``, ``groups``) and every run metric (e.g.
    ``mean_latency``, ``p99_ttft``, ``evictions``) as their own columns. A name
    that would clash with a stored column gets a ``param_`` or ``metric_``
    prefix. JSON columns ``config``, ``metrics`` and ``anytime`` stay as text.
    """
    with open_db(path) as db:
        frame = db.raw_frame()
    if frame.empty:
        return frame
    configs = frame["config"].map(json.loads)
    params = pd.DataFrame.from_records(
        [c.get("instance", {}).get("params", {}) for c in configs], index=frame.index
    )
    metrics = _json_column(frame["metrics"])
    out = [frame]
    taken = set(frame.columns)
    for extra, prefix in ((params, "param_"), (metrics, "metric_")):
        renamed = extra.rename(columns={c: prefix + c for c in extra.columns if c in taken})
        taken |= set(renamed.columns)
        out.append(renamed)
    return pd.concat(out, axis=1)


EXPORT_FORMATS = ("csv", "parquet")


def export(path: str | Path, to: str, out: str | Path) -> int:
    """Write the results of database ``path`` to ``out`` as CSV or Parquet; returns the row count."""
    if to not in EXPORT_FORMATS:
        raise InputError(f"--to: unknown format {to!r} (known: {', '.join(EXPORT_FORMATS)})")
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
