"""Incumbents at scale: the eviction-aware greedy, best_incumbent and the LNS (run by hand, not a test).

Usage::

    python benchmarks/incumbents.py                      # every case
    python benchmarks/incumbents.py --case sharegpt-10k --limit 30
    python benchmarks/incumbents.py --lns 10             # LNS for 10 s on the cases with n <= 1000

Cases:

* ``sharegpt-10k``: ``kvsched generate sharegpt --n 10000`` (seed 0): unit time, all at 0, M = 100,000;
  notes 005 Sec. 2: greedy (smallest remaining area first) 2.8551e7, MBT bound 2.8474e7;
* ``sharegpt-1k-poisson``: 1,000 ShareGPT requests, Poisson arrivals at rate 0.5 per slot, M = 20,000
  (issue 15's arrival case); ``-budget``: the same with C = P = 2048;
* ``sharegpt-1k-linear``: 1,000 ShareGPT requests all at 0, M = 20,000, C = P = 512, ``infermax-linear``
  (batch times from the cost model, chunked prefill);
* ``sharegpt100-kv30`` / ``-kv20``: ``benchmarks/solve.py``'s ``sharegpt_scaled(100, 10)`` at KV 30% / 20% of
  the summed peaks; notes 005 Sec. 2.2: greedy about 3770 (KV 30%) against the time-indexed eviction-free
  optimum 3836 (LP 3817.5).

With ``--folder DIR`` it times instead the runs of the instances ``benchmarks/regret_scale.py`` wrote there
(``--rows``: their names; default the 1k rows with arrivals), the local search's raw material::

    python benchmarks/incumbents.py --folder DIR --lns 20
    python benchmarks/incumbents.py --folder DIR --rows sharegpt-10k-rho1 azure-conv-10k-rho1-c2048

One row per producer and instance: a run's seconds deciding (the kernel), building the schedule from its
log, valuing it on the log and replaying it through the core; then, where ``--lns`` is given, the local
search for that many seconds from the filling greedy's schedule: the candidates it simulated and kept and
the value it reached.

Columns: the first greedy (smallest remaining area first, preemptive) with its time split into deciding
(compiled kernel), building the Schedule and replaying it through the core; best_incumbent within
``--limit`` seconds (greedy variants, then the fast policies when the estimate fits); the best policy it
ran; the LNS when asked. Wall times are from a shared 2-core machine: read ratios.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from kvsched.csp.incumbents import greedy
from kvsched.csp.incumbents.base import Incumbent
from kvsched.csp.incumbents.best import best_incumbent
from kvsched.csp.incumbents.lns import improve
from kvsched.csp.incumbents.rules import kv_area
from kvsched.instances.generators import Poisson
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.instances.sharegpt import sharegpt
from kvsched.stop import Deadline


def _sharegpt(n: int, m: int, *, rate: float | None = None, budget: int | None = None, model: str = "unit"):
    limits = Limits(kv_capacity=m, max_batch_tokens=budget, max_prefill_tokens=budget)
    arrival = None if rate is None else Poisson(rate)
    return sharegpt(n, 0, limits, TimeModel(model), arrival=arrival)


def _scaled(n: int, div: int, kv_fraction: float) -> Instance:
    """As ``benchmarks/solve.py``'s ``sharegpt_scaled`` (lengths / div, all at 0, KV a share of the peaks)."""
    raw = sharegpt(n, 0, Limits(kv_capacity=10**7))
    reqs = tuple(
        Request(r.id, 0.0, max(1, round(r.prompt / div)), max(1, round(r.output / div))) for r in raw.requests
    )
    peaks = [r.prompt + r.output - 1 for r in reqs]
    kv = max(max(peaks), math.ceil(kv_fraction * sum(peaks)))
    return Instance(reqs, Limits(kv_capacity=kv), TimeModel("unit"), name=f"sharegpt-{n}/{div}")


CASES: dict[str, Callable[[], Instance]] = {
    "sharegpt-10k": lambda: _sharegpt(10_000, 100_000),
    "sharegpt-1k-poisson": lambda: _sharegpt(1_000, 20_000, rate=0.5),
    "sharegpt-1k-poisson-budget": lambda: _sharegpt(1_000, 20_000, rate=0.5, budget=2048),
    "sharegpt-1k-linear": lambda: _sharegpt(1_000, 20_000, budget=512, model="infermax-linear"),
    "sharegpt100-kv30": lambda: _scaled(100, 10, 0.3),
    "sharegpt100-kv20": lambda: _scaled(100, 10, 0.2),
}


#: The regret_scale rows ``--folder`` times by default.
ROWS = ("sharegpt-1k-rho1", "azure-conv-1k-rho1", "azure-code-1k-rho1", "azure-code-1k-rho1-c2048")


def _split(make: Callable[..., Any], inst: Instance) -> tuple[Incumbent, dict[str, float]]:
    """One run of ``make`` timed by part: deciding, building, valuing on the log, replaying (seconds); the
    run's replayed incumbent with them."""
    whole = make(inst)  # built and replayed
    unbuilt = make(inst, replay_schedule=False, build=False)  # valued on the log only
    parts = {k: float(whole.stats[k]) for k in ("decide_s", "build_s", "replay_s")}
    parts["value_s"] = float(unbuilt.stats.get("value_s", math.nan))
    return whole, parts


def timed_rows(folder: str, rows: list[str], lns: float, console: Console) -> None:
    """The ``--folder`` table: each producer's run split by part, and the local search's candidates."""
    from kvsched.csp.incumbents.knapsack import applies, knapsack
    from kvsched.instances import load_instance

    table = Table(title="runs by part (wall seconds on a shared 2-core machine: read ratios)")
    for col in ("row", "n", "producer", "value", "decide", "build", "value on log", "replay", "lns"):
        table.add_column(col, justify="left" if col in ("row", "producer", "lns") else "right")
    for row in rows:
        inst = load_instance(f"{folder}/{row}.json")
        producers: dict[str, Callable[..., object]] = {
            "greedy (filling)": lambda i, **kw: greedy(i, "remaining-area", fill=True, **kw)
        }
        if applies(inst):
            producers["knapsack"] = lambda i, **kw: knapsack(i, **kw)
        for name, make in producers.items():
            start, parts = _split(make, inst)
            searched = "-"
            if lns > 0 and name.startswith("greedy"):
                better = improve(inst, start, Deadline.after(lns), fill=True)
                searched = (
                    f"{better.stats['evaluations']} candidates, {better.stats['accepted']} kept: "
                    f"{start.value:.6g} -> {better.value:.6g}"
                )
            table.add_row(
                row, str(len(inst)), name, f"{start.value:.6g}",
                *(f"{parts[k]:.3f}" for k in ("decide_s", "build_s", "value_s", "replay_s")), searched,
            )  # fmt: skip
        console.print(f"done {row}", style="dim")
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="run only these cases")
    parser.add_argument(
        "--folder", help="time the runs of benchmarks/regret_scale.py's instances in this folder"
    )
    parser.add_argument("--rows", nargs="+", default=list(ROWS), help="with --folder: the instances' names")
    parser.add_argument("--limit", type=float, default=20.0, help="best_incumbent's deadline in seconds")
    parser.add_argument(
        "--lns",
        type=float,
        default=0.0,
        help="LNS seconds per case with n <= 1000 (0: none); with --folder per row",
    )
    args = parser.parse_args(argv)
    console = Console(width=220)
    t0 = time.perf_counter()
    greedy(_scaled(5, 1, 0.5))  # load the compiled kernel (from numba's cache, or compile it) once
    console.print(f"kernel ready in {time.perf_counter() - t0:.1f} s")
    if args.folder:
        from kvsched.errors import KvschedError

        try:
            timed_rows(args.folder, args.rows, args.lns, console)
        except KvschedError as exc:  # a missing or malformed instance file: one line, no traceback
            console.print(f"benchmarks/incumbents.py: error: {exc}", style="red", markup=False)
            return 2
        return 0
    table = Table(title="incumbents (wall seconds on a shared 2-core machine)")
    for col in (
        "case",
        "n",
        "greedy",
        "decide/build/replay s",
        "evictions",
        "best",
        "best by",
        "best s",
        "best policy",
        "lns",
    ):
        table.add_column(col, justify="left" if col in ("case", "best by", "best policy") else "right")
    for name in args.case or list(CASES):
        inst = CASES[name]()
        first = greedy(inst)
        split = "/".join(f"{first.stats[k]:.2f}" for k in ("decide_s", "build_s", "replay_s"))
        t0 = time.perf_counter()
        best = best_incumbent(inst, deadline=Deadline.after(args.limit))
        best_s = time.perf_counter() - t0
        policies = {k: v for k, v in best.stats["tried"].items() if k.startswith("policy:")}
        top = min(policies.items(), key=lambda kv: kv[1]) if policies else None
        lns = "-"
        if args.lns > 0 and len(inst) <= 1000:
            prompt = np.array([r.prompt for r in inst.requests])
            output = np.array([r.output for r in inst.requests])
            keys = kv_area(prompt, output)
            params = best.schedule.meta.get("params", {})
            better = improve(
                inst,
                best,
                Deadline.after(args.lns),
                keys=keys,
                preempt=params.get("preempt", True),
                lookahead=params.get("lookahead", 0),
            )
            lns = f"{better.value:.6g} ({better.stats['evaluations']} evals)"
        table.add_row(
            name,
            str(len(inst)),
            f"{first.value:.6g}",
            split,
            str(first.stats["evictions"]),
            f"{best.value:.6g}",
            best.name,
            f"{best_s:.1f}",
            f"{top[1]:.6g} {top[0]}" if top else f"- (skipped {len(best.stats['skipped'])})",
            lns,
        )
        console.print(f"done {name}", style="dim")
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
