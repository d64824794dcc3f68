"""Time the simulator: N ShareGPT-like requests through each policy (run by hand, not a test).

Usage::

    python benchmarks/simulate.py                       # 10,000 requests, every policy
    python benchmarks/simulate.py -p sarathi --profile  # one policy, with the top cProfile entries
    python benchmarks/simulate.py --rate 20             # Poisson arrivals (requests per second)

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
import sys

from rich.console import Console
from rich.table import Table

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
    args = parser.parse_args(argv)

    inst, source = build_instance(args)
    prompts = [r.prompt for r in inst.requests]
    outputs = [r.output for r in inst.requests]
    console = Console()
    arrivals = f"Poisson {args.rate:g}/s" if args.rate else "all at 0"
    console.print(
        f"{len(inst)} requests ({source}): mean prompt {sum(prompts) / len(inst):.0f}, "
        f"mean output {sum(outputs) / len(inst):.0f}; M = {args.kv_capacity}, "
        f"arrivals {arrivals}, cost model {args.cost_model}"
    )
    table = Table("policy", "batches", "evictions", "runtime s", "requests/s", "batches/s", "makespan")
    for name in args.policy or list(POLICIES):
        policy = make_policy(name)
        profiler = cProfile.Profile() if args.profile else None
        if profiler is not None:
            profiler.enable()
        result = simulate(inst, policy)
        if profiler is not None:
            profiler.disable()
        batches = len(result.schedule)
        table.add_row(
            name,
            str(batches),
            str(int(result.trace.state.evictions.sum())),
            f"{result.runtime:.2f}",
            f"{len(inst) / result.runtime:,.0f}",
            f"{batches / result.runtime:,.0f}",
            f"{result.schedule.makespan:.1f}",
        )
        if profiler is not None:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
            console.print(f"[bold]{name}[/bold] (profiled: times include profiler overhead)")
            print(out.getvalue())
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
