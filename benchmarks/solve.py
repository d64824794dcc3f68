"""How large an instance the exact solvers prove optimal (run by hand, not a test).

Usage::

    python benchmarks/solve.py                          # every part, 60 s per solve, 2 threads
    python benchmarks/solve.py --part batch --solver highs
    python benchmarks/solve.py --part time --sizes 5,10,20,30

Parts:

* ``batch``: the batch-indexed model (chunked prefill and eviction allowed, unit
  time, total latency) on ShareGPT-shaped requests, all arriving at 0, with
  prompt and output lengths divided by ``--batch-div`` (default 40) and the KV
  capacity at 20% of the total peak demand (sum of I + O - 1, at least the
  largest peak): the tight-memory regime where evictions and chunking matter.
* ``figure15``: InferMax Fig. 15 (O = 4, 4 requests, M = max(2I, I + O - 1),
  unit time, makespan) with and without eviction: the optima are 11, 13, 14, 14
  batches with eviction and 16 without.
* ``time``: the time-indexed model (no chunking or eviction) on the same
  ShareGPT shape with lengths divided by ``--time-div`` (default 10) and the
  KV capacity at ``--kv-fraction`` of the total peak demand (default 0.4, 0.3
  and 0.2: the memory adds about 5%, 16% and 44% to the unconstrained total
  latency at n = 100). ``--baseline`` also runs each size without the local
  search and reduced-cost windows (windows from the objective alone), to show
  what they buy.

* ``deadline`` (run alone, not part of ``all``): ``benchmarks/deadline.py``'s
  table, ``kvsched solve --time-limit`` as its own process over 200 to 100,000
  ShareGPT requests, every formulation and back end: limit, wall time, their
  ratio, status, objective, bound, bound source and scope.

Each table row is one solve: status, objective, proven bound, gap, wall time
and model size. The last line of each part names the largest size proven
optimal within the time limit.
"""

from __future__ import annotations

import argparse
import math
import time

from rich.console import Console
from rich.table import Table

from kvsched.csp import SolverOptions, SolveStatus, solve
from kvsched.instances.generators import figure15_limits, infermax_grid
from kvsched.instances.model import Instance, Limits, Request, TimeModel


def sharegpt_scaled(n: int, div: int, *, seed: int = 0, kv_fraction: float = 0.2) -> Instance:
    """``n`` ShareGPT (prompt, output) pairs with lengths divided by ``div``, all at t = 0, tight KV."""
    from kvsched.instances.sharegpt import sharegpt

    raw = sharegpt(n, seed, Limits(kv_capacity=10**7))
    reqs = tuple(
        Request(r.id, 0.0, max(1, round(r.prompt / div)), max(1, round(r.output / div))) for r in raw.requests
    )
    peaks = [r.prompt + r.output - 1 for r in reqs]
    kv = max(max(peaks), math.ceil(kv_fraction * sum(peaks)))
    return Instance(reqs, Limits(kv_capacity=kv), TimeModel("unit"), name=f"sharegpt-{n}/{div}")


def _row(table: Table, label: str, inst: Instance, result, wall: float) -> None:
    gap = "-" if result.gap is None else f"{100 * result.gap:.1f}%"
    bound = "-" if result.best_bound is None else f"{result.best_bound:g}"
    table.add_row(
        label,
        str(len(inst)),
        str(inst.limits.kv_capacity),
        str(result.status),
        f"{result.objective:g}",
        bound,
        gap,
        f"{wall:.1f}",
        str(result.stats.get("variables", "-")),
        str(result.stats.get("horizon", "-")),
        _mean_window(result),
    )


def _mean_window(result) -> str:
    window = result.stats.get("mean_window")
    return "-" if window is None else f"{window:.1f}"


def _table(title: str) -> Table:
    table = Table(title=title)
    for col in (
        "instance",
        "n",
        "M",
        "status",
        "objective",
        "bound",
        "gap",
        "s",
        "vars",
        "horizon",
        "window",
    ):
        table.add_column(col, justify="right" if col not in ("instance", "status") else "left")
    return table


def run_family(
    console: Console,
    title: str,
    formulation: str,
    sizes: list[int],
    div: int,
    options: SolverOptions,
    solver: str,
    *,
    kv_fraction: float = 0.2,
    baseline: bool = False,
) -> None:
    table = _table(title)
    proven, open_ = [], []
    for n in sizes:
        inst = sharegpt_scaled(n, div, kv_fraction=kv_fraction)
        variants = [("", True), (" baseline", False)] if baseline else [("", True)]
        for suffix, strengthen in variants:
            t0 = time.perf_counter()
            extra = {} if formulation == "batch" else {"strengthen": strengthen}
            result = solve(inst, formulation=formulation, solver=solver, options=options, **extra)
            wall = time.perf_counter() - t0
            _row(table, inst.name + suffix, inst, result, wall)
            if suffix:
                continue
            if result.status == SolveStatus.OPTIMAL:
                proven.append(str(n))
            else:
                gap = "-" if result.gap is None else f"{100 * result.gap:.1f}%"
                open_.append(f"{n} ({gap})")
    console.print(table)
    # Each n is its own draw, so difficulty is not monotone in n: list both sides.
    console.print(
        f"proven optimal within {options.time_limit:g} s: n = {', '.join(proven) or 'none'}"
        f"{f' (largest {max(proven, key=int)})' if proven else ''}; open (gap): {', '.join(open_) or 'none'}\n"
    )


def run_figure15(console: Console, options: SolverOptions, solver: str) -> None:
    table = _table(f"Figure 15, batch-indexed / {solver}, makespan (expected 11, 13, 14, 14 | 16)")
    for evict in (True, False):
        for prompt in (1, 2, 3, 4):
            inst = infermax_grid(prompt, 4, 4, figure15_limits(prompt, 4))
            t0 = time.perf_counter()
            result = solve(
                inst,
                formulation="batch",
                objective="makespan",
                solver=solver,
                options=options,
                allow_eviction=evict,
            )
            _row(
                table,
                f"I={prompt} {'evict' if evict else 'no-evict'}",
                inst,
                result,
                time.perf_counter() - t0,
            )
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--part",
        choices=("all", "batch", "figure15", "time", "deadline"),
        default="all",
        help="deadline (not in all): benchmarks/deadline.py's wall-clock table, --sizes and --time-limit passed on",
    )
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--solver", default=None, help="back end (default cpsat for batch, highs for time)")
    parser.add_argument("--sizes", default=None, help="comma-separated request counts")
    parser.add_argument("--batch-div", type=int, default=40)
    parser.add_argument("--time-div", type=int, default=10)
    parser.add_argument(
        "--kv-fraction",
        default="0.4,0.3,0.2",
        help="time part: comma-separated KV capacities as fractions of the total peak demand",
    )
    parser.add_argument("--baseline", action="store_true", help="time part: also run without strengthening")
    args = parser.parse_args(argv)
    if args.part == "deadline":  # issue 14's table: the whole command's wall time, per size and back end
        from deadline import main as deadline_main  # benchmarks/ is the script's folder, first on sys.path

        limit = ["--limit", f"{args.time_limit:g}"] + (["--sizes", args.sizes] if args.sizes else [])
        return deadline_main(limit + (["--solvers", args.solver] if args.solver else []))
    options = SolverOptions(time_limit=args.time_limit, threads=args.threads)
    console = Console(width=140)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else None
    if args.part in ("all", "figure15"):
        run_figure15(console, options, args.solver or "cpsat")
    if args.part in ("all", "batch"):
        solver = args.solver or "cpsat"
        run_family(
            console,
            f"batch-indexed / {solver}: chunking + eviction, ShareGPT lengths / {args.batch_div}, "
            "KV 20% of demand, total latency",
            "batch",
            sizes or [2, 3, 4, 5, 6, 8, 10, 12, 15],
            args.batch_div,
            options,
            solver,
        )
    if args.part in ("all", "time"):
        solver = args.solver or "highs"
        for fraction in (float(f) for f in args.kv_fraction.split(",")):
            run_family(
                console,
                f"time-indexed / {solver}: no chunking or eviction, ShareGPT lengths / {args.time_div}, "
                f"KV {100 * fraction:g}% of demand, total latency",
                "time",
                sizes or [10, 25, 50, 75, 100],
                args.time_div,
                options,
                solver,
                kv_fraction=fraction,
                baseline=args.baseline,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
