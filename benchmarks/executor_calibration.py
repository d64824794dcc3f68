"""Calibrate on one GPU replay, check on the others (run by hand, not a test; no GPU needed).

Usage::

    python benchmarks/executor_calibration.py                 # the committed H100 tables
    python benchmarks/executor_calibration.py --fit vllm --form linear

The replay tables in ``benchmarks/data/executor_h100/`` were measured with
``kvsched replay ... --model llama-2-7b-shape --device cuda --repeat 3`` (the
vLLM table with ``--repeat 2``); each ``.json`` beside a table records the GPU,
torch and CUDA versions and the attention backend. The cases:

* ``sarathi``, ``vllm``: 200 ShareGPT requests (``sg200.json``, full lengths,
  M = 60,000) scheduled by Sarathi-Serve and vLLM;
* ``opt_d10``: the exact solver's schedule of the same 200 requests with
  lengths / 10 and M at 30% of the summed peaks (``sg200d10.json``): the
  time-indexed model's best schedule in unit time (gap 0.28%), retimed under
  the instance's cost model;
* ``sarathi_d10``: Sarathi-Serve on that instance.

The cost model is fitted to the ``--fit`` case's measured batches (the same
weighted least squares as ``kvsched calibrate --from-replay``) and then
predicts every case. Per case it prints the relative batch-time error before
(the instance's own vLLM-profiled model) and after, and the end-to-end error
(mean latency, makespan) of the timeline retimed with predicted durations
against the one retimed with measured durations.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from kvsched.executor.measure import ErrorSummary, end_to_end, fit_replay, read_replay
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.io import load_instance
from kvsched.schedule.io import load_schedule
from kvsched.schedule.validate import replay

DATA = Path(__file__).parent / "data" / "executor_h100"
#: case -> (instance file, policy name or schedule file)
CASES = {
    "sarathi": ("sg200.json", "sarathi"),
    "vllm": ("sg200.json", "vllm"),
    "opt_d10": ("sg200d10.json", "opt_d10.schedule.json"),
    "sarathi_d10": ("sg200d10.json", "sarathi"),
}


def case_schedule(instance, source: str):
    if source.endswith(".json"):
        schedule = load_schedule(DATA / source, instance)
    else:
        schedule = simulate(instance, make_policy(source)).schedule
    replay(instance, schedule)  # every schedule is validated
    return schedule


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fit", default="sarathi", choices=sorted(CASES), help="case the model is fitted to")
    ap.add_argument("--form", default="stepped", choices=("stepped", "linear"))
    args = ap.parse_args()

    fit = fit_replay(DATA / f"{args.fit}.csv", form=args.form)
    console = Console()
    console.print(
        f"fitted to {args.fit} ({fit.table.measured.size} batches, {args.form}): R² {fit.r2:.3f}, "
        f"held out (10-fold) mean {100 * fit.held_out.mean:.1f}%"
    )
    meta = fit.table.meta
    console.print(
        f"{meta.get('device_name')}, torch {meta.get('torch')}, CUDA {meta.get('cuda')}, {meta.get('dtype')}, "
        f"{meta.get('model')} ({meta.get('layers')} layers)"
    )
    table = Table(title="batch time and end-to-end error, before and after calibration")
    for col in (
        "case",
        "batches",
        "before mean",
        "after mean",
        "after p50",
        "after p90",
        "mean latency",
        "makespan",
    ):
        table.add_column(col, justify="right")
    for name, (inst_file, source) in CASES.items():
        rt = read_replay(DATA / f"{name}.csv")
        instance = load_instance(DATA / inst_file)
        schedule = case_schedule(instance, source)
        if len(schedule) != rt.measured.size:
            raise SystemExit(
                f"{name}: {len(schedule)} batches in the schedule, {rt.measured.size} in the table"
            )
        predicted = np.array([fit.cost.time_of(f) for f in rt.features])
        before = ErrorSummary.of(rt.measured, rt.predicted)
        after = ErrorSummary.of(rt.measured, predicted)
        e2e = end_to_end(instance, schedule, rt.measured, predicted)
        table.add_row(
            name + (" (fit)" if name == args.fit else ""),
            str(after.n),
            f"{100 * before.mean:.1f}%",
            f"{100 * after.mean:.1f}%",
            f"{100 * after.p50:.1f}%",
            f"{100 * after.p90:.1f}%",
            f"{100 * e2e.loc['mean_latency', 'rel_err']:.1f}%",
            f"{100 * e2e.loc['makespan', 'rel_err']:.1f}%",
        )
    console.print(table)


if __name__ == "__main__":
    main()
