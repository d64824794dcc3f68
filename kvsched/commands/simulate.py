"""``kvsched policies`` and ``kvsched simulate``: run the published schedulers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvsched.commands.common import (
    add_cost_args,
    add_limit_args,
    atomic_output,
    check_outputs,
    collector_paused,
    keep_until_exit,
    load_instance_from_args,
    param_pairs,
    positive_int,
    seed_int,
    time_unit,
)
from kvsched.commands.outputs import (
    TraceMetrics,
    add_json_arg,
    add_slo_arg,
    add_trace_arg,
    slo_from_args,
    write_json,
    write_trace,
)
from kvsched.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

    from kvsched.schedule.serving import SLO
    from kvsched.schedule.tokens import BatchClock
    from kvsched.schedule.validate import Trace

#: The load balancer of a multi-engine run without --balancer: join the least requests.
BALANCER = "jlr"
#: When ``simulate`` notes that the arrivals may be in another unit than the time model's (a trace in
#: milliseconds read as seconds): the engine idled at least this share of the run, from the first arrival
#: to the last batch's end...
IDLE_NOTE_SHARE = 0.95
#: ...and the mean gap between arrivals is at least this many mean batch times. Both are far from a
#: real trace read right: Splitwise's conversation trace at 1 s = 1 s idles 5% of its run, its gaps about
#: 12 batch times; the same trace in milliseconds idles 99%, its gaps about 26,000 batch times.
IDLE_NOTE_GAP_BATCHES = 1000.0


def cmd_policies(args: argparse.Namespace) -> int:
    from kvsched.heuristics import list_policies
    from kvsched.heuristics.papers import PAPERS

    # Full descriptions, never cut: at least 160 columns when the output is not a terminal.
    console = Console() if Console().is_terminal else Console(width=160)
    table = Table(
        title="policies (kvsched simulate --policy NAME --param key=value)", show_lines=True, expand=True
    )
    table.add_column("name", no_wrap=True)
    for col, ratio in (("paper", 3), ("where", 3), ("parameters", 3), ("description", 9)):
        table.add_column(col, overflow="fold", ratio=ratio)
    cited = []
    for spec in list_policies():
        paper = spec.paper
        if paper is not None and paper not in cited:
            cited.append(paper)
        defaults = ", ".join(f"{k}={v}" for k, v in spec.defaults.items())
        cite = f"seed {paper.seed}: {paper.short}" if paper else "-"
        table.add_row(spec.name, cite, spec.source, defaults, spec.description)
    console.print(table)
    papers = Table(title="the papers", show_lines=True)
    for col in ("seed", "reference", "note"):
        papers.add_column(col, overflow="fold")
    for paper in sorted(cited or PAPERS.values(), key=lambda p: p.seed):
        papers.add_row(paper.seed, paper.citation, paper.note)
    console.print(papers)
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    if args.engines < 2 and args.balancer is not None:
        raise InputError(f"--balancer {args.balancer}: a load balancer needs --engines 2 or more")
    # With several engines, -o and --trace name one file per engine (_engine_path): check those instead.
    per_engine = ("out", "trace") if args.engines > 1 else ()
    extra = [
        (f"--{flag}", _engine_path(getattr(args, flag), k))
        for flag in per_engine
        if getattr(args, flag, None)
        for k in range(args.engines)
    ]
    flags = [name for name in ("out", "requests_csv", "json", "trace") if name not in per_engine]
    check_outputs(args, flags, inputs=["instance"], extra_outputs=extra)
    # The instance's and the trace's objects live to the end: no collector pass over them.
    with collector_paused():
        instance = load_instance_from_args(args.instance, args)
        slo = slo_from_args(args, instance)
        if args.engines > 1:
            return _simulate_engines(instance, args, slo)
        return _simulate_one(instance, args, slo)


def _simulate_one(instance, args: argparse.Namespace, slo) -> int:  # type: ignore[no-untyped-def]
    """One engine: simulate, print the metrics, write the outputs asked for."""
    from kvsched.heuristics import simulate
    from kvsched.heuristics.own import build_policy
    from kvsched.schedule.metrics import print_summary

    # A registered policy, or your own scheduler in a Python file (FILE.py:CLASS).
    policy = build_policy(args.policy, param_pairs(args.param), "-p/--policy")
    show = sys.stderr.isatty() if args.progress is None else args.progress
    result = simulate(instance, policy, progress=show)
    # The core checked every batch (and run) as the simulator made it: one pass. --validate
    # also replays the finished schedule alone, independently of the simulator.
    if args.validate:
        from kvsched.schedule.validate import replay

        trace = replay(instance, result.schedule)
    else:
        trace = result.trace
    # The core's batch count (every batch of every run applied): len(schedule) walks its entries
    # (0.18 s at 100,000 requests).
    num_batches, runtime = result.trace.state.num_batches, result.runtime
    # Only --out and --trace read the schedule again, but it is not freed here either: freeing
    # 100,000 requests' batches took 0.19 s and gave the metrics below little (the peak with it
    # kept is 19 MB higher); the command line leaves without freeing it.
    schedule = result.schedule if args.out or args.trace else None
    keep_until_exit(result)
    del result
    metrics = TraceMetrics(trace, instance, slo)  # every output below reads the same columns
    # No emoji codes: the tables hold numbers and names, where ":name:" is not meant as an emoji (and
    # rich's table of codes, about 12M instructions to import, is not read).
    console = Console(emoji=False)
    print_summary(
        trace,
        console=console,
        unit=time_unit(instance),
        title=f"{policy.name} on {escape(instance.name or args.instance)}",
        metrics=metrics.run,
        serving=metrics.serving if slo is not None else None,  # --slo's attainment beside the own SLOs'
    )
    from kvsched.schedule.serving import serving_table

    console.print(serving_table(metrics.serving))
    console.print(f"simulated {num_batches} batches in {runtime:.2f} s", highlight=False)
    note = idle_note(trace, metrics.clock)
    if note:
        print(f"kvsched simulate: note: {note}", file=sys.stderr)
    if args.json:
        doc = {"command": "simulate", "instance": instance.name, "policy": policy.name}
        write_json(args.json, {**doc, **metrics.summary()})
        Console(stderr=True).print(f"wrote the summary to {args.json}", markup=False, highlight=False)
    if args.trace:
        write_trace(args.trace, instance, schedule, name=policy.name)
        Console(stderr=True).print(f"wrote the Perfetto trace to {args.trace}", markup=False, highlight=False)
    if args.out:
        from kvsched.schedule.io import save_schedule  # here: pydantic's schemas only when writing

        with atomic_output(args.out) as tmp:
            save_schedule(schedule, instance, tmp)
        Console(stderr=True).print(f"wrote the schedule to {args.out}", markup=False, highlight=False)
    if args.requests_csv:
        with atomic_output(args.requests_csv) as tmp:
            with_slo(metrics.requests, slo).to_csv(tmp)
        Console(stderr=True).print(
            f"wrote per-request metrics to {args.requests_csv}", markup=False, highlight=False
        )
    keep_until_exit(trace, metrics, schedule, instance)  # the command line leaves without freeing them
    return 0


def _simulate_engines(instance, args: argparse.Namespace, slo=None) -> int:  # type: ignore[no-untyped-def]
    """``--engines K``: dispatch over K engines (seed 001 Sec. 4.1), one validated schedule each."""
    from kvsched.heuristics.multiengine import simulate_engines
    from kvsched.schedule.io import save_schedule

    result = simulate_engines(
        instance,
        args.policy,
        engines=args.engines,
        balancer=args.balancer or BALANCER,
        params=param_pairs(args.param),
        lengths=args.balancer_lengths,
        seed=args.balancer_seed,
    )
    summary = result.summary()
    unit = time_unit(instance)
    table = Table(
        title=f"{args.policy} on {args.engines} engines ({args.balancer or BALANCER}), {escape(instance.name or args.instance)}"
    )
    for col in (
        "engine",
        "requests",
        "completed",
        "makespan",
        "mean latency",
        "p50 TTFT",
        "p99 TTFT",
        "evictions",
    ):
        table.add_column(col, justify="right")
    frame = result.request_metrics()
    for k, group in frame.groupby("engine"):
        trace = result.traces[int(k)]
        table.add_row(
            str(k),
            str(len(group)),
            str(int(group["complete"].sum())),
            f"{trace.state.clock:.4g} {unit}" if trace is not None else "-",
            f"{group['latency'].mean():.4g} {unit}",
            f"{group['ttft'].median():.4g} {unit}",
            f"{group['ttft'].quantile(0.99):.4g} {unit}",
            str(int(group["evictions"].sum())),
        )
    table.add_row(
        "all",
        str(summary["num_requests"]),
        str(summary["num_completed"]),
        f"{summary['makespan']:.4g} {unit}",
        f"{summary['mean_latency']:.4g} {unit}",
        f"{summary['p50_ttft']:.4g} {unit}",
        f"{summary['p99_ttft']:.4g} {unit}",
        str(summary["evictions"]),
        style="bold",
    )
    console = Console()
    console.print(table)
    console.print(
        f"dispatched and simulated in {result.runtime:.2f} s; every engine's schedule validated",
        highlight=False,
    )
    if not all(result.consistent):
        Console(stderr=True).print(
            f"kvsched simulate: note: {args.policy} reads its whole instance up front, so the engine states the "
            "balancer saw differ from the reported runs (see kvsched.heuristics.multiengine)",
            highlight=False,
            soft_wrap=True,
        )
    if args.out:
        out = Path(args.out)
        for k, (sub, res) in enumerate(zip(result.engines, result.results, strict=True)):
            if res is not None:
                path = _engine_path(out, k)
                with atomic_output(path) as tmp:
                    save_schedule(res.schedule, sub, tmp)
                Console(stderr=True).print(
                    f"wrote engine {k}'s schedule to {path}", markup=False, highlight=False
                )
    if args.requests_csv:
        with atomic_output(args.requests_csv) as tmp:
            with_slo(frame, slo).to_csv(tmp)
        Console(stderr=True).print(
            f"wrote per-request metrics to {args.requests_csv}", markup=False, highlight=False
        )
    _engine_outputs(instance, args, result, slo)
    return 0


def idle_note(trace: Trace, clock: BatchClock) -> str | None:
    """A one-line remark when the engine idled most of the run while the arrivals lay far apart in batch
    times (see :data:`IDLE_NOTE_SHARE`), the sign of a trace in another unit than the time model's; else
    ``None``.

    Nothing converts ``arrived_at`` (it is read in the time model's unit, as the README says), so a trace
    in milliseconds runs 1000 times too sparse: 500 requests became a 36-hour run with no word said.
    A note, not an error: a sparse trace may be meant.
    """
    arrival = trace.state.arrival
    batches = int(clock.ends.size)
    if arrival.size < 2 or not batches:
        return None
    first = float(arrival.min())
    span = float(clock.ends.max()) - first
    busy = float((clock.ends - clock.starts()).sum())
    if span <= 0 or busy <= 0:
        return None
    idle = 1.0 - busy / span
    gap = (float(arrival.max()) - first) / (arrival.size - 1)
    batch = busy / batches
    if idle < IDLE_NOTE_SHARE or gap < IDLE_NOTE_GAP_BATCHES * batch:
        return None
    unit = time_unit(trace.instance)
    read_as = "seconds" if unit == "s" else "slots (unit time: a trace's seconds become slots one for one)"
    return (
        f"the engine idled {idle:.0%} of the run (arrivals span {float(arrival.max()) - first:.6g} {unit}, "
        f"{gap:.3g} {unit} apart on average, a batch {batch:.3g} {unit}): arrivals are read in {read_as}; "
        "if the trace's are in milliseconds, divide them by 1000"
    )


def with_slo(frame: pd.DataFrame, slo: SLO | None) -> pd.DataFrame:
    """The per-request frame of ``--requests-csv``, with ``--slo``'s ``good`` column where one is given.

    ``ttft_slo_met``, ``tbt_slo_met`` and ``slo_met`` judge each request's own SLOs (empty without them);
    ``good`` says whether it counts toward the goodput the serving table prints for ``--slo``.
    """
    if slo is None:
        return frame
    from kvsched.schedule.serving import good_flags

    return frame.assign(good=good_flags(frame, slo))


def _engine_path(out: str | Path, k: int) -> Path:
    """Engine ``k``'s file for a multi-engine run's ``-o`` or ``--trace`` (``out.engineK.json``)."""
    out = Path(out)
    return out.with_name(f"{out.stem}.engine{k}{out.suffix or '.json'}")


def _engine_outputs(instance, args: argparse.Namespace, result, slo) -> None:  # type: ignore[no-untyped-def]
    """``--json`` (every engine pooled) and ``--trace`` (one file per engine) of a multi-engine run."""
    from kvsched.schedule.serving import serving_metrics, serving_table

    traces = [t for t in result.traces if t is not None]
    serving = serving_metrics(traces, slo, unit=time_unit(instance))  # once, for the table and --json
    Console().print(serving_table(serving, title="Serving metrics, all engines"))
    if args.json:
        doc = {
            "command": "simulate",
            "instance": instance.name,
            "policy": args.policy,
            "engines": args.engines,
        }
        write_json(args.json, {**doc, **serving.to_dict()})
        Console(stderr=True).print(f"wrote the summary to {args.json}", markup=False, highlight=False)
    if args.trace:
        out = Path(args.trace)
        for k, (sub, res) in enumerate(zip(result.engines, result.results, strict=True)):
            if res is not None:
                path = _engine_path(out, k)
                write_trace(path, sub, res.schedule, name=f"{args.policy}, engine {k}")
                Console(stderr=True).print(
                    f"wrote engine {k}'s Perfetto trace to {path}", markup=False, highlight=False
                )


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``kvsched`` parser."""
    p = sub.add_parser(
        "policies",
        help="list the scheduling policies",
        description="List every registered policy with its paper, default parameters and description.",
    )
    p.add_argument("--long", action="store_true", help=argparse.SUPPRESS)  # kept: descriptions are never cut
    p.set_defaults(func=cmd_policies)

    p = sub.add_parser(
        "simulate",
        help="run a scheduling policy on an instance",
        description="Run POLICY on INSTANCE in the iteration-level simulator, validate the schedule through the "
        "semantic core, print its metrics and optionally write it.",
    )
    p.add_argument("instance", help="instance .json (or trace .csv with --kv-capacity)")
    p.add_argument(
        "--policy",
        "-p",
        required=True,
        help="policy name (see kvsched policies), or your own: FILE.py:CLASS (--param values go to its "
        "constructor)",
    )
    p.add_argument("--param", action="append", metavar="K=V", help="policy parameter (repeatable)")
    p.add_argument("--out", "-o", help="write the schedule here (.json: kvsched JSON; .npz: columnar)")
    p.add_argument("--requests-csv", help="write per-request metrics here (CSV)")
    add_json_arg(p)
    add_trace_arg(p)
    add_slo_arg(p)
    p.add_argument(
        "--validate",
        action="store_true",
        help="replay the finished schedule through the validator as well (the simulator's core already "
        "checked every batch)",
    )
    p.add_argument(
        "--engines",
        type=positive_int,
        default=1,
        help="K identical engines behind a load balancer (seed 001 Sec. 4.1); with K > 1, --out writes "
        "one schedule per engine (OUT.engineK.json)",
    )
    p.add_argument(
        "--balancer",
        choices=("random", "jlr", "jlot"),
        default=None,
        help="with --engines: uniform random, join least requests, join least outstanding tokens (default jlr)",
    )
    p.add_argument(
        "--balancer-lengths",
        choices=("known", "predicted", "true"),
        default="known",
        help="how jlot counts outstanding tokens (default: known tokens only)",
    )
    p.add_argument("--balancer-seed", type=seed_int, default=0, help="seed of the random balancer")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: when stderr is a terminal)",
    )
    add_limit_args(p)
    add_cost_args(p)
    p.set_defaults(func=cmd_simulate)
