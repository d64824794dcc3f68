"""``kvsched validate`` and ``kvsched convert``: check and translate schedules."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from kvsched.commands.common import (
    EXIT_INVALID,
    add_cost_args,
    add_limit_args,
    atomic_output,
    check_outputs,
    load_instance_from_args,
    positive_int,
    time_unit,
    write_text_atomic,
)
from kvsched.errors import InputError


def cmd_validate(args: argparse.Namespace) -> int:
    from kvsched.costmodel import make_cost_model
    from kvsched.schedule.io import load_schedule
    from kvsched.schedule.validate import replay, validate

    instance = load_instance_from_args(args.instance, args)
    schedule = load_schedule(args.schedule, instance)
    if args.measured:
        trace = replay(instance, schedule, strict=False, check_durations=False)
    else:
        tm = instance.time_model
        trace = validate(instance, schedule, make_cost_model(tm.name, tm.params))
    console = Console()
    if trace.violations:
        shown = trace.violations[: args.max_violations]
        for v in shown:
            # One line each, not cut at 80 columns when piped: a script reads a violation a line.
            console.print(str(v), markup=False, highlight=False, soft_wrap=True)
        more = len(trace.violations) - len(shown)
        tail = f" ({more} not shown)" if more > 0 else ""
        Console(stderr=True).print(
            f"INVALID: {len(trace.violations)} violation(s) in {len(schedule)} batches{tail}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return EXIT_INVALID
    console.print(
        f"valid: {len(schedule)} batches, {len(instance)} requests, makespan {schedule.makespan:g}",
        soft_wrap=True,
    )
    if args.metrics:
        from kvsched.schedule.metrics import print_summary

        print_summary(trace, console=console, unit=time_unit(instance))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from kvsched.schedule.io import infermax_document, load_schedule, save_schedule

    if args.to == "infermax" and Path(args.out).suffix.lower() == ".npz":
        # load_schedule reads a .npz file as a columnar kvsched schedule: InferMax's JSON there reads back as
        # neither.
        raise InputError(
            f"--out: {Path(args.out).name}: the InferMax format is JSON, and a .npz file is read as a columnar "
            "kvsched schedule; use .json (or --to kvsched)"
        )
    check_outputs(args, ["out"], inputs=["instance", "schedule"])
    instance = load_instance_from_args(args.instance, args)
    schedule = load_schedule(args.schedule, instance)
    from kvsched.schedule.validate import replay

    # A converted file is read as a schedule of INSTANCE: an illegal one (often: another instance's) is not
    # written. Durations are not checked: a measured schedule converts as it is.
    trace = replay(instance, schedule, strict=False, check_durations=False)
    if trace.violations:
        print(
            f"INVALID: {args.schedule} is not a legal schedule of {args.instance} "
            f"({len(trace.violations)} violation(s), the first: {trace.violations[0]}); nothing written "
            f"(kvsched validate lists them)",
            file=sys.stderr,
        )
        return EXIT_INVALID
    if args.to == "infermax":
        write_text_atomic(args.out, json.dumps(infermax_document(schedule, instance)) + "\n", "--out")
    else:
        with atomic_output(args.out, "--out") as tmp:
            save_schedule(schedule, instance, tmp)
    Console(stderr=True).print(  # one line whatever the path's length; its brackets are not markup
        f"wrote {len(schedule)} batches to {args.out} ({args.to} format)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``kvsched`` parser."""
    p = sub.add_parser(
        "validate",
        help="check a schedule against the exact semantics",
        description="Replay SCHEDULE on INSTANCE through the semantic core and report every violation "
        "(batch index, request id, rule). Exit 0 if legal, 1 if not, 2 on bad input.",
    )
    p.add_argument("instance", help="instance .json (or trace .csv with --kv-capacity)")
    p.add_argument("schedule", help="schedule .json (kvsched or InferMax format)")
    p.add_argument("--max-violations", type=positive_int, default=50, help="violations to print (default 50)")
    p.add_argument("--metrics", action="store_true", help="print the metrics summary of a legal schedule")
    p.add_argument(
        "--measured",
        action="store_true",
        help="durations are measured: do not check them against the cost model",
    )
    add_limit_args(p)
    add_cost_args(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "convert",
        help="convert a schedule between kvsched and InferMax formats",
        description="Read SCHEDULE (either format) and write it in the format --to names.",
    )
    p.add_argument("instance", help="instance .json")
    p.add_argument("schedule", help="schedule .json (kvsched or InferMax format)")
    p.add_argument("--to", choices=("kvsched", "infermax"), required=True, help="output format")
    p.add_argument("--out", "-o", required=True, help="output file")
    add_cost_args(p)
    p.set_defaults(func=cmd_convert)
