"""Measured against predicted: per-batch rows, error summaries, end-to-end metrics, fits.

This module needs no torch: it reads and writes the replay table (one row per
batch, :data:`REPLAY_COLUMNS`) and fits the calibrated cost model to it.

* Per batch, the row carries the batch sums every linear cost model is built on
  (:class:`~kvsched.costmodel.features.BatchFeatures`), the measured time and
  the cost model's prediction.
* End to end, the schedule is *retimed* twice (:func:`kvsched.schedule.retime.retime`)
  -- with measured and with predicted durations, each batch starting when the previous
  one ends or when its last request arrives, whichever is later -- and each retimed schedule is
  replayed through the validator (durations unchecked) into
  :func:`kvsched.schedule.metrics.run_metrics`. Both sides go through the same
  retiming, so their difference is the cost model's error alone.
* :func:`fit_replay` fits every coefficient of the calibrated model to the
  measured batches with :func:`kvsched.costmodel.fitting.fit_batches`, and
  reports the error before (the replay's own prediction), in sample and held
  out (k-fold).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsched.costmodel.base import BatchView
from kvsched.costmodel.calibrate import DIGITS
from kvsched.costmodel.calibrated import CalibratedCost
from kvsched.costmodel.coeffile import KIND, coefficient_params, parse_coefficients
from kvsched.costmodel.features import BatchFeatures
from kvsched.costmodel.fidelity import held_out
from kvsched.costmodel.fitting import FitError, fit_batches
from kvsched.costmodel.profiles import numeric_column, read_table
from kvsched.errors import InputError
from kvsched.instances.model import Instance
from kvsched.schedule.ir import Batch, Schedule
from kvsched.schedule.retime import retime

#: The batch sums of :class:`BatchFeatures`, as replay-table columns.
FEATURES = tuple(f.name for f in fields(BatchFeatures))
#: Columns of the replay table, in order. Times in seconds; ``measured_s`` is scaled to the full model.
#: ``start`` and ``duration`` are the batch's in the schedule replayed; a profile's ``batches.csv`` has
#: no schedule and writes 0.0 in both (nothing that fits or compares the table reads them).
REPLAY_COLUMNS = (
    "batch",
    "start",
    "duration",
    "num_items",
    "num_evicted",
    *FEATURES,
    "kv_blocks",
    "host_prep_s",
    "measured_raw_s",
    "measured_s",
    "measured_spread",
    "predicted_s",
    "rel_err",
)
#: End-to-end figures compared (fields of :class:`kvsched.schedule.metrics.RunMetrics`).
E2E_METRICS = (
    "makespan",
    "mean_latency",
    "p50_latency",
    "p99_latency",
    "mean_ttft",
    "p99_ttft",
    "mean_tpot",
    "max_tbt",
    "tokens_per_s",
)
FIT_FORMS = ("stepped", "linear")


def batch_row(
    index: int,
    batch: Batch,
    view: BatchView,
    *,
    measured: float,
    measured_raw: float,
    predicted: float,
    host_prep: float,
    kv_blocks: int,
    spread: float = math.nan,
) -> dict[str, Any]:
    """One replay-table row (``spread``: (max - min) / median of the batch's repeated runs)."""
    return {
        "batch": index,
        "start": batch.start,
        "duration": batch.duration,
        "num_items": batch.size,
        "num_evicted": int(batch.evicted.size),
        **asdict(BatchFeatures.of(view)),
        "kv_blocks": kv_blocks,
        "host_prep_s": host_prep,
        "measured_raw_s": measured_raw,
        "measured_s": measured,
        "measured_spread": spread,
        "predicted_s": predicted,
        "rel_err": abs(predicted - measured) / measured if measured > 0 else math.nan,
    }


@dataclass(frozen=True, slots=True)
class ErrorSummary:
    """Relative errors |predicted - measured| / measured: count, mean, median, 90th percentile, max."""

    n: int
    mean: float
    p50: float
    p90: float
    max: float

    @classmethod
    def of(
        cls, measured: Sequence[float] | np.ndarray, predicted: Sequence[float] | np.ndarray
    ) -> ErrorSummary:
        m = np.asarray(measured, dtype=np.float64)
        err = np.abs(np.asarray(predicted, dtype=np.float64) - m) / m
        if err.size == 0:
            return cls(0, math.nan, math.nan, math.nan, math.nan)
        return cls(
            int(err.size),
            float(err.mean()),
            float(np.percentile(err, 50)),
            float(np.percentile(err, 90)),
            float(err.max()),
        )

    def as_dict(self) -> dict[str, float]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


# ------------------------------------------------------------------ end to end
def end_to_end(
    instance: Instance, schedule: Schedule, measured: np.ndarray, predicted: np.ndarray
) -> pd.DataFrame:
    """Run metrics on the measured and on the predicted timeline, with their relative error.

    Rows are :data:`E2E_METRICS`; columns ``measured``, ``predicted``, ``rel_err``.
    """
    from kvsched.schedule.metrics import run_metrics
    from kvsched.schedule.validate import replay

    def metrics(durations: np.ndarray) -> dict[str, Any]:
        trace = replay(instance, retime(instance, schedule, durations), check_durations=False)
        return run_metrics(trace).to_dict()

    meas, pred = metrics(measured), metrics(predicted)
    rows = []
    for name in E2E_METRICS:
        m, p = float(meas[name]), float(pred[name])
        err = abs(p - m) / abs(m) if m and math.isfinite(m) and math.isfinite(p) else math.nan
        rows.append({"metric": name, "measured": m, "predicted": p, "rel_err": err})
    return pd.DataFrame(rows).set_index("metric")


# ------------------------------------------------------------------ files
def sidecar(path: str | Path) -> Path:
    """Where a replay table's metadata lives: the same name with ``.json``."""
    return Path(path).with_suffix(".json")


def output_sidecar(path: str | Path) -> Path | None:
    """Where :func:`write_replay` puts the metadata of a table written to ``path``: :func:`sidecar`, or
    ``None`` when ``path`` is no regular file's (``/dev/null``, ``/dev/stdout``, a pipe).

    ``NAME.json`` beside a device would be a new file in ``/dev`` (``/dev/null.json``), or in
    ``/proc/self/fd``, which takes none; and a table nobody keeps has no metadata to keep. A name in
    ``/dev`` counts as a device even where it leads to a regular file (``/dev/stdout`` with the shell's
    output redirected to one): its ``.json`` would still go into ``/dev``.
    """
    p = Path(path)
    if p.exists() and not p.is_file():
        return None
    folder = p.parent.resolve()
    if folder == Path("/dev") or folder == Path("/proc") or Path("/proc") in folder.parents:
        return None
    return sidecar(p)


def write_replay(
    table: pd.DataFrame, meta: dict[str, Any], path: str | Path, what: str = "write_replay"
) -> Path | None:
    """Write the replay table (CSV) and its metadata (JSON beside it, see :func:`output_sidecar`); return
    the metadata's path, or ``None`` where none was written (the table went to a device).

    Both files are written atomically (:func:`write_files`): an interrupt or a full disk leaves the
    previous table and metadata, or none, never half of one; a write the system refuses is one
    :class:`InputError` naming ``what`` (the flag, ``"--out"``) and the file.
    """
    files = replay_files(table, meta, path)
    write_files(files, what)
    return files[1][0] if len(files) > 1 else None


def replay_files(table: pd.DataFrame, meta: dict[str, Any], path: str | Path) -> list[tuple[Path, str]]:
    """What :func:`write_replay` writes: ``(path, CSV text)``, then ``(sidecar, JSON text)`` unless
    ``path`` is a device's (:func:`output_sidecar`)."""
    p = Path(path)
    side = output_sidecar(p)  # before the table is written: a new file would then be there
    files = [(p, table.loc[:, list(REPLAY_COLUMNS)].to_csv(index=False))]
    if side is not None:
        files.append((side, json.dumps(meta, indent=1, default=_jsonable) + "\n"))
    return files


def write_files(files: Sequence[tuple[Path, str]], what: str) -> None:
    """Write each ``(path, text)`` atomically (:func:`~kvsched.instances.atomic.atomic_output`), every text
    on disk before any file is replaced: a table and its metadata are replaced together, or neither is. A
    refused write is one :class:`InputError` naming ``what`` and the file the user named."""
    from contextlib import ExitStack

    from kvsched.instances.atomic import atomic_output

    with ExitStack() as stack:
        # Each context replaces its file on leaving the stack, after every write below has ended.
        for target, text in files:
            tmp = stack.enter_context(atomic_output(target, what))
            try:
                tmp.write_text(text, encoding="utf-8")
            except OSError as exc:
                raise InputError(f"{what}: {target} cannot be written ({exc.strerror or exc})") from None


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


@dataclass(frozen=True, slots=True, eq=False)
class ReplayTable:
    """A replay table read back: batch sums, measured and (when present) predicted times, metadata."""

    path: Path
    features: tuple[BatchFeatures, ...]
    measured: np.ndarray
    predicted: np.ndarray | None
    meta: dict[str, Any]


def read_replay(path: str | Path) -> ReplayTable:
    """Read and check a replay table (one clear error naming the column and line)."""
    p = Path(path)
    df = read_table(p)
    _check_field_counts(p)
    # Every feature is a sum of token or KV counts: a whole number (2.5 tokens is no batch).
    cols = {name: numeric_column(df, name, p, integer=True) for name in FEATURES}
    _check_features(cols, p)
    measured = numeric_column(df, "measured_s", p, positive=True)
    predicted = _predictions(df, p)
    feats = tuple(BatchFeatures(**{name: float(cols[name][i]) for name in FEATURES}) for i in range(len(df)))
    meta: dict[str, Any] = {}
    side = sidecar(p)
    if side.is_file():
        try:
            meta = json.loads(side.read_text())
        except json.JSONDecodeError as exc:
            raise InputError(f"{side}: not JSON ({exc})") from None
    return ReplayTable(p, feats, measured, predicted, meta)


def _predictions(df: pd.DataFrame, path: Path) -> np.ndarray | None:
    """The ``predicted_s`` column, or ``None`` where the table has no prediction at all.

    A profile made without ``--cost-model`` writes the column empty (there is then no "before" line);
    a replay fills every row. A column empty in some rows only is neither: a damaged or hand-edited
    table, whose "before" summary would silently vanish, so it is refused naming its first empty line.
    """
    if "predicted_s" not in df.columns:
        return None
    present = df["predicted_s"].notna().to_numpy()
    if not present.any():
        return None
    if not present.all():
        row = int(np.argmin(present))
        raise InputError(
            f"{path}: column 'predicted_s', line {row + 2}: empty, but {int(present.sum())} other rows have a "
            "prediction (a damaged table? only a profile made without --cost-model leaves the whole column empty)"
        )
    return numeric_column(df, "predicted_s", path)


def _check_field_counts(path: Path) -> None:
    """One :class:`InputError` naming the first line whose field count is not the header's.

    pandas reads a short row (a file cut while it was written or copied: ``...,0.002`` for
    ``0.0027891...``) with NaN in the missing columns, and a NaN prediction once silently dropped the
    "before" line while the cut value went into the fit. Every row :func:`write_replay` writes has all
    the header's fields (an unknown value is an empty field, not a missing one), so any other count
    is damage. A cut inside the last field (``rel_err``, which nothing fitted reads) keeps the count
    and cannot be told from a shorter number; it changes nothing the fit uses.
    """
    import csv
    import gzip

    if path.suffix.lower() in (".bz2", ".zip", ".xz", ".zst"):  # pandas reads these; not checked here
        return
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    with opener(path, "rt", encoding="utf-8-sig", errors="replace", newline="") as f:  # type: ignore[operator]
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            return
        for row in reader:
            if row and len(row) != len(header):  # (pandas skips blank lines, so does this)
                tail = " (a truncated file?)" if len(row) < len(header) else ""
                raise InputError(
                    f"{path}: line {reader.line_num}: {len(row)} fields, the header has {len(header)}{tail}"
                )


def _check_features(cols: dict[str, np.ndarray], path: Path) -> None:
    """One :class:`InputError` naming the column and line of the first row whose batch sums contradict.

    The columns are :class:`BatchFeatures` sums over one batch (integers, checked before). They are not
    independent: a decode is one token, a chunk at least one, and c^2 and 2mc are sums over the same
    chunks. A row that breaks one of these relations describes no batch (an edited or mixed-up table),
    and a fit to it would give coefficients for batches that cannot exist. Float arithmetic is exact
    here or rounds monotonically (the values are integers up to 2**53), so no true row is refused.
    """
    tok, nd, dkv = cols["tokens"], cols["n_decode"], cols["decode_kv"]
    npf, ptok, quad = cols["n_prefill"], cols["prefill_tokens"], cols["prefill_quad"]
    pkv, sq = cols["prefill_kv"], cols["prefill_sq"]
    cross = quad - sq  # 2 x the sum of c x m over the chunks

    def g(x: np.ndarray, i: int) -> str:
        return f"{x[i]:.17g}"

    # (column named, rows that break the relation, why, for the row i)
    checks: tuple[tuple[str, np.ndarray, Callable[[int], str]], ...] = (
        (
            "tokens",
            tok != nd + ptok,
            lambda i: f"is not n_decode + prefill_tokens = {g(nd, i)} + {g(ptok, i)} (a decode is one token)",
        ),
        ("decode_kv", (nd == 0) & (dkv != 0), lambda i: "is not 0 in a batch without decodes (n_decode = 0)"),
        (
            "prefill_tokens",
            (npf == 0) & (ptok != 0),
            lambda i: "is not 0 in a batch without chunks (n_prefill = 0)",
        ),
        (
            "prefill_tokens",
            ptok < npf,
            lambda i: f"is below n_prefill = {g(npf, i)} (a chunk is at least one token)",
        ),
        (
            "prefill_kv",
            (npf == 0) & (pkv != 0),
            lambda i: "is not 0 in a batch without chunks (n_prefill = 0)",
        ),
        # n chunks of P tokens in all (each >= 1): sum c^2 is at least P^2 / n (Cauchy-Schwarz) and
        # at most (P - n + 1)^2 + n - 1 (one chunk takes all it can); with no chunk both are 0.
        (
            "prefill_sq",
            (npf * sq < ptok * ptok) | (sq > (ptok - npf + 1) ** 2 + npf - 1),
            lambda i: f"is no sum of squares of {g(npf, i)} chunks of {g(ptok, i)} tokens in all",
        ),
        (
            "prefill_quad",
            (cross < 0) | (cross % 2 != 0) | (cross > 2 * ptok * pkv),
            lambda i: (
                f"is not prefill_sq + 2 x sum(c x m) = {g(sq, i)} + an even number at most "
                f"2 x {g(ptok, i)} x {g(pkv, i)}"
            ),
        ),
    )
    first: tuple[int, str, Callable[[int], str]] | None = None
    for col, bad, why in checks:
        if bad.any():
            row = int(np.argmax(bad))
            if first is None or row < first[0]:
                first = (row, col, why)
    if first is not None:
        row, col, why = first
        # +2: one for the header line, one because lines count from 1 (as numeric_column counts).
        raise InputError(f"{path}: column {col!r}, line {row + 2}: {g(cols[col], row)} {why(row)}")


# ------------------------------------------------------------------ fitting
@dataclass(frozen=True, slots=True, eq=False)
class ReplayFit:
    """The calibrated model fitted to a replay table, and how well it fits."""

    table: ReplayTable
    form: str
    cost: CalibratedCost
    r2: float
    before: ErrorSummary | None
    in_sample: ErrorSummary
    held_out: ErrorSummary
    folds: int
    seed: int

    def document(self) -> dict[str, Any]:
        """The coefficient file (``kvsched.cost-coefficients``) of the fit."""
        meta = self.table.meta
        params, count = coefficient_params(self.cost)  # every coefficient, zeros included, and counted
        doc = {
            "schema_version": 1,
            "kind": KIND,
            "name": self.cost.name,
            "params": params,
            "meta": {
                "source": "replay",
                "table": self.table.path.name,
                "rows": int(self.table.measured.size),
                "form": self.form,
                "unit": "seconds",
                **count,
                "r2": _round(self.r2),
                "fidelity": {
                    "before": self.before.as_dict() if self.before else None,
                    "in_sample": self.in_sample.as_dict(),
                    "held_out": self.held_out.as_dict(),
                },
                "cv": {"folds": self.folds, "seed": self.seed},
                "replay": {k: meta[k] for k in sorted(meta) if k not in ("summary", "end_to_end")},
            },
        }
        parse_coefficients(doc, str(self.table.path))  # what --cost-model will accept
        return doc


def _round(x: float) -> float:
    return float(f"{x:.{DIGITS}g}")


def _fit(features: Sequence[BatchFeatures], t: np.ndarray, form: str) -> CalibratedCost:
    fit = fit_batches(features, t, form=form)
    return CalibratedCost.from_params(**{k: _round(v) for k, v in fit.params.items()})


def fit_replay(path: str | Path, *, form: str = "stepped", folds: int = 10, seed: int = 0) -> ReplayFit:
    """Fit the calibrated cost model to the measured batches of a replay table."""
    if form not in FIT_FORMS:
        raise InputError(f"--form: a fit to replayed batches takes {' or '.join(FIT_FORMS)}, not {form!r}")
    if folds < 2:
        raise InputError(f"--folds: must be >= 2, got {folds}")
    table = read_replay(path)
    feats, t = table.features, table.measured
    try:
        fit = fit_batches(feats, t, form=form)
    except FitError as exc:  # (fits do not know files: the table is named here, as calibrate names its)
        raise InputError(f"{path}: {exc}") from None
    cost = CalibratedCost.from_params(**{k: _round(v) for k, v in fit.params.items()})
    in_sample = np.array([cost.time_of(f) for f in feats])

    def fp(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        model = _fit([feats[i] for i in train], t[train], form)
        return np.array([model.time_of(feats[i]) for i in test])

    try:
        out_of_fold = held_out(t.size, folds, seed, fp)
    except FitError as exc:  # a fold left too few rows to refit
        raise InputError(
            f"{path}: {exc} (in a {folds}-fold cross-validation: fewer --folds leave more)"
        ) from None
    before = ErrorSummary.of(t, table.predicted) if table.predicted is not None else None
    return ReplayFit(
        table=table,
        form=form,
        cost=cost,
        r2=fit.r2,
        before=before,
        in_sample=ErrorSummary.of(t, in_sample),
        held_out=ErrorSummary.of(t, out_of_fold),
        folds=min(folds, t.size),  # the folds used: kfold holds one row a fold beyond the rows
        seed=seed,
    )
