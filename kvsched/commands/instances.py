"""``kvsched generate`` and ``kvsched info``: make and describe instances."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvsched.commands.common import (
    add_cost_args,
    add_limit_args,
    atomic_output,
    check_output_path,
    check_outputs,
    limits_from_args,
    load_instance_from_args,
    positive_int,
    seed_int,
    time_model_from_args,
)
from kvsched.errors import InputError
from kvsched.instances.model import DEFAULT_KV_CAPACITY, TimeModel


def cmd_generate(args: argparse.Namespace) -> int:
    from kvsched.instances.generators import generate, parse_params
    from kvsched.instances.io import check_instance, check_instance_path, save_instance

    params = parse_params(args.kind, args.param or [])
    limits = limits_from_args(args)
    if limits is None:  # unreachable: --kv-capacity has a default here
        raise InputError("--kv-capacity is required")
    time_model = time_model_from_args(args, TimeModel("unit")) or TimeModel("unit")
    check_outputs(args, ["out"], kind="instance")
    if args.out:
        check_instance_path(args.out)
    instance = generate(args.kind, n=args.n, seed=args.seed, limits=limits, time_model=time_model, **params)
    # What loading the file back would check (ranges, cost-model parameters), before it is written.
    check_instance(instance, f"generate {args.kind}")
    instance.check_feasible()
    out = Path(args.out) if args.out else Path(f"{instance.name or args.kind}.json")
    check_output_path(out, "--out", kind="instance")
    with atomic_output(out, "--out") as tmp:
        save_instance(instance, tmp)
    n = len(instance)
    # markup=False: a path holding "[...]" is text to show, not rich markup (it crashed, or printed wrong).
    Console(stderr=True).print(
        f"wrote {n} request{'' if n == 1 else 's'} to {out}", markup=False, highlight=False, soft_wrap=True
    )
    source = instance.meta.get("source") if isinstance(instance.meta, dict) else None
    if isinstance(source, dict) and source.get("with_replacement"):
        # (The help says "without replacement": past the pool some pairs repeat, and the user should know.)
        print(
            f"kvsched generate: note: {n} requests from {source.get('eligible_pairs')} eligible pairs: "
            "drawn with replacement, so some pairs repeat",
            file=sys.stderr,
        )
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    import numpy as np

    instance = load_instance_from_args(args.instance, args)
    reqs = instance.requests
    lim = instance.limits
    prompt = np.array([r.prompt for r in reqs])
    output = np.array([r.output for r in reqs])
    arrival = np.array([r.arrival for r in reqs])
    peak = prompt + output - 1
    console = Console()
    # escape: a name or path holding "[...]" is text to show, not rich markup.
    head = Table(title=f"instance {escape(instance.name or args.instance)}", show_header=False)
    head.add_row("requests", str(len(reqs)))
    head.add_row("arrivals", f"{arrival.min():g} .. {arrival.max():g}")
    head.add_row("KV capacity M", f"{lim.kv_capacity} tokens (block size {lim.block_size})")
    head.add_row("token budget C", str(lim.max_batch_tokens or "unlimited"))
    head.add_row("prefill budget P", str(lim.max_prefill_tokens or "unlimited"))
    head.add_row("max running", str(lim.max_running or "unlimited"))
    params = ", ".join(f"{k}={v:g}" for k, v in instance.time_model.params.items())
    head.add_row("time model", instance.time_model.name + (f" ({params})" if params else ""))
    head.add_row(
        "peak KV / M", f"max {peak.max() / lim.kv_capacity:.3f}, sum {peak.sum() / lim.kv_capacity:.2f}"
    )
    console.print(head)
    stats = Table(title="lengths (tokens)")
    for col in ("", "min", "mean", "p50", "p99", "max", "total"):
        stats.add_column(col, justify="right")
    for label, arr in (("prompt I", prompt), ("output O", output), ("peak KV I+O-1", peak)):
        stats.add_row(
            label,
            str(arr.min()),
            f"{arr.mean():.1f}",
            f"{np.percentile(arr, 50):g}",
            f"{np.percentile(arr, 99):g}",
            str(arr.max()),
            str(arr.sum()),
        )
    console.print(stats)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``kvsched`` parser."""
    from kvsched.instances.generators import GENERATORS, describe

    p = sub.add_parser(
        "generate",
        help="generate an instance file",
        description="Generate a seeded instance: synthetic, InferMax grids and mixes, real ShareGPT pairs or "
        "Azure production traces. kvsched generate KIND --help lists KIND's parameters.",
    )
    kinds = p.add_subparsers(dest="kind", metavar="KIND", required=True)
    for kind, spec in GENERATORS.items():
        k = kinds.add_parser(
            kind,
            help=spec.summary,
            description=f"Generate {'an' if kind[0] in 'aeiou' else 'a'} {kind} instance: {spec.summary}.",
            epilog=describe(kind),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        k.add_argument("--n", type=positive_int, default=100, help="number of requests (default 100)")
        k.add_argument("--seed", type=seed_int, default=0, help="random seed (default 0)")
        k.add_argument(
            "--param", action="append", metavar="K=V", help="generator parameter (repeatable; listed below)"
        )
        k.add_argument("--out", "-o", help="output file (default: the instance's name .json)")
        add_limit_args(k, default_kv=DEFAULT_KV_CAPACITY)
        add_cost_args(k)
        k.set_defaults(func=cmd_generate)

    p = sub.add_parser(
        "info", help="summarise an instance", description="Summarise an instance file or CSV trace."
    )
    p.add_argument("instance", help="instance .json or trace .csv")
    add_limit_args(p)
    add_cost_args(p)
    p.set_defaults(func=cmd_info)
