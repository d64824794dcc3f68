"""The bounds portfolio on the instances of issue 15 (run by hand, not a test).

Usage::

    python benchmarks/bounds.py              # every case, one row per case and bound
    python benchmarks/bounds.py --case sharegpt-10k --repeat 5
    python benchmarks/bounds.py --case azure-conv-1k-linear --policies sarathi,rank-i   # with an incumbent

Cases:

* ``sharegpt-10k``: ``kvsched generate sharegpt --n 10000`` (seed 0): unit time, all at 0, M = 100,000;
  ``shared/notes/005`` Sec. 2 gives MBT 2.8474e7 against the combinatorial 2.7268e7;
* ``sharegpt-10k-poisson-R``: the same lengths with Poisson arrivals at rate R per slot (notes Sec. 2.1);
* ``sharegpt-10k-budget``: all at 0 with C = P = 2048;
* ``azure-conv-1k-<model>``: the first 1,000 Azure conversation requests
  (``shared/data/traces/splitwise_conv.csv``), all at 0, M = 40,000, C = P = 512, under
  ``infermax-linear``, the shipped stepped set ``llama-2-7b_a100-80gb_tp1`` and ``roofline``;
* ``sharegpt<n>-linear-chunked-kv<k>``: n = 100, 200 ShareGPT requests with lengths / 10, all at 0,
  KV k% of the summed peaks, ``infermax-linear``, C = P = 64 (issue 15's target (b)).

Columns: the bound, its source, its value, and the wall time of ``portfolio()`` for the whole case (best of
``--repeat``; the machine is shared, so read ratios). ``today`` is ``lower_bounds()`` of commit 7987e18's
``csp/bounds.py`` (unit time only, isolated bound with O - 1 batches when there is no budget).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from kvsched.costmodel.coeffile import resolve_cost_model
from kvsched.csp.bounds import portfolio, seconds_report
from kvsched.csp.objectives import total_latency
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.generators import Poisson
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.instances.sharegpt import sharegpt
from kvsched.schedule.validate import replay

TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "splitwise_conv.csv"


def _sharegpt(rate: float | None = None, budget: int | None = None) -> Instance:
    limits = Limits(kv_capacity=100_000, max_batch_tokens=budget, max_prefill_tokens=budget)
    arrival = None if rate is None else Poisson(rate)
    return sharegpt(10_000, 0, limits, TimeModel("unit"), arrival=arrival)


def _azure(model: str) -> Instance:
    name, params = resolve_cost_model(model)
    df = pd.read_csv(TRACE).head(1000)
    reqs = tuple(
        Request(f"r{k}", 0.0, int(i), int(o)) for k, (_, i, o) in enumerate(df.itertuples(index=False))
    )
    return Instance(
        reqs,
        Limits(kv_capacity=40_000, max_batch_tokens=512, max_prefill_tokens=512),
        TimeModel(name, params),
    )


def _scaled_linear(n: int, kv_fraction: float) -> Instance:
    """benchmarks/solve.py's ``sharegpt_scaled`` (lengths / 10, all at 0, KV a share of the summed peaks),
    under ``infermax-linear`` with chunking (C = P = 64): issue 15's target (b)."""
    raw = sharegpt(n, 0, Limits(kv_capacity=10**7))
    reqs = tuple(
        Request(r.id, 0.0, max(1, round(r.prompt / 10)), max(1, round(r.output / 10))) for r in raw.requests
    )
    peaks = [r.prompt + r.output - 1 for r in reqs]
    kv = max(max(peaks), math.ceil(kv_fraction * sum(peaks)))
    limits = Limits(kv_capacity=kv, max_batch_tokens=64, max_prefill_tokens=64)
    return Instance(reqs, limits, TimeModel("infermax-linear"))


CASES: dict[str, Callable[[], Instance]] = {
    "sharegpt-10k": _sharegpt,
    "sharegpt-10k-poisson-0.5": lambda: _sharegpt(0.5),
    "sharegpt-10k-poisson-0.75": lambda: _sharegpt(0.75),
    "sharegpt-10k-poisson-0.9": lambda: _sharegpt(0.9),
    "sharegpt-10k-budget": lambda: _sharegpt(budget=2048),
    "azure-conv-1k-linear": lambda: _azure("infermax-linear"),
    "azure-conv-1k-a100-stepped": lambda: _azure("llama-2-7b_a100-80gb_tp1"),
    "azure-conv-1k-roofline": lambda: _azure("roofline"),
    **{
        f"sharegpt{n}-linear-chunked-kv{round(100 * kv)}": (lambda n=n, kv=kv: _scaled_linear(n, kv))
        for n in (100, 200)
        for kv in (0.2, 0.3, 0.4)
    },
}


def _today(instance: Instance) -> float | None:
    """The bound before issue 15 (commit 7987e18's ``csp/bounds.py``): unit time only, and its isolated
    bound counted ceil(I / q) prefill batches, 0 when there is no budget."""
    if instance.time_model.name != "unit":
        return None
    lim = instance.limits
    prompt = np.array([r.prompt for r in instance.requests], dtype=float)
    output = np.array([r.output for r in instance.requests], dtype=float)
    arrival = np.array([r.arrival for r in instance.requests], dtype=float)
    chunk = min(c for c in (lim.max_batch_tokens, lim.max_prefill_tokens, math.inf) if c is not None)
    alone = arrival + np.ceil(prompt / chunk) + output - 1
    area = output * prompt + output * (output - 1) / 2
    by_area = arrival.min() + np.ceil(np.cumsum(np.sort(area)) / lim.kv_capacity)
    combined = float(np.maximum(np.sort(alone), by_area).sum() - arrival.sum())
    return max(combined, float((alone - arrival).sum()))


def _incumbent(instance: Instance, policies: list[str]) -> tuple[str, float] | None:
    """The best validated total latency among ``policies`` (each replayed through the core)."""
    best: tuple[str, float] | None = None
    for name in policies:
        trace = replay(instance, simulate(instance, make_policy(name)).schedule)
        value = total_latency(trace)
        if best is None or value < best[1]:
            best = (name, value)
    return best


def run(names: list[str], repeat: int, policies: list[str]) -> None:
    table = Table(title="bounds portfolio (total latency)")
    for col in ("case", "n", "cost model", "source", "bound", "vs today", "portfolio s", "minorant gap"):
        table.add_column(col, justify="right" if col not in ("case", "source", "cost model") else "left")
    for name in names:
        inst = CASES[name]()
        best_time = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            bounds = portfolio(inst, "total-latency")
            best_time = min(best_time, time.perf_counter() - t)
        today = _today(inst)
        report = None if inst.time_model.name == "unit" else seconds_report(inst)
        gap = "" if report is None else f"{report.minorant_gap:.3f}"
        top = max(b.value for b in bounds)
        for k, b in enumerate(sorted(bounds, key=lambda b: -b.value)):
            mark = "*" if b.value == top else ""
            vs = "" if not today else f"{(b.value / today - 1) * 100:+.2f}%"
            table.add_row(
                name if k == 0 else "",
                str(len(inst)) if k == 0 else "",
                inst.time_model.name if k == 0 else "",
                b.source + mark,
                f"{b.value:.6g}",
                vs,
                f"{best_time:.3f}" if k == 0 else "",
                gap if k == 0 else "",
            )
        if today:
            table.add_row("", "", "", "today (combinatorial)", f"{today:.6g}", "", "", "")
        inc = _incumbent(inst, policies) if policies else None
        if inc is not None:
            table.add_row(
                "",
                "",
                "",
                f"incumbent: {inc[0]} (gap to best bound)",
                f"{inc[1]:.6g}",
                f"{(inc[1] / top - 1) * 100:.2f}%",
                "",
                "",
            )
        table.add_section()
    Console(width=170).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--case", action="append", choices=sorted(CASES), help="run only this case (repeatable)"
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--policies", default="", help="comma-separated policies to simulate for an incumbent"
    )
    args = parser.parse_args()
    run(args.case or list(CASES), args.repeat, [p for p in args.policies.split(",") if p])


if __name__ == "__main__":
    main()
