"""Error of a batch-sum fit on decode batches, by how far the longest KV read exceeds the mean (no GPU needed).

Usage::

    python benchmarks/executor_longest_kv.py --data benchmarks/data/executor_h100_graphs

The calibrated model (stepped) is fitted to ``--fit-table`` (default: the run's
``profile/batches.csv``, whose decode batches read the same KV per request) and
predicts every decode-only batch of the run's full-length replays (``sarathi``,
``vllm`` on ``sg200.json``). A replay table keeps only batch sums, so each batch's
longest context is read back from the semantic core: the schedule is replayed with
a cost model that records every batch's view. The signed error (predicted -
measured) / measured is printed by bins of longest / mean KV, and its correlation
with the longest KV. Batch sums cannot see the longest request; this says how much
of the fit's error it carries.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from kvsched.costmodel.base import BatchView
from kvsched.executor.measure import fit_replay, read_replay
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.io import load_instance
from kvsched.schedule.validate import instance_cost_model, replay

FIRST_RUN = Path(__file__).parent / "data" / "executor_h100"
CASES = ("sarathi", "vllm")  # policies on sg200.json
BINS = (0.0, 1.5, 3.0, 5.0, 10.0, 1e9)


class _Recorder:
    """The instance's cost model, keeping every batch's view (the contexts the core computed)."""

    name = "recorder"

    def __init__(self, model) -> None:
        self.model = model
        self.views: list[BatchView] = []

    def batch_time(self, view: BatchView) -> float:
        self.views.append(view)
        return self.model.batch_time(view)


def longest_context(instance, schedule) -> tuple[np.ndarray, np.ndarray]:
    """Each batch's longest context (KV read before the batch, 0 for none) and its tokens."""
    rec = _Recorder(instance_cost_model(instance))
    replay(instance, schedule, rec)  # every schedule is validated, durations included
    longest = [int(v.context.max()) if v.context.size else 0 for v in rec.views]
    return np.array(longest), np.array([int(v.tokens.sum()) for v in rec.views])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="the run's directory")
    ap.add_argument("--fit-table", type=Path, help="table fitted (default: DATA/profile/batches.csv)")
    args = ap.parse_args()
    fit = fit_replay(args.fit_table or args.data / "profile" / "batches.csv")
    instance = load_instance(FIRST_RUN / "sg200.json")
    console = Console()
    console.print(f"fitted to {fit.table.path} ({fit.table.measured.size} batches, stepped)")
    for case in CASES:
        path = args.data / f"{case}.csv"
        if not path.is_file():
            console.print(f"{case}: not replayed in this run")
            continue
        rt, df = read_replay(path), pd.read_csv(path)
        schedule = simulate(instance, make_policy(case)).schedule
        longest, tokens = longest_context(instance, schedule)
        if tokens.size != len(df) or not np.array_equal(tokens, df.tokens.to_numpy()):
            raise SystemExit(f"{case}: the schedule's batches are not the table's (tokens differ)")
        pred = np.array([fit.cost.time_of(f) for f in rt.features])
        d = df.assign(err=(pred - rt.measured) / rt.measured, longest=longest)
        d = d[(d.n_prefill == 0) & (d.n_decode > 0)]
        d = d.assign(het=d.longest / (d.decode_kv / d.n_decode))
        table = Table(title=f"{case}: decode-only batches, signed error of the fit")
        for col in ("longest / mean KV", "batches", "median decodes", "mean error", "mean |error|"):
            table.add_column(col, justify="right")
        for lo, hi in itertools.pairwise(BINS):
            g = d[(d.het > lo) & (d.het <= hi)]
            if len(g):
                table.add_row(
                    f"{lo:g}-{hi:g}" if hi < 1e9 else f"> {lo:g}",
                    str(len(g)),
                    f"{g.n_decode.median():.0f}",
                    f"{100 * g.err.mean():+.1f}%",
                    f"{100 * g.err.abs().mean():.1f}%",
                )
        console.print(table)
        corr = np.corrcoef(d.err, d.longest)[0, 1]
        console.print(
            f"{case}: {len(d)} decode-only batches, correlation of the error with the longest KV {corr:.2f}"
        )


if __name__ == "__main__":
    main()
