"""``kvsched solve`` and ``kvsched compare``: the optimum, and every policy's regret."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvsched.commands.common import (
    EXIT_ERROR,
    add_cost_args,
    add_limit_args,
    atomic_output,
    check_outputs,
    interrupted_exit,
    load_instance_from_args,
    note_late,
    positive_int,
    seed_int,
    time_unit,
)
from kvsched.commands.given import add_given_args, given_inputs, read_given
from kvsched.commands.outputs import (
    TraceMetrics,
    add_slo_arg,
    add_trace_arg,
    slo_from_args,
    write_json,
    write_trace,
)
from kvsched.commands.warmup import note_cold_kernels
from kvsched.errors import InputError
from kvsched.schedule.metrics import format_number
from kvsched.schedule.output_time import solve_deadline
from kvsched.stop import Deadline, DeadlineReached, check_time_limit
from kvsched.threads import check_threads

SOLVERS = ("highs", "cbc", "cpsat")
OBJECTIVES = ("total-latency", "makespan", "sum-ttft")


def solver_options(args: argparse.Namespace):  # -> SolverOptions
    """The solver options of ``args`` (the flags of :func:`add_solver_args`).

    Parameters
    ----------
    args
        Parsed arguments of a command with the solver flags.

    Returns
    -------
    SolverOptions
        Time limit, threads, gap, seed and log.

    Raises
    ------
    InputError
        A time limit or gap out of range.
    """
    from kvsched.csp import SolverOptions

    check_time_limit(args.time_limit)
    check_threads(args.threads)
    if not 0 <= args.gap < 1:
        raise InputError("--gap: must be in [0, 1)")
    return SolverOptions(
        time_limit=args.time_limit, threads=args.threads, gap=args.gap, seed=args.seed, log=args.log
    )


def add_solver_args(p: argparse.ArgumentParser) -> None:
    """Add the "solver" flag group (back end, formulation, objective, limits, formulation options) to ``p``.

    Parameters
    ----------
    p
        The command's parser: ``kvsched solve``, ``compare``, ``plot`` and ``report`` share these flags.
    """
    g = p.add_argument_group("solver")
    g.add_argument("--solver", choices=SOLVERS, default="highs", help="back end (default highs)")
    g.add_argument(
        "--formulation",
        choices=("auto", "time", "batch"),
        default="auto",
        help="auto: on up to 12 requests the certified pipeline, then the exact batch-indexed model from its "
        "best schedule; the certified pipeline alone beyond (any size, any cost model; says which); "
        "time: time-indexed (unit time, each request served without a break); batch: batch-indexed "
        "(every legal schedule, small instances) (default auto)",
    )
    g.add_argument("--objective", choices=OBJECTIVES, default="total-latency", help="(default total-latency)")
    g.add_argument(
        "--time-limit",
        type=float,
        default=60.0,
        help="wall-clock seconds for the whole command, loading to written result (default 60)",
    )
    g.add_argument("--threads", type=positive_int, default=2, help="threads / CP-SAT workers (default 2)")
    g.add_argument(
        "--gap", type=float, default=0.0, help="relative gap to stop at (default 0: prove optimality)"
    )
    g.add_argument("--seed", type=seed_int, default=0, help="solver random seed (default 0)")
    g.add_argument("--log", action="store_true", help="show the solver's own log")
    g.add_argument(
        "--no-eviction",
        action="store_true",
        help="batch formulation: only eviction-free schedules (the time formulation never evicts)",
    )
    g.add_argument(
        "--no-strengthen",
        action="store_true",
        help="time formulation: skip the local search and the reduced-cost windows (a baseline)",
    )


def model_kwargs(args: argparse.Namespace) -> dict[str, bool]:
    """The formulation options of ``args`` that apply to its formulation.

    Parameters
    ----------
    args
        Parsed arguments with the flags of :func:`add_solver_args`.

    Returns
    -------
    dict[str, bool]
        ``allow_eviction`` for the batch and auto formulations, ``strengthen`` for the time one.

    Raises
    ------
    InputError
        A formulation flag given for a formulation it does not apply to.
    """
    if args.formulation in ("batch", "auto"):
        if args.no_strengthen:
            raise InputError("--no-strengthen: applies to --formulation time only")
        return {"allow_eviction": not args.no_eviction}
    if args.no_eviction:
        raise InputError("--no-eviction: applies to --formulation batch or auto (time never evicts)")
    return {"strengthen": not args.no_strengthen}


def _fmt(value: Any) -> str:
    return format_number(value, 6)


def result_document(result: Any) -> dict[str, Any]:
    """A :class:`~kvsched.csp.Result` as JSON-ready data (the schedule is written separately)."""
    return {
        "status": str(result.status),
        "objective_name": result.objective_name,
        "objective": result.objective,
        "best_bound": result.best_bound,
        "gap": result.gap,
        "scope": str(result.scope),
        "bound_source": result.bound_source,
        "bounds": [{"value": b.value, "source": b.source, "scope": str(b.scope)} for b in result.bounds],
        "stopped": result.stopped,
        "runtime": result.runtime,
        "solver": result.solver,
        "formulation": result.formulation,
        "stats": result.stats,
        "anytime": [[p.time, p.incumbent, p.bound] for p in result.anytime],
    }


def _outputs(args: argparse.Namespace) -> list[str]:
    """What ``kvsched solve`` will print and write (its time is kept from the solve: ``solve_deadline``)."""
    outputs = ["summary"]
    if args.json:
        outputs.append("json")
    if args.out:
        outputs.append("schedule.npz" if Path(args.out).suffix.lower() == ".npz" else "schedule.json")
    if args.trace:
        outputs.append("trace")
    return outputs


def cmd_solve(args: argparse.Namespace) -> int:
    from kvsched.csp import SolveStatus, solve
    from kvsched.heuristics import make_policy, simulate
    from kvsched.schedule.io import load_schedule, save_schedule
    from kvsched.schedule.metrics import print_summary
    from kvsched.schedule.validate import replay

    # --time-limit bounds the whole command, from here to the written result.
    deadline = Deadline.for_command(args.time_limit)
    # Outputs are checked before the solve, so that a finished solve is never lost to a bad path.
    check_outputs(args, ["out", "json", "export", "trace"], inputs=["instance", "warm_start"])
    instance = load_instance_from_args(args.instance, args)
    # Where the command's time went, in seconds since it started (the --json document keeps them).
    seconds = {"loaded": deadline.elapsed()}
    slo = slo_from_args(args, instance)
    warm = None
    if args.warm_start:
        path = Path(args.warm_start)
        if path.suffix in (".json", ".npz") or path.is_file():
            warm = load_schedule(path, instance)  # (solve refuses an illegal one, naming warm_start)
        else:
            # Within the command's limit less the solve's first share: a slow policy on 100k requests runs
            # for minutes, and the solve makes a first schedule of its own in any case.
            try:
                warm = simulate(instance, make_policy(args.warm_start), deadline=deadline.share(0.5)).schedule
            except DeadlineReached:
                print(
                    f"kvsched solve: note: --warm-start {args.warm_start} did not finish within half of "
                    f"--time-limit {deadline.limit:g}; solving without it",
                    file=sys.stderr,
                )
    result = solve(
        instance,
        objective=args.objective,
        formulation=args.formulation,
        solver=args.solver,
        options=solver_options(args),
        warm_start=warm,
        export=args.export,
        deadline=solve_deadline(deadline, instance, _outputs(args), warn="solve"),
        **model_kwargs(args),
    )
    seconds["solved"] = deadline.elapsed()
    # After the solve, not before: a configuration it refuses gets its one error line only, and the
    # families listed are those still cold at the end (kernels this solve compiled are not).
    note_cold_kernels("solve")
    console = Console()
    table = Table(title=f"{result.formulation} / {result.solver}: {result.objective_name}", show_header=False)
    table.add_row("status", str(result.status))
    table.add_row("objective", _fmt(result.objective))
    table.add_row("scope", result.scope.description)
    table.add_row("best bound", _fmt(result.best_bound))
    table.add_row("bound source", result.bound_source or "-")
    table.add_row("gap", "-" if result.gap is None else f"{100 * result.gap:.3f}%")
    every = result.all_schedules_bound
    table.add_row(
        "bound for every schedule", "-" if every is None else f"{_fmt(every.value)} ({every.source})"
    )
    if result.stopped:
        table.add_row("stopped", result.stopped)
    table.add_row("runtime", f"{result.runtime:.2f} s")
    for key in (
        "variables",
        "rows",
        "nonzeros",
        "horizon",
        "mean_window",
        "upper_bound",
        "lagrangian_bound",
        "warm_start",
        "found_by",
        "evictions",
    ):
        if key in result.stats:
            table.add_row(key.replace("_", " "), _fmt(result.stats[key]))
    console.print(table)
    assert result.schedule is not None  # solve always returns a schedule
    # The solve replayed its schedule through the core; every output below reads that one trace's metrics.
    metrics = TraceMetrics(result.trace or replay(instance, result.schedule), instance, slo)
    print_summary(
        metrics.trace,
        console=console,
        unit=time_unit(instance),
        title=f"{'optimal' if result.status == SolveStatus.OPTIMAL else 'best found'} schedule metrics",
        metrics=metrics.run,
        serving=metrics.serving if slo is not None else None,  # --slo's attainment beside the own SLOs'
    )
    if args.out:
        with atomic_output(args.out) as tmp:
            save_schedule(result.schedule, instance, tmp)
        Console(stderr=True).print(f"wrote the schedule to {args.out}", markup=False, highlight=False)
    if args.json:
        # The result document (status, objective, bounds, progress) and the schedule's serving metrics.
        doc = {**result_document(result), **metrics.summary()}
        seconds["summarised"] = deadline.elapsed()
        write_json(args.json, {**doc, "command_seconds": seconds})
    if args.trace:
        write_trace(args.trace, instance, result.schedule, name=f"{result.formulation}/{result.solver}")
        Console(stderr=True).print(f"wrote the Perfetto trace to {args.trace}", markup=False, highlight=False)
    note_late(deadline, seconds)
    if args.export and "exported" not in result.stats:
        # Asked for and not written (the pipeline, or no exact model in time): an error, after the other
        # outputs, so that a script does not read an old or missing file as this model.
        why = result.stats.get("auto") or result.stopped or "no exact model was built in time"
        print(
            f"kvsched solve: error: --export: no model was written to {args.export}: {why} "
            "(--formulation time or batch builds one)",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return interrupted_exit("solve", result.stopped == "interrupted")


def _regret_interval(row: Any, lo: str, hi: str) -> str:
    """``lo`` alone where the interval is closed (proven optimum), else ``lo .. hi``."""
    a, b = row.get(lo), row.get(hi)
    if a is None or b is None or a != a or b != b or abs(a - b) <= 1e-9 * max(1.0, abs(a)):
        return _fmt(a)
    return f"{_fmt(a)} .. {_fmt(b)}"


def print_comparison(cmp: Any, objective: str, name: str) -> Any:
    """Print a :class:`~kvsched.analysis.Comparison` as a table; returns its rows, best first.

    Each regret is printed beside the scope it is measured over, as an
    interval ``lo .. hi`` where the solver's optimum is not proven, and a
    legend below says what each column is measured against.
    """
    from kvsched.analysis.compare import (
        CUT,
        INTERRUPTED,
        MAX_REGRET_ALL,
        MAX_REGRET_SCOPE,
        NOT_RUN,
        REGRET,
        REGRET_PCT,
    )

    table = cmp.table.sort_values("objective", na_position="last")
    # A wide table: use at least 160 columns when the output is not a terminal (files, CI logs).
    console = Console() if Console().is_terminal else Console(width=160)
    title = f"{objective} on {name}"
    if cmp.result is not None:
        res = cmp.result
        title += (
            f": best schedule {_fmt(res.objective)} ({res.status} over {res.scope.description}, "
            f"bound {_fmt(res.best_bound)}" + (f" from {res.bound_source})" if res.bound_source else ")")
        )
    out = Table(title=title)
    # Regret columns: (label, cell) each, measured against what the legend below says.
    regret: list[tuple[str, Any]] = []
    if REGRET in table.columns:
        regret += [
            ("scope", lambda r: str(r.get("scope", "-"))),
            ("regret vs solver", lambda r: _regret_interval(r, REGRET, MAX_REGRET_SCOPE)),
            ("regret vs solver %", lambda r: _fmt(r.get(REGRET_PCT))),
        ]
    if MAX_REGRET_ALL in table.columns:
        regret.append(("max regret vs all schedules", lambda r: _fmt(r.get(MAX_REGRET_ALL))))
    cols = [
        c
        for c in (
            "mean_ttft",
            "max_tbt",
            "tokens_per_s",
            "tokens_per_slot",
            "goodput_fraction",
            "evictions",
        )
        if c in table.columns
    ]
    out.add_column("policy", no_wrap=True)
    out.add_column("objective", justify="right", overflow="fold")
    for label, _ in regret:
        out.add_column(label, justify="right", overflow="fold")
    for c in cols:
        out.add_column(c.replace("_", " "), justify="right", overflow="fold")
    for name, row in table.iterrows():
        if row["error"] in (NOT_RUN, CUT, INTERRUPTED):  # listed below, on one line each
            continue
        out.add_row(
            str(name),
            _fmt(row["objective"]),
            *(cell(row) for _, cell in regret),
            *(_fmt(row[c]) for c in cols),
        )
    console.print(out)
    errors = table["error"].dropna()
    for name, err in errors[~errors.isin([NOT_RUN, CUT, INTERRUPTED])].items():
        said = "refused" if table.at[name, "kind"] == "schedule" else "could not run"
        console.print(f"{name}: {said}: {err}", markup=False, highlight=False)
    policies = len(table) - (cmp.result is not None)
    for kind, words, hint in (
        (NOT_RUN, "not run: the time limit ran out before them", "; a larger --time-limit runs them"),
        (CUT, "not finished: the time limit ran out while they ran", "; a larger --time-limit runs them"),
        (INTERRUPTED, "not run: Ctrl-C stopped the comparison", ""),
    ):
        names = list(errors[errors == kind].index)
        if names:  # one line, not one per policy
            console.print(
                f"{len(names)} of {policies} policies {words} ({', '.join(map(str, names))}){hint}",
                markup=False,
                highlight=False,
            )
    if cmp.solver_error is not None:
        console.print(f"the solver did not run: {cmp.solver_error}", markup=False, highlight=False)
    if REGRET in table.columns:
        res = cmp.result
        proven = str(res.status) == "optimal"
        source = f" from {res.bound_source}" if res.bound_source else ""
        console.print(
            f"scope {res.scope}: the solver's optimum ranges over {res.scope.description}. "
            f"regret vs solver: against its best schedule {_fmt(res.objective)}, "
            + (
                "the proven optimum over that scope."
                if proven
                else f"not proven optimal: lo .. hi, hi against the proven bound {_fmt(res.best_bound)}"
                f"{source} over that scope."
            ),
            highlight=False,
        )
    if cmp.lower_bound is not None:
        console.print(
            f"max regret vs all schedules (certified): no legal schedule (evictions and chunking included) "
            f"has {objective} below {_fmt(cmp.lower_bound)}",
            highlight=False,
        )
    return table


def cmd_compare(args: argparse.Namespace) -> int:
    from kvsched.analysis import compare

    # --time-limit bounds the whole command: loading and the policies count against the solve.
    deadline = Deadline.for_command(args.time_limit)
    check_outputs(args, ["csv", "json"], inputs=["instance"], extra_inputs=given_inputs(args))
    instance = load_instance_from_args(args.instance, args)
    policies, schedules = read_given(args, instance)
    cmp = compare(
        instance,
        policies,
        schedules=schedules,
        objective=args.objective,
        solver=None if args.no_solver else args.solver,
        formulation=args.formulation,
        options=solver_options(args),
        solve_options=None if args.no_solver else model_kwargs(args),
        slo=slo_from_args(args, instance),
        deadline=solve_deadline(deadline, instance),
        validate=args.validate,
    )
    compared = deadline.elapsed()
    table = print_comparison(cmp, args.objective, instance.name or args.instance)
    if args.csv:
        with atomic_output(args.csv) as tmp:
            table.to_csv(tmp)
    if args.json:
        rows = json.loads(table.reset_index().to_json(orient="records"))
        for row in rows:  # each schedule's serving metrics beside its regret
            if row["name"] in cmp.serving:
                row.update(cmp.serving[row["name"]].to_dict())
        doc = {
            "objective": args.objective,
            "time_unit": time_unit(instance),
            "lower_bound": cmp.lower_bound,
            "result": None if cmp.result is None else result_document(cmp.result),
            "rows": rows,
        }
        write_json(args.json, doc)
    note_late(deadline, {"solved": compared}, command="compare", stage="the policies and the solve")
    return interrupted_exit("compare", bool(cmp.interrupted))


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``kvsched`` parser."""
    p = sub.add_parser(
        "solve",
        help="find the optimal schedule, or the best found and a proven bound",
        description="Solve INSTANCE exactly (MILP with HiGHS or CBC, or CP-SAT). A time limit returns the best "
        "schedule found and the proven bound. The schedule is replayed through the semantic core.",
    )
    p.add_argument("instance", help="instance .json")
    add_solver_args(p)
    p.add_argument("--warm-start", help="policy name or schedule .json to start from")
    p.add_argument("--export", help="also write the model as .mps or .lp (for Gurobi, CPLEX, ...)")
    p.add_argument("--out", "-o", help="write the schedule here (kvsched JSON)")
    p.add_argument(
        "--json",
        metavar="FILE",
        help="write the result (status, objective, bound, gap, progress), the schedule's serving metrics "
        "(mean_ttft, p99_tpot, p50_itl, p99_e2el, time_unit, ...) and command_seconds (seconds since the "
        "command started when the instance was loaded, the solve returned, the metrics were computed) here",
    )
    add_trace_arg(p)
    add_slo_arg(p)
    add_limit_args(p)
    add_cost_args(p)
    p.set_defaults(func=cmd_solve)

    p = sub.add_parser(
        "compare",
        help="every policy's regret against the optimum",
        description="Run the policies and the exact solver on INSTANCE, on the same cost model, and print each "
        "policy's objective and regret (absolute, %, the interval when the optimum is not proven, and a "
        "certified maximum from bounds valid for every schedule), with TTFT, TBT and throughput.",
    )
    p.add_argument("instance", help="instance .json")
    add_given_args(p)
    p.add_argument("--no-solver", action="store_true", help="compare the policies only")
    add_solver_args(p)
    p.add_argument("--csv", help="write the table as CSV")
    p.add_argument(
        "--json",
        metavar="FILE",
        help="write the table (each row with its serving metrics: mean_ttft, p99_tpot, p50_itl, ...) and the "
        "solver result as JSON",
    )
    p.add_argument(
        "--validate",
        action="store_true",
        help="replay every policy's schedule through the independent validator (the simulator's core "
        "already checks each batch)",
    )
    add_slo_arg(p)
    add_limit_args(p)
    add_cost_args(p)
    p.set_defaults(func=cmd_compare)
