"""The chain Lagrangian bound against the best fast policy (run by hand, not a test).

Usage::

    python benchmarks/lagrangian.py                          # every part, 60 s per bound
    python benchmarks/lagrangian.py --part scaled
    python benchmarks/lagrangian.py --part poisson --sizes 1000 --rates 0.65,0.8

Parts:

* ``scaled``: ``benchmarks/solve.py``'s ``sharegpt_scaled`` instances (ShareGPT
  lengths / 10, all at 0, unit time), n = 50 and 100, KV at 20/30/40% of the
  summed peaks.
* ``poisson``: ShareGPT, unit time, M = 100,000, Poisson arrivals at the rates
  of notes/005 section 2.1 (``kvsched generate sharegpt --param arrival=poisson
  --param rate=R``, seed 0), n = 1,000 and 10,000.

Each row: instance, n, KV share of the summed peaks, the chain-Lagrangian bound
(valid for every schedule, evictions included), the incumbent (the best of
``--policies``, each run through the simulator and the core), the certified gap,
the bound's wall time (the policies' time is separate) and its pricing calls.
The numba kernels compile on the first run (about 30 s, cached afterwards): run
once before timing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvsched.csp.bounds import chain_lagrangian
from kvsched.heuristics import make_policy, simulate
from kvsched.instances.generators import generate
from kvsched.instances.model import Instance, Limits, TimeModel
from kvsched.stop import Deadline

sys.path.insert(0, str(Path(__file__).parent))
from solve import sharegpt_scaled

POLICIES = "kfcfs-sr,mcsf,rank-o,sarathi"


def best_policy(inst: Instance, names: list[str]):
    """The best (total latency) of ``names`` on ``inst``: (value, name, trace, seconds)."""
    best = None
    tic = time.perf_counter()
    for name in names:
        trace = simulate(inst, make_policy(name)).trace
        value = float((trace.state.completion - trace.state.arrival).sum())
        if best is None or value < best[0]:
            best = (value, name, trace)
    return (*best, time.perf_counter() - tic)


def row(table: Table, label: str, inst: Instance, args: argparse.Namespace) -> None:
    value, name, trace, sim_s = best_policy(inst, args.policies.split(","))
    peaks = sum(r.peak_kv for r in inst.requests)
    result = chain_lagrangian(inst, incumbent=trace, deadline=Deadline.after(args.limit))
    bound = result.bound.value
    cells = (
        label,
        str(len(inst)),
        f"{100 * inst.limits.kv_capacity / peaks:.0f}%",
        f"{bound:.0f}",
        f"{value:.0f} ({name})",
        f"{100 * (value - bound) / value:.2f}%",
        f"{result.seconds:.1f}",
        str(result.iterations),
        f"{sim_s:.1f}",
    )
    table.add_row(*cells)
    print(" | ".join(cells), flush=True)  # each row as it comes (the table is printed at the end)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=["scaled", "poisson", "all"], default="all")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds per bound (default 60)")
    parser.add_argument("--sizes", default="1000,10000", help="poisson part: request counts")
    parser.add_argument(
        "--rates", default="0.5,0.65,0.75,0.8,0.9", help="poisson part: arrival rates per slot"
    )
    parser.add_argument("--policies", default=POLICIES, help=f"incumbent candidates (default {POLICIES})")
    args = parser.parse_args()

    table = Table(title="chain Lagrangian (valid for every schedule) vs the best fast policy, unit time")
    for col in (
        "instance",
        "n",
        "KV share",
        "bound",
        "incumbent",
        "gap",
        "bound s",
        "pricings",
        "policies s",
    ):
        table.add_column(col, justify="right")
    console = Console(width=170)
    if args.part in ("scaled", "all"):
        for n in (50, 100):
            for share in (0.2, 0.3, 0.4):
                inst = sharegpt_scaled(n, 10, kv_fraction=share)
                row(table, f"sharegpt_scaled/10 KV {share:.0%}", inst, args)
    if args.part in ("poisson", "all"):
        for n in (int(s) for s in args.sizes.split(",")):
            for rate in (float(r) for r in args.rates.split(",")):
                inst = generate(
                    "sharegpt",
                    n=n,
                    seed=0,
                    limits=Limits(kv_capacity=100_000),
                    time_model=TimeModel("unit"),
                    arrival="poisson",
                    rate=rate,
                )
                row(table, f"sharegpt poisson {rate:g}/slot", inst, args)
    console.print(table)


if __name__ == "__main__":
    main()
