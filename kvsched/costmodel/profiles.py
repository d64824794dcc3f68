"""Profiling tables (Vidur's format): reading and validation, with one clear error each.

Three kinds, told apart by their columns:

* **compute** (``mlp.csv``): per-operator timings of one transformer layer's
  non-attention operators, one row per (num_tokens, tensor-parallel degree);
  ``time_stats.<op>.median`` in milliseconds plus the model's dimensions.
* **attention**: per-layer attention medians in milliseconds; decode rows are
  ``batch_size`` decodes each reading ``kv_cache_size`` KV, prefill rows one
  chunk of ``prefill_chunk_size`` tokens over ``kv_cache_size`` KV.
* **all-reduce**: NCCL all-reduce medians in milliseconds per message ``size``
  in bytes (Vidur converts size to tokens as size / (2 x hidden)).

All times returned by this module are in seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvsched.errors import InputError

#: Non-attention operators of one layer (Vidur's names), besides the embedding.
LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
#: Operators a compute table must have; Vidur itself treats the others as 0 when absent.
REQUIRED_OPS = ("emb", "attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
DIM_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size")
ATTENTION_COLUMNS = (
    "num_tensor_parallel_workers",
    "batch_size",
    "prefill_chunk_size",
    "kv_cache_size",
    "is_prefill",
    "median_ms",
)
ALLREDUCE_COLUMNS = ("time_stats.all_reduce.median", "num_workers", "size")
MS = 1e-3
#: The longest time a profiling or measurement table may hold, in seconds (1e6 ms). A plausibility
#: ceiling, not a physical limit: the packaged tables' longest operator median is 34 ms and a whole
#: measured batch takes under a second, so 1000 s leaves three orders of magnitude of headroom, while
#: refusing values like 1e300 whose squares overflow float64 in the least-squares fit.
MAX_TIME_S = 1e3
#: The shortest non-zero time, in seconds (1e-6 ms): one clock cycle of a 1 GHz GPU, far below a kernel
#: launch (microseconds; the packaged tables' shortest median is 1 us). Shorter times turn the fit's
#: relative weights 1 / t into overflow or into held-out errors of 1e13 %.
MIN_TIME_S = 1e-9
#: The largest count, size or sum a table may hold: beyond 2**53 float64 no longer represents every
#: integer, so such a value cannot be an exact count (and products of two of them in a design
#: matrix stay far from overflow below it).
MAX_COUNT = float(2**53)


def _median(op: str) -> str:
    return f"time_stats.{op}.median"


def read_table(path: str | Path) -> pd.DataFrame:
    """A profiling (or measurement) CSV table, or one :class:`InputError` naming the file and what is wrong."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: profiling table not found")
    try:
        df = pd.read_csv(p)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: not a CSV profiling table ({str(exc).splitlines()[0]})") from None
    if df.empty:
        raise InputError(f"{p}: profiling table has no rows")
    return df


def table_kind(df: pd.DataFrame) -> str | None:
    """``compute``, ``attention``, ``all-reduce``, or None for an unknown table."""
    cols = set(df.columns)
    if _median("mlp_up_proj") in cols or "num_tokens" in cols:
        return "compute"
    if "median_ms" in cols or "is_prefill" in cols:
        return "attention"
    if ALLREDUCE_COLUMNS[0] in cols:
        return "all-reduce"
    return None


def _shown(value: object) -> str:
    """A cell as the user wrote it (numpy scalars as plain Python values)."""
    item = getattr(value, "item", None)
    return repr(item() if callable(item) else value)


def require_columns(df: pd.DataFrame, columns: Iterable[str], path: Path, hint: str = "") -> None:
    """One :class:`InputError` naming the first of ``columns`` that ``df`` lacks (``hint`` follows it)."""
    for col in columns:
        if col not in df.columns:
            raise InputError(f"{path}: missing column {col!r}{hint}")


def time_unit(col: str) -> tuple[float, str] | None:
    """Seconds per unit and the unit's name for a column whose name says it holds a time, else None.

    Vidur's ``time_stats.<op>.median`` and ``median_ms`` are milliseconds; kvsched's replay tables
    name seconds ``<what>_s`` (``tokens_per_s`` is a rate, not a time).
    """
    if col.endswith(".median") or col.endswith("_ms"):
        return MS, "ms"
    if col.endswith("_s") and not col.endswith("_per_s"):
        return 1.0, "s"
    return None


def _time_bounds(seconds: float) -> tuple[float, float]:
    """The plausible non-zero times in a column whose unit is ``seconds`` long, in that unit."""
    # Rounded, so that 1e-9 s / 1e-3 is exactly 1e-6 ms and a table holding that bound passes.
    return float(f"{MIN_TIME_S / seconds:.12g}"), float(f"{MAX_TIME_S / seconds:.12g}")


def _time_range(seconds: float, name: str) -> str:
    """The plausible non-zero times in a column of unit ``name`` (``seconds`` each), for error messages."""
    lo, hi = _time_bounds(seconds)
    text = f"a non-zero time lies between {lo:g} and {hi:g} {name}"
    return text if seconds == 1.0 else f"{text} = {MIN_TIME_S:g} to {MAX_TIME_S:g} s"


def numeric_column(
    df: pd.DataFrame, col: str, path: Path, *, positive: bool = False, integer: bool = False
) -> np.ndarray:
    """Column ``col`` as float64, or one error naming the column and the first bad line.

    Besides the sign (and integrality), every value must be finite and plausible: a time column
    (see :func:`time_unit`) 0 or within [:data:`MIN_TIME_S`, :data:`MAX_TIME_S`], any other at most
    :data:`MAX_COUNT`. Measured times are read with ``positive=True`` (no 0 either); only a cost
    model's prediction (``predicted_s``) may be 0.
    """
    require_columns(df, (col,), path)
    values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values) | (values <= 0 if positive else values < 0)
    if integer:
        bad |= np.isfinite(values) & (values != np.round(values))
    unit = time_unit(col)
    # NaN compares False both ways, so only finite (or +inf, already bad) values are flagged here.
    if unit:
        lo, hi = _time_bounds(unit[0])
        implausible = (values > hi) | ((values > 0) & (values < lo))
    else:
        implausible = values > MAX_COUNT
    bad |= implausible
    if bad.any():
        row = int(np.argmax(bad))
        # +2: one for the header line, one because lines count from 1.
        where = f"{path}: column {col!r}, line {row + 2}: {_shown(df[col].iloc[row])}"
        if implausible[row] and np.isfinite(values[row]):
            if unit:
                raise InputError(f"{where} is not a plausible time ({_time_range(*unit)})")
            raise InputError(f"{where} is too large (at most 2**53 = {MAX_COUNT:.0f})")
        need = "a positive" if positive else "a non-negative"
        kind = " integer" if integer else " number"
        # A 0 in a time column read with positive=True is a measurement: say why it cannot be 0.
        why = " (a measured time is never 0)" if unit and positive and values[row] == 0 else ""
        raise InputError(f"{where} is not {need}{kind}{why}")
    return values


# ------------------------------------------------------------------ compute
@dataclass(frozen=True, slots=True)
class ComputeProfile:
    """A compute table's rows for one tensor-parallel degree.

    Parameters
    ----------
    path
        Where it was read from.
    tp
        Tensor-parallel degree of the rows kept.
    num_tokens
        Distinct token counts, ascending.
    emb
        Embedding median per token count, seconds.
    layer
        Sum of the per-layer operator medians per token count, seconds.
    dims
        ``(n_head, n_kv_head, n_embd, n_expanded_embd, vocab_size)``.
    missing_ops
        Optional operators absent from the table (counted as 0, as Vidur does).
    """

    path: Path
    tp: int
    num_tokens: np.ndarray
    emb: np.ndarray
    layer: np.ndarray
    dims: tuple[int, int, int, int, int]
    missing_ops: tuple[str, ...] = ()

    def total(self, layers: int) -> np.ndarray:
        """Model non-attention time per token count: embedding once plus ``layers`` x layer time."""
        return self.emb + layers * self.layer


def load_compute(path: str | Path, tp: int = 1) -> ComputeProfile:
    """Read and validate a compute (``mlp.csv``) table, keeping the rows at degree ``tp``.

    Rows repeated for one (num_tokens, tp) are merged by the median of each
    operator's median (the Llama tables repeat 2048 and 4096 tokens).
    """
    p = Path(path)
    df = read_table(p)
    if table_kind(df) != "compute":
        raise InputError(f"{p}: not a compute profiling table (no column {_median('mlp_up_proj')!r})")
    require_columns(df, map(_median, REQUIRED_OPS), p)
    tokens = numeric_column(df, "num_tokens", p, positive=True, integer=True)
    tps = numeric_column(df, "num_tensor_parallel_workers", p, positive=True, integer=True)
    keep = tps == tp
    if not keep.any():
        have = ", ".join(str(int(v)) for v in sorted(set(tps)))
        raise InputError(f"{p}: no rows with num_tensor_parallel_workers = {tp} (have {have})")
    ops = ("emb", *LAYER_OPS)
    missing = tuple(op for op in ops if _median(op) not in df.columns)
    # positive: a median of a profiled GPU kernel is never 0 (a launch alone takes microseconds), and
    # neither the packaged tables nor Vidur's originals hold a 0 in any operator column. A 0 is a lost
    # measurement: it used to pass, and one such cell moved a1 by -21 %. An operator that a model lacks
    # is a missing column (counted as 0, as Vidur does), never a column of zeros.
    cols = {op: numeric_column(df, _median(op), p, positive=True)[keep] for op in ops if op not in missing}
    dims_rows = np.stack(
        [numeric_column(df, c, p, positive=True, integer=True)[keep] for c in DIM_COLUMNS], axis=1
    )
    if (dims_rows != dims_rows[0]).any():
        raise InputError(
            f"{p}: rows at tp = {tp} describe more than one model ({', '.join(DIM_COLUMNS)} differ)"
        )
    frame = pd.DataFrame({"num_tokens": tokens[keep], **cols})
    merged = frame.groupby("num_tokens", sort=True).median()
    layer = sum((merged[op].to_numpy() for op in LAYER_OPS if op not in missing), np.zeros(len(merged)))
    dims = tuple(int(v) for v in dims_rows[0])
    return ComputeProfile(
        path=p,
        tp=tp,
        num_tokens=merged.index.to_numpy(dtype=np.float64),
        emb=merged["emb"].to_numpy() * MS,
        layer=layer * MS,
        dims=dims,  # type: ignore[arg-type]
        missing_ops=missing,
    )


# ---------------------------------------------------------------- attention
@dataclass(frozen=True, slots=True)
class AttentionProfile:
    """An attention table's rows for one tensor-parallel degree (times per layer, seconds).

    Decode rows: ``batch`` decodes each holding ``kv`` KV. Prefill rows: one
    chunk of ``chunk`` tokens over ``kv`` KV.
    """

    path: Path
    tp: int
    decode_batch: np.ndarray
    decode_kv: np.ndarray
    decode_time: np.ndarray
    prefill_chunk: np.ndarray
    prefill_kv: np.ndarray
    prefill_time: np.ndarray


def _bools(df: pd.DataFrame, col: str, path: Path) -> np.ndarray:
    raw = df[col]
    if raw.dtype == bool:
        return raw.to_numpy()
    text = raw.astype(str).str.strip().str.lower()
    ok = text.isin(["true", "false", "1", "0"])
    if not ok.all():
        row = int(np.argmax(~ok.to_numpy()))
        raise InputError(
            f"{path}: column {col!r}, line {row + 2}: {_shown(raw.iloc[row])} is not True or False"
        )
    return text.isin(["true", "1"]).to_numpy()


def load_attention(path: str | Path, tp: int = 1) -> AttentionProfile:
    """Read and validate an attention table, keeping the rows at degree ``tp`` (may be none)."""
    p = Path(path)
    df = read_table(p)
    require_columns(df, ATTENTION_COLUMNS, p, " (not an attention profiling table?)")
    tps = numeric_column(df, "num_tensor_parallel_workers", p, positive=True, integer=True)
    batch = numeric_column(df, "batch_size", p, integer=True)
    chunk = numeric_column(df, "prefill_chunk_size", p, integer=True)
    kv = numeric_column(df, "kv_cache_size", p, integer=True)
    ms = numeric_column(df, "median_ms", p, positive=True)
    pre = _bools(df, "is_prefill", p)
    bad = (pre & (chunk < 1)) | (~pre & (batch < 1))
    if bad.any():
        row = int(np.argmax(bad))
        col = "prefill_chunk_size" if pre[row] else "batch_size"
        raise InputError(
            f"{p}: column {col!r}, line {row + 2}: must be >= 1 for a {'prefill' if pre[row] else 'decode'} row"
        )
    keep = tps == tp
    dec, pf = keep & ~pre, keep & pre
    return AttentionProfile(
        path=p,
        tp=tp,
        decode_batch=batch[dec],
        decode_kv=kv[dec],
        decode_time=ms[dec] * MS,
        prefill_chunk=chunk[pf],
        prefill_kv=kv[pf],
        prefill_time=ms[pf] * MS,
    )


# --------------------------------------------------------------- all-reduce
@dataclass(frozen=True, slots=True)
class AllReduceProfile:
    """All-reduce medians for one number of workers: message bytes -> seconds."""

    path: Path
    workers: int
    size: np.ndarray
    time: np.ndarray

    def time_of(self, nbytes: np.ndarray) -> np.ndarray:
        """Seconds per all-reduce of ``nbytes``: linear interpolation between measured sizes.

        Beyond the largest size the last two points are extended linearly; below
        the smallest the smallest measured time is used (latency-bound).
        """
        x = np.asarray(nbytes, dtype=np.float64)
        out = np.interp(x, self.size, self.time)
        if self.size.size >= 2:
            slope = (self.time[-1] - self.time[-2]) / (self.size[-1] - self.size[-2])
            out = np.where(x > self.size[-1], self.time[-1] + slope * (x - self.size[-1]), out)
        return out


def load_allreduce(path: str | Path, workers: int) -> AllReduceProfile:
    """Read and validate an all-reduce table, keeping single-node rows for ``workers`` GPUs."""
    p = Path(path)
    df = read_table(p)
    require_columns(df, ALLREDUCE_COLUMNS, p, " (not an all-reduce profiling table?)")
    n = numeric_column(df, "num_workers", p, positive=True, integer=True)
    size = numeric_column(df, "size", p, positive=True)
    ms = numeric_column(df, ALLREDUCE_COLUMNS[0], p, positive=True)  # an all-reduce is never free either
    keep = n == workers
    if "collective" in df.columns:
        keep &= df["collective"].astype(str).to_numpy() == "all_reduce"
    if "devices_per_node" in df.columns:
        # Vidur keeps the rows measured with all workers on one node.
        keep &= pd.to_numeric(df["devices_per_node"], errors="coerce").to_numpy() == workers
    if not keep.any():
        have = ", ".join(str(int(v)) for v in sorted(set(n)))
        raise InputError(f"{p}: no all-reduce rows for {workers} workers (have {have})")
    merged = pd.DataFrame({"size": size[keep], "ms": ms[keep]}).groupby("size", sort=True)["ms"].median()
    return AllReduceProfile(p, workers, merged.index.to_numpy(dtype=np.float64), merged.to_numpy() * MS)
