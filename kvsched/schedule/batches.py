"""Per-batch metrics of a replayed schedule: one row per batch, read off its records.

Split from :mod:`kvsched.schedule.metrics` (which still exports :func:`batch_metrics`): the batch columns
are laid out with numpy from the trace's records, a coalesced run's batches in closed form, and nothing
here needs the per-request or whole-run metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from kvsched.schedule.core import BatchRecord
from kvsched.schedule.records import RunRecord
from kvsched.schedule.validate import Trace, expect_trace

if TYPE_CHECKING:
    import pandas as pd


def batch_metrics(trace: Trace) -> pd.DataFrame:
    """One row per batch (index: batch index), straight from the batch records.

    Columns: start, end, duration, num_items, num_tokens, prefill_tokens
    (prefill and refill), num_decodes, kv_tokens (KV held during the batch),
    kv_util (KV blocks held x block size / M: the fraction of the cache in
    use), num_running (requests holding KV), num_evicted, num_generated.
    """
    expect_trace(trace)
    import pandas as pd

    cols = _batch_columns(trace)
    lim = trace.instance.limits
    start, end = cols["start"], cols["end"]
    return pd.DataFrame(
        {
            "start": start,
            "end": end,
            "duration": end - start,
            "num_items": cols["num_items"],
            "num_tokens": cols["num_tokens"],
            "prefill_tokens": cols["prefill_tokens"],
            "num_decodes": cols["num_decodes"],
            "kv_tokens": cols["kv_tokens"],
            "kv_util": cols["kv_blocks"] * lim.block_size / lim.kv_capacity,
            "num_running": cols["num_running"],
            "num_evicted": cols["num_evicted"],
            "num_generated": cols["num_generated"],
        },
        index=pd.Index(cols["index"], name="batch"),
    )


_COLUMNS: dict[str, type] = {
    "index": np.int64,
    "start": np.float64,
    "end": np.float64,
    "num_items": np.int64,
    "num_tokens": np.int64,
    "prefill_tokens": np.int64,
    "num_decodes": np.int64,
    "kv_tokens": np.int64,
    "kv_blocks": np.int64,
    "num_running": np.int64,
    "num_evicted": np.int64,
    "num_generated": np.int64,
}


def _record_columns(recs: list[BatchRecord]) -> dict[str, np.ndarray]:
    k = len(recs)

    def column(get: Callable[[BatchRecord], float], dtype: type) -> np.ndarray:
        return np.fromiter((get(r) for r in recs), dtype=dtype, count=k)

    out = {
        name: column(lambda r, name=name: getattr(r, name), dtype)
        for name, dtype in _COLUMNS.items()
        if name != "num_generated"
    }
    out["num_generated"] = column(lambda r: r.generated.size, np.int64)
    return out


def _run_columns(runs: list[RunRecord]) -> dict[str, np.ndarray]:
    """The per-batch columns of every batch of ``runs``, laid out with numpy."""
    k = np.fromiter((r.repeat for r in runs), dtype=np.int64, count=len(runs))
    owner = np.repeat(np.arange(len(runs)), k)
    step = np.arange(int(k.sum()), dtype=np.int64) - np.repeat(np.cumsum(k) - k, k) + 1  # 1-based in its run

    def per_run(get: Callable[[RunRecord], int]) -> np.ndarray:
        return np.fromiter((get(r) for r in runs), dtype=np.int64, count=len(runs))[owner]

    decodes = per_run(lambda r: r.requests.size)
    chunk = per_run(lambda r: r.chunk_tokens)  # a mixed run's prompt tokens per batch (else 0)
    tokens = decodes + chunk
    starts = np.concatenate([r.run.starts() for r in runs])
    if all(r.block_size == 1 for r in runs):
        kv_blocks = per_run(lambda r: r.kv_blocks) + tokens * step
    else:
        kv_blocks = np.concatenate([r.kv_blocks_during() for r in runs])
    return {
        "index": per_run(lambda r: r.index) + step - 1,
        "start": starts,
        "end": starts + np.concatenate([r.run.durations for r in runs]),
        "num_items": decodes + (chunk > 0),
        "num_tokens": tokens,
        "prefill_tokens": chunk,
        "num_decodes": decodes,
        "kv_tokens": per_run(lambda r: r.kv_tokens) + tokens * step,
        "kv_blocks": kv_blocks,
        "num_running": per_run(lambda r: r.num_running),
        "num_evicted": np.zeros(step.size, dtype=np.int64),
        "num_generated": decodes,
    }


def _batch_columns(trace: Trace) -> dict[str, np.ndarray]:
    """The per-batch columns of :func:`batch_metrics`; runs are laid out with numpy, not expanded."""
    recs = [e for e in trace.entries if type(e) is not RunRecord]
    runs = [e for e in trace.entries if type(e) is RunRecord]
    cols = _record_columns(recs)  # type: ignore[arg-type]
    if not runs:
        return cols
    more = _run_columns(runs)  # type: ignore[arg-type]
    joined = {name: np.concatenate([cols[name], more[name]]) for name in _COLUMNS}
    order = np.argsort(joined["index"], kind="stable")  # back in batch order
    return {name: col[order] for name, col in joined.items()}
