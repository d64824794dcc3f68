"""Time the simulator: N ShareGPT-like requests through each policy (run by hand, not a test).

Usage::

    python benchmarks/simulate.py                       # 10,000 requests, every policy
    python benchmarks/simulate.py -p sarathi --profile  # one policy, with the top cProfile entries
    python benchmarks/simulate.py --rate 20             # Poisson arrivals (requests per second)
    python benchmarks/simulate.py -p sarathi --repeat 3 # best of 3 runs

Wall time and CPU time (``time.process_time``) are both printed, each the best
of ``--repeat`` runs: on a shared machine the CPU time is the steadier figure,
and the rates are computed from it.

Requests come from :mod:`kvsched.instances.sharegpt` when it can be used (the
packaged ShareGPT file), otherwise from a lognormal synthetic trace with
ShareGPT-like means (prompt ~ 250, output ~ 200 tokens). Limits default to
InferMax's Llama-2-7B setting (M = 100K, C = 4096) and the ``infermax-linear``
cost model, so arrival rates are per second.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import sys
import time

from rich.console import Console
from rich.table import Table

from kvsched.errors import KvschedError
from kvsched.heuristics import POLICIES, make_policy, simulate
from kvsched.instances.generators import LogNormal, Poisson, SemiOnline, synthetic
from kvsched.instances.model import Instance, Limits, TimeModel


def build_instance(args: argparse.Namespace) -> tuple[Instance, str]:
    limits = Limits(kv_capacity=args.kv_capacity, block_size=args.block_size, max_batch_tokens=4096)
    time_model = TimeModel(args.cost_model)
    arrival = Poisson(args.rate) if args.rate else SemiOnline()
    if args.source in ("auto", "sharegpt"):
        try:
            from kvsched.instances.sharegpt import sharegpt

            inst = sharegpt(args.n, args.seed, limits, time_model, arrival=arrival)
            return inst, "sharegpt"
        except Exception as exc:  # the trace is optional: any failure falls back to synthetic
            if args.source == "sharegpt":
                raise
            print(f"(ShareGPT unavailable: {type(exc).__name__}: {exc}; using the synthetic trace)")
    # Lengths capped at 2048 so that a whole refill (I + O - 1) fits P = C = 4096.
    inst = synthetic(
        args.n,
        args.seed,
        limits,
        time_model,
        arrival=arrival,
        prompt=LogNormal.from_mean(250, sigma=1.0, max=2048),
        output=LogNormal.from_mean(200, sigma=1.0, max=2048),
    )
    return inst, "synthetic lognormal"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=10_000, help="requests (default 10000)")
    parser.add_argument("-p", "--policy", action="append", help="policy to time (repeatable; default all)")
    parser.add_argument("--rate", type=float, default=None, help="Poisson arrival rate; default all at t=0")
    parser.add_argument("--kv-capacity", type=int, default=100_000)
    parser.add_argument("--block-size", type=int, default=1)
    parser.add_argument("--cost-model", default="infermax-linear")
    parser.add_argument("--source", choices=("auto", "sharegpt", "synthetic"), default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="print the top cProfile entries per policy")
    parser.add_argument("--top", type=int, default=25, help="cProfile entries to print")
    parser.add_argument("--repeat", type=int, default=1, help="runs per policy; the best times are shown")
    args = parser.parse_args(argv)

    inst, source = build_instance(args)
    prompts = [r.prompt for r in inst.requests]
    outputs = [r.output for r in inst.requests]
    console = Console(width=max(120, shutil.get_terminal_size().columns))
    arrivals = f"Poisson {args.rate:g}/s" if args.rate else "all at 0"
    console.print(
        f"{len(inst)} requests ({source}): mean prompt {sum(prompts) / len(inst):.0f}, "
        f"mean output {sum(outputs) / len(inst):.0f}; M = {args.kv_capacity}, "
        f"arrivals {arrivals}, cost model {args.cost_model}"
    )
    table = Table(
        "policy", "batches", "evictions", "wall s", "CPU s", "requests/CPU s", "batches/CPU s", "makespan"
    )
    for name in args.policy or list(POLICIES):
        profiler = cProfile.Profile() if args.profile else None
        wall = cpu = float("inf")
        try:
            for _ in range(max(args.repeat, 1)):
                policy = make_policy(name)
                if profiler is not None:
                    profiler.enable()
                cpu_start = time.process_time()
                try:
                    result = simulate(inst, policy)
                finally:
                    cpu = min(cpu, time.process_time() - cpu_start)
                    if profiler is not None:
                        profiler.disable()
                wall = min(wall, result.runtime)
        except KvschedError as exc:  # some policies fail on some workloads (e.g. MC-SF clearing loops)
            console.print(f"{name}: failed after {cpu:.2f} CPU s: {exc}")
            table.add_row(name, "failed", "", "", f"{cpu:.2f}", "", "", "")
            continue
        batches = len(result.schedule)
        row = (
            name,
            str(batches),
            str(int(result.trace.state.evictions.sum())),
            f"{wall:.2f}",
            f"{cpu:.2f}",
            f"{len(inst) / cpu:,.0f}",
            f"{batches / cpu:,.0f}",
            f"{result.schedule.makespan:.1f}",
        )
        table.add_row(*row)
        if len(args.policy or POLICIES) > 1:
            console.print("  ".join(row))  # as it goes: the whole run takes a while
        if profiler is not None:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
            console.print(f"[bold]{name}[/bold] (profiled: times include profiler overhead)")
            print(out.getvalue())
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
