"""``kvsched bound``: bounds that hold for every schedule of an instance, without solving."""

from __future__ import annotations

import argparse
import math
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvsched.commands.common import (
    add_cost_args,
    add_limit_args,
    check_outputs,
    load_instance_from_args,
    note_late,
    time_unit,
)
from kvsched.commands.outputs import write_json
from kvsched.errors import InputError
from kvsched.stop import Deadline


def _combinatorial(instance: Any) -> dict[str, float]:
    from kvsched.csp.bounds import lower_bounds

    lb = lower_bounds(instance)
    return {
        "total-latency (lower)": lb.total_latency,
        "makespan (lower)": lb.makespan,
        "sum-ttft (lower)": lb.sum_ttft,
        "isolated service (total latency)": lb.isolated,
        "KV area (total latency)": lb.area,
        "KV area (makespan)": lb.makespan_area,
        "token work (makespan)": lb.makespan_tokens,
    }


def _fluid(instance: Any, args: argparse.Namespace) -> dict[str, Any]:
    from kvsched.heuristics.fluid import eq1_coefficients, fluid_bound, instance_types

    if args.d0 is not None or args.d1 is not None:
        if args.d0 is None or args.d1 is None:
            raise InputError("--d0/--d1: give both, or neither to read them from the instance's time model")
        d0, d1 = args.d0, args.d1
    else:
        try:
            d0, d1 = eq1_coefficients(instance.time_model)
        except InputError as exc:
            raise InputError(f"{exc} (--d0, --d1)") from None
    types = instance_types(instance)
    # A burst (every arrival at once) or --saturated: the finite-run bound, total weight over makespan.
    saturated = args.saturated or not all(r < float("inf") for r in types.rates)
    fb = fluid_bound(
        None if saturated else types.rates,
        types.prompt,
        types.output,
        d0,
        d1,
        instance.limits,
        objective=args.per,
        mix=types.count if saturated else None,
    )
    return {
        f"throughput ({args.per} per time unit, upper)": fb.throughput,
        "iteration time at the optimum": fb.iteration_time,
        "KV held at the optimum": fb.memory,
        "binding": ", ".join(fb.binding),
        "regime": "saturated (finite run)" if saturated else "arrival rates from the instance",
        "types": len(types.count),
    }


#: Objectives the portfolio bounds, in the order printed.
_OBJECTIVES = ("total-latency", "makespan", "sum-ttft")


def _portfolio(instance: Any, deadline: Deadline) -> dict[str, Any]:
    """Every portfolio bound per objective (each valid for every legal schedule), best first."""
    from kvsched.csp.bounds import portfolio
    from kvsched.csp.bounds.portfolio import seconds_report

    out: dict[str, Any] = {}
    for objective in _OBJECTIVES:
        bounds = sorted(portfolio(instance, objective, deadline.share(1 / 3)), key=lambda b: -b.value)
        out[f"{objective} (lower, best)"] = bounds[0].value
        out[f"{objective}: best source"] = bounds[0].source
        for bound in bounds:
            out[f"{objective}: {bound.source}"] = bound.value
    report = None if _is_unit(instance) else seconds_report(instance, deadline)
    if report is not None:
        # What replacing the model's token term by its convex minorant gave up (0: the bounds are exact in form).
        out["convex-minorant gap (seconds bounds)"] = report.minorant_gap
    return out


def _is_unit(instance: Any) -> bool:
    from kvsched.costmodel import UnitCost
    from kvsched.schedule.validate import instance_cost_model

    return isinstance(instance_cost_model(instance), UnitCost)


def _check_fluid_flags(args: argparse.Namespace) -> None:
    """The fluid bound's flags, checked before any work: ``all`` must not drop a bad one as "not computed"."""
    given = [flag for flag, value in (("--d0", args.d0), ("--d1", args.d1)) if value is not None]
    if args.saturated:
        given.append("--saturated")
    if given and args.kind not in ("fluid", "all"):
        raise InputError(f"{given[0]}: applies to the fluid bound (kvsched bound fluid|all), not {args.kind}")
    if (args.d0 is None) != (args.d1 is None):
        raise InputError("--d0/--d1: give both, or neither to read them from the instance's time model")
    if args.d0 is not None and not (math.isfinite(args.d0) and args.d0 > 0):
        raise InputError(f"--d0: {args.d0:g} must be a positive, finite number (the per-batch time)")
    if args.d1 is not None and not (math.isfinite(args.d1) and args.d1 >= 0):
        raise InputError(f"--d1: {args.d1:g} must be a finite number >= 0 (the time per KV token)")


def cmd_bound(args: argparse.Namespace) -> int:
    check_outputs(args, ["json"], inputs=["instance"])
    _check_fluid_flags(args)
    deadline = Deadline.for_command(args.time_limit)
    instance = load_instance_from_args(args.instance, args)
    doc: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    # ``all`` prints every kind that applies to the instance and says which did not; a kind named alone must apply.
    if args.kind == "combinatorial" or (args.kind == "all" and _is_unit(instance)):
        doc["combinatorial"] = _combinatorial(instance)
    elif args.kind == "all":
        skipped.append(
            "combinatorial: needs the unit time model (the portfolio has the seconds-based bounds)"
        )
    if args.kind in ("portfolio", "all"):
        doc["portfolio"] = _portfolio(instance, deadline)
        if deadline.expired():  # the portfolio skips the stages it has no time to start, without a word
            skipped.append(
                "portfolio: the stages not started before --time-limit ran out (a larger limit computes them)"
            )
    if args.kind == "fluid":
        doc["fluid"] = _fluid(instance, args)
    elif args.kind == "all":
        try:
            doc["fluid"] = _fluid(instance, args)
        except InputError as exc:
            skipped.append(f"fluid: {exc}")
    computed = deadline.elapsed()
    console = Console()
    for kind, values in doc.items():
        table = Table(
            title=f"{kind} bounds on {escape(instance.name or args.instance)} ({time_unit(instance)})"
        )
        table.add_column("bound")
        table.add_column("value", justify="right")
        for key, value in values.items():
            table.add_row(key, f"{value:.6g}" if isinstance(value, float) else str(value))
        console.print(table)
    for line in skipped:
        console.print(f"not computed: {line}", soft_wrap=True, markup=False, highlight=False)
    if args.json:
        write_json(args.json, {**_summary(instance, doc, args), **doc})
    note_late(
        deadline,
        {"solved": computed},
        command="bound",
        stage="the bounds",
        reason="loading the instance and each kind's first stage run whatever the limit",
    )
    return 0


#: Machine-readable keys of the bounds ``kvsched bound`` prints, by (kind, printed label).
_SUMMARY_KEYS = {
    ("combinatorial", "total-latency (lower)"): "lower_bound_total_latency",
    ("combinatorial", "makespan (lower)"): "lower_bound_makespan",
    ("combinatorial", "sum-ttft (lower)"): "lower_bound_sum_ttft",
}


def _summary(instance: Any, doc: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Flat keys beside the printed tables: ``time_unit``, the lower bounds, the fluid throughput bound."""
    out: dict[str, Any] = {"command": "bound", "instance": instance.name, "time_unit": time_unit(instance)}
    if "portfolio" in doc:  # the best bound of all; the combinatorial ones are among the portfolio's
        for objective in _OBJECTIVES:
            out[f"lower_bound_{objective.replace('-', '_')}"] = doc["portfolio"][f"{objective} (lower, best)"]
    else:
        for (kind, label), key in _SUMMARY_KEYS.items():
            if kind in doc:
                out[key] = doc[kind][label]
    if "fluid" in doc:
        out["upper_bound_throughput"] = doc["fluid"][f"throughput ({args.per} per time unit, upper)"]
        out["throughput_per"] = f"{args.per} per {time_unit(instance)}"
    return out


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``kvsched`` parser."""
    p = sub.add_parser(
        "bound",
        help="bounds valid for every schedule: the solver's portfolio, combinatorial and seed 002's fluid throughput",
        description="Print bounds that hold for every legal schedule of INSTANCE, without solving. "
        "portfolio: every closed-form lower bound the certified pipeline starts from, per objective and source "
        "(any cost model; docs/bounds.md has each argument). "
        "combinatorial: lower bounds on total latency, makespan and sum of TTFT (unit time model). "
        "fluid: seed 002's upper bound on throughput, a linear-fractional program over request types, "
        "for the time model d0 + d1 * batch KV (read from the instance, or --d0/--d1).",
    )
    p.add_argument(
        "kind",
        choices=("portfolio", "combinatorial", "fluid", "all"),
        help="which bounds (all: every kind that applies)",
    )
    p.add_argument("instance", help="instance .json")
    p.add_argument("--per", choices=("tokens", "decode-tokens", "requests"), default="tokens")
    p.add_argument("--saturated", action="store_true", help="fluid: ignore arrival rates (a saturated queue)")
    p.add_argument("--d0", type=float, help="fluid: per-batch time (with --d1)")
    p.add_argument("--d1", type=float, help="fluid: time per KV token of the batch (with --d0)")
    p.add_argument(
        "--json",
        metavar="FILE",
        help="write the bounds here (time_unit, lower_bound_total_latency, ..., and every printed bound)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="wall clock for the whole command; portfolio stages not started by then are skipped (default 60)",
    )
    add_limit_args(p)
    add_cost_args(p)
    p.set_defaults(func=cmd_bound)
