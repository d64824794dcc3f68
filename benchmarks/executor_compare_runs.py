"""Two runs' replays of the same schedule, batch by batch: what an engine setting costs (no GPU needed).

Usage::

    python benchmarks/executor_compare_runs.py \
        --pair benchmarks/data/executor_h100_graphs/sarathi.csv benchmarks/data/executor_h100_splits8/sarathi.csv \
        --pair benchmarks/data/executor_h100_mixed/sarathi_d10_buckets64.csv \
               benchmarks/data/executor_h100_splits8/sarathi_d10.csv \
        --pair benchmarks/data/executor_h100_graphs/profile/batches.csv \
               benchmarks/data/executor_h100_splits8/profile/batches.csv

Each ``--pair BEFORE AFTER`` names two replay tables (``kvsched replay --out``,
or a profile's ``batches.csv``) of the same batches: the same schedule under two
engine settings or on two runs. Their rows must agree in the batch sums (decodes,
decode KV, chunks, chunk tokens), so every ratio compares a batch with itself.
Per kind of batch (decode-only, with a chunk and decodes, prefill-only) it
prints the summed measured times before and after and the median of the
per-batch ratios after / before; decode-only batches are also split by their
number of decodes, with the median KV per decode. A profile's even-KV decode
rows are printed one by one.

For the full-length ``sarathi`` and ``vllm`` tables (named ``sarathi*.csv``,
``vllm*.csv``; their schedules are re-simulated on the first run's
``sg200.json``) the decode-only batches of more than 8 decodes are also split by
their longest KV, read back from the semantic core: the default split rule
(:func:`kvsched.executor.paged.decode_splits`) splits no sequence in those.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np
import pandas as pd
from executor_longest_kv import FIRST_RUN, longest_context
from rich.console import Console
from rich.table import Table

from kvsched.heuristics import make_policy, simulate
from kvsched.instances.io import load_instance

SUMS = ["n_decode", "decode_kv", "n_prefill", "prefill_tokens"]
DECODES = (0, 8, 16, 32, 64, 128, 10**9)  # 8: the most decodes the default rule splits on an H100
LONGEST = (0, 1000, 2000, 3000, 10**9)


def paired(before: Path, after: Path) -> pd.DataFrame:
    """One row per batch: its sums, kind, times before and after (ms) and their ratio."""
    a, b = pd.read_csv(before), pd.read_csv(after)
    if len(a) != len(b) or not np.array_equal(a[SUMS].to_numpy(), b[SUMS].to_numpy()):
        raise SystemExit(f"{before} and {after} do not hold the same batches")
    kind = np.where(b.n_prefill == 0, "decode-only", np.where(b.n_decode == 0, "prefill-only", "mixed"))
    d = b[SUMS].assign(kind=kind, before=1e3 * a.measured_s, after=1e3 * b.measured_s)
    return d.assign(ratio=d.after / d.before, kv_per=d.decode_kv / d.n_decode.clip(lower=1))


def _row(table: Table, label: str, g: pd.DataFrame, extra: str = "") -> None:
    s0, s1 = g.before.sum() / 1e3, g.after.sum() / 1e3
    table.add_row(
        label,
        str(len(g)),
        f"{s0:.3f}",
        f"{s1:.3f}",
        f"{100 * (s1 / s0 - 1):+.1f}%",
        f"{g.ratio.median():.3f}",
        extra,
    )


def _table(title: str, first: str, last: str) -> Table:
    table = Table(title=title)
    for col in (first, "batches", "before s", "after s", "change", "ratio p50", last):
        table.add_column(col, justify="right")
    return table


def _longest(path: Path, d: pd.DataFrame) -> np.ndarray | None:
    """Each batch's longest context, for the full-length sarathi and vllm tables; None otherwise."""
    policy = path.stem.split("_")[0]
    if policy not in ("sarathi", "vllm") or "d10" in path.stem:
        return None
    instance = load_instance(FIRST_RUN / "sg200.json")
    longest, tokens = longest_context(instance, simulate(instance, make_policy(policy)).schedule)
    kept = pd.read_csv(path).tokens.to_numpy()
    return longest if np.array_equal(tokens, kept) else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", nargs=2, type=Path, action="append", required=True, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    console = Console()
    for before, after in args.pair:
        d = paired(before, after)
        table = _table(f"{before} -> {after}", "kind", "median KV / decode")
        _row(table, "all", d)
        for kind, g in d.groupby("kind"):
            _row(table, kind, g, f"{g.kv_per[g.n_decode > 0].median():.0f}" if (g.n_decode > 0).any() else "")
        dec = d[d.kind == "decode-only"]
        for lo, hi in itertools.pairwise(DECODES):
            g = dec[(dec.n_decode > lo) & (dec.n_decode <= hi)]
            if len(g):
                label = (
                    f"decode-only, {lo + 1}-{hi} decodes" if hi < 10**9 else f"decode-only, > {lo} decodes"
                )
                _row(table, label, g, f"{g.kv_per.median():.0f}")
        console.print(table)
        longest = _longest(after, d)
        if longest is not None:
            big = dec.assign(longest=longest[dec.index])
            big = big[big.n_decode > 8]
            table = _table(
                "decode-only batches of more than 8 decodes, by longest KV", "longest KV", "median decodes"
            )
            for lo, hi in itertools.pairwise(LONGEST):
                g = big[(big.longest > lo) & (big.longest <= hi)]
                if len(g):
                    _row(table, f"{lo}-{hi}" if hi < 10**9 else f"> {lo}", g, f"{g.n_decode.median():.0f}")
            console.print(table)
            corr = np.corrcoef(big.ratio, big.longest)[0, 1]
            console.print(
                f"correlation of after / before with the longest KV: {corr:.2f} ({len(big)} batches)"
            )
        if before.name == "batches.csv":
            rows = dec[["n_decode", "kv_per", "before", "after", "ratio"]].round(3)
            table = Table(title="the profile's even-KV decode batches (ms)")
            for col in rows.columns:
                table.add_column(col, justify="right")
            for r in rows.itertuples(index=False):
                table.add_row(*(f"{v:g}" for v in r))
            console.print(table)


if __name__ == "__main__":
    main()
