"""Calibrate on one GPU replay, check on the others, and write the run's summary (by hand; no GPU needed).

Usage::

    python benchmarks/executor_calibration.py                 # the first run's H100 tables
    python benchmarks/executor_calibration.py --fit vllm --form linear
    python benchmarks/executor_calibration.py --data benchmarks/data/executor_h100_inplace --write-summary
    python benchmarks/executor_calibration.py --fit-table benchmarks/data/executor_h100_graphs/profile/batches.csv \
        --data benchmarks/data/executor_h100_graphs --data benchmarks/data/executor_h100_mixed --all-tables

A run's directory holds one replay table per case (``<case>.csv`` with its
``.json``), measured with ``kvsched replay ... --model llama-2-7b-shape --device
cuda``. The instances and the exact solver's schedule are read from the
directory, or from ``benchmarks/data/executor_h100/`` where the first run keeps
them. The cases:

* ``sarathi``, ``vllm``: 200 ShareGPT requests (``sg200.json``, full lengths,
  M = 60,000) scheduled by Sarathi-Serve and vLLM;
* ``opt_d10``: the exact solver's schedule of the same 200 requests with
  lengths / 10 and M at 30% of the summed peaks (``sg200d10.json``): the
  time-indexed model's best schedule in unit time (gap 0.28%), retimed under
  the instance's cost model (``opt_d10.schedule.json``);
* ``sarathi_d10``: Sarathi-Serve on that instance.

A case whose table the directory lacks is skipped with a line saying so (the third run,
``executor_h100_mixed``, did not replay vLLM). ``--all-tables`` also checks every
variant ``<case>_<variant>.csv`` of a case (``sarathi_d10_buckets64``: the same
schedule under other engine settings). ``--data`` may be given several times: every
directory's tables are checked, named ``<directory>/<table>``.

The cost model is fitted to the ``--fit`` case's measured batches (of the first
``--data`` directory), or to any replay table with ``--fit-table`` (a profile's
``profile/batches.csv``), by the same weighted least squares as ``kvsched calibrate
--from-replay``; or it is given whole with ``--cost-model`` (a calibrated
coefficient file, e.g. the fit of ``kvsched calibrate profile/mlp.csv --attention
...``). It then predicts every case. Per case it prints the relative batch-time error before
(the instance's own vLLM-profiled model) and after, and the end-to-end error
(mean latency, makespan) of the timeline retimed with predicted durations
against the one retimed with measured durations. A second table splits each
case by kind of batch (decode-only, with a chunk and decodes, prefill-only): count,
median measured / model, summed times and the p90 of the repeats' spread.

``--write-summary`` writes ``summary.json`` into the directory (issue 17's schema):

* ``date``, ``device``: from the tables' metadata (``--date`` for tables without one);
* ``cases``: per case ``name``, ``batches``, ``measured_s`` and ``model_s`` (sums of
  the measured and of the vLLM-profiled model's batch times) and ``ratio_median``
  (median over batches of measured / model);
* ``transfer``: ``fit_on`` (the case, or the table or coefficient file), ``per_batch_mean_error`` (mean relative batch error of
  the fitted model, per case) and ``end_to_end_error`` (per case, the larger of the
  mean-latency and makespan errors);
* ``identical_batch_spread_p90``: the 90th percentile of the spread (max - min) /
  median of identical batches: a batch's ``--repeat`` runs (column
  ``measured_spread``) and batches of equal batch sums across the tables. None
  when the tables hold no identical batches (the first run kept no repeats).

``--write-summary`` takes one ``--data`` directory, and only its four cases go into it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from kvsched.costmodel import make_cost_model
from kvsched.costmodel.coeffile import resolve_cost_model
from kvsched.executor.measure import FEATURES, ErrorSummary, end_to_end, fit_replay, read_replay
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.io import load_instance
from kvsched.schedule.io import load_schedule
from kvsched.schedule.validate import replay

FIRST_RUN = Path(__file__).parent / "data" / "executor_h100"
#: case -> (instance file, policy name or schedule file)
CASES = {
    "sarathi": ("sg200.json", "sarathi"),
    "vllm": ("sg200.json", "vllm"),
    "opt_d10": ("sg200d10.json", "opt_d10.schedule.json"),
    "sarathi_d10": ("sg200d10.json", "sarathi"),
}


def _input(data: Path, name: str) -> Path:
    """An input file of the run's directory, or of the first run's."""
    return data / name if (data / name).is_file() else FIRST_RUN / name


def case_schedule(data: Path, instance, source: str):
    if source.endswith(".json"):
        schedule = load_schedule(_input(data, source), instance)
    else:
        schedule = simulate(instance, make_policy(source)).schedule
    replay(instance, schedule)  # every schedule is validated
    return schedule


def case_of(stem: str) -> str | None:
    """The case a table ``<case>`` or ``<case>_<variant>`` replays (the longest case name that fits)."""
    fits = [c for c in CASES if stem == c or stem.startswith(c + "_")]
    return max(fits, key=len) if fits else None


def tables(data: Path, *, variants: bool) -> list[tuple[str, str, Path]]:
    """``(table, case, path)`` for the run's cases, and with ``variants`` every ``<case>_<variant>.csv``."""
    out = []
    for path in sorted(data.glob("*.csv")):
        case = case_of(path.stem)
        if case is not None and (variants or case == path.stem):
            out.append((path.stem, case, path))
    return sorted(out, key=lambda t: (list(CASES).index(t[1]), t[0]))


def spreads(data: Path) -> np.ndarray:
    """Spreads (max - min) / median of identical batches: repeats of a batch, and equal batch sums."""
    frames = [pd.read_csv(data / f"{name}.csv") for name in CASES if (data / f"{name}.csv").is_file()]
    df = pd.concat(frames, ignore_index=True)
    out = []
    if "measured_spread" in df.columns:
        out.extend(df["measured_spread"].dropna().tolist())
    groups = df.groupby([*FEATURES, "num_items"])["measured_s"]
    for _, t in groups:
        if t.size > 1:
            out.append((t.max() - t.min()) / t.median())
    return np.asarray(out, dtype=np.float64)


def by_kind(path: Path) -> pd.DataFrame:
    """Per kind of batch (decode-only, with a chunk and decodes, prefill-only): count, median measured / model,
    sums of measured and modelled time, and the p90 of the repeats' spread."""
    df = pd.read_csv(path)
    kind = np.where(df["n_prefill"] > 0, np.where(df["n_decode"] > 0, "mixed", "prefill-only"), "decode-only")
    df = df.assign(kind=kind, ratio=df["measured_s"] / df["predicted_s"])
    if "measured_spread" not in df.columns:  # (the first run kept no repeats)
        df["measured_spread"] = np.nan
    return df.groupby("kind").agg(
        batches=("ratio", "size"),
        ratio=("ratio", "median"),
        measured=("measured_s", "sum"),
        model=("predicted_s", "sum"),
        spread_p90=("measured_spread", lambda x: x.quantile(0.9)),
    )


def _fraction(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--data",
        type=Path,
        action="append",
        help="a run's directory (default: the first run); give it again to check several runs",
    )
    ap.add_argument("--fit", default="sarathi", choices=sorted(CASES), help="case the model is fitted to")
    ap.add_argument(
        "--fit-table", type=Path, help="fit to this replay table instead (a profile's batches.csv)"
    )
    ap.add_argument("--cost-model", help="predict with this calibrated coefficient file instead of fitting")
    ap.add_argument("--form", default="stepped", choices=("stepped", "linear"))
    ap.add_argument("--all-tables", action="store_true", help="check each case's variant tables too")
    ap.add_argument("--write-summary", action="store_true", help="write summary.json into --data")
    ap.add_argument("--date", help="date of the run, for tables whose metadata has none")
    ap.add_argument("--label", help="a note stored in summary.json (e.g. which engine ran)")
    args = ap.parse_args()
    dirs: list[Path] = args.data or [FIRST_RUN]
    data = dirs[0]
    if args.write_summary and (len(dirs) > 1 or args.all_tables):
        raise SystemExit("--write-summary: give one --data directory, without --all-tables")
    if args.fit_table is not None and args.cost_model is not None:
        raise SystemExit("give --fit-table or --cost-model, not both")

    console = Console()
    if args.cost_model is not None:
        name, params = resolve_cost_model(args.cost_model)
        cost = make_cost_model(name, params)
        if not hasattr(cost, "time_of"):  # batch sums are all a replay table keeps
            raise SystemExit(f"--cost-model: {name!r} cannot predict from batch sums; give a calibrated set")
        fit_on, meta = args.cost_model, {}
        console.print(f"predicted by {args.cost_model} ({name})")
    else:
        source = args.fit_table if args.fit_table is not None else data / f"{args.fit}.csv"
        if not source.is_file():  # (a run need not replay every case)
            raise SystemExit(f"--fit: {source} is missing: this run did not replay it")
        fit = fit_replay(source, form=args.form)
        cost, meta = fit.cost, fit.table.meta
        fit_on = args.fit if args.fit_table is None else str(args.fit_table)
        console.print(
            f"fitted to {fit_on} ({fit.table.measured.size} batches, {args.form}): R² {fit.r2:.3f}, "
            f"in sample mean {100 * fit.in_sample.mean:.1f}%, held out (10-fold) mean {100 * fit.held_out.mean:.1f}%"
        )
    first = data / f"{args.fit}.csv"
    if not meta and first.is_file():
        meta = read_replay(first).meta
    console.print(
        f"{meta.get('device_name')}, torch {meta.get('torch')}, CUDA {meta.get('cuda')}, {meta.get('dtype')}, "
        f"{meta.get('model')} ({meta.get('layers')} layers)"
    )
    table = Table(title="batch time and end-to-end error, before and after calibration")
    for col in (
        "case",
        "batches",
        "measured s",
        "model s",
        "ratio p50",
        "before mean",
        "after mean",
        "after p90",
        "mean latency",
        "makespan",
    ):
        table.add_column(col, justify="right")
    kinds = Table(title="by kind of batch: measured / the instance's vLLM-profiled model")
    for col in ("case", "kind", "batches", "ratio p50", "measured s", "model s", "spread p90"):
        kinds.add_column(col, justify="right")
    cases, per_batch, e2e_err = [], {}, {}
    for d in dirs:
        for name in CASES:
            if not (d / f"{name}.csv").is_file():  # a run need not replay every case
                console.print(f"{name}: not replayed in this run ({d / f'{name}.csv'} is missing)")
        for stem, case, path in tables(d, variants=args.all_tables):
            label = stem if len(dirs) == 1 else f"{d.name}/{stem}"
            rt = read_replay(path)
            inst_file, source = CASES[case]
            instance = load_instance(_input(d, inst_file))
            schedule = case_schedule(d, instance, source)
            if len(schedule) != rt.measured.size:
                raise SystemExit(
                    f"{label}: {len(schedule)} batches in the schedule, {rt.measured.size} in the table"
                )
            if rt.predicted is None:
                raise SystemExit(f"{label}: the table has no predicted_s (replay with the instance's model)")
            predicted = np.array([cost.time_of(f) for f in rt.features])
            before = ErrorSummary.of(rt.measured, rt.predicted)
            after = ErrorSummary.of(rt.measured, predicted)
            e2e = end_to_end(instance, schedule, rt.measured, predicted)
            lat, mk = float(e2e.loc["mean_latency", "rel_err"]), float(e2e.loc["makespan", "rel_err"])
            ratio = float(np.median(rt.measured / rt.predicted))
            if stem == case:
                cases.append(
                    {
                        "name": case,
                        "batches": int(rt.measured.size),
                        "measured_s": round(float(rt.measured.sum()), 4),
                        "model_s": round(float(rt.predicted.sum()), 4),
                        "ratio_median": round(ratio, 4),
                    }
                )
                per_batch[case] = _fraction(after.mean)
                e2e_err[case] = _fraction(max(lat, mk))
            fitted = args.fit_table is None and args.cost_model is None and d == data and stem == args.fit
            table.add_row(
                label + (" (fit)" if fitted else ""),
                str(after.n),
                f"{rt.measured.sum():.2f}",
                f"{rt.predicted.sum():.2f}",
                f"{ratio:.2f}",
                f"{100 * before.mean:.1f}%",
                f"{100 * after.mean:.1f}%",
                f"{100 * after.p90:.1f}%",
                f"{100 * lat:.1f}%",
                f"{100 * mk:.1f}%",
            )
            for kind, row in by_kind(path).iterrows():
                kinds.add_row(
                    label,
                    str(kind),
                    str(int(row["batches"])),
                    f"{row['ratio']:.2f}",
                    f"{row['measured']:.2f}",
                    f"{row['model']:.2f}",
                    f"{100 * row['spread_p90']:.1f}%" if math.isfinite(row["spread_p90"]) else "-",
                )
    console.print(table)
    console.print(kinds)
    for d in dirs:
        sp = spreads(d)
        p90 = float(np.percentile(sp, 90)) if sp.size else None
        console.print(
            (f"{d.name}: " if len(dirs) > 1 else "")
            + f"identical batches: {sp.size} spreads, p90 "
            + (f"{100 * p90:.1f}%" if p90 is not None else "not measured (no repeats or equal batches)")
        )
    if args.write_summary:
        summary = {
            "date": meta.get("date", args.date),
            "device": meta.get("device_name"),
            "cases": cases,
            "transfer": {"fit_on": fit_on, "per_batch_mean_error": per_batch, "end_to_end_error": e2e_err},
            "identical_batch_spread_p90": _fraction(p90) if p90 is not None else None,
        }
        if args.label:
            summary["label"] = args.label
        out = data / "summary.json"
        out.write_text(json.dumps(summary, indent=1) + "\n")
        console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
