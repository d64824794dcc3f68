"""``kvsched sweep``, ``results``, ``regret``, ``plot`` and ``report``: studies at scale."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvsched.commands.common import (
    EXIT_INTERNAL,
    LIMIT_FLAGS,
    add_cost_args,
    add_limit_args,
    atomic_output,
    check_outputs,
    interrupted_exit,
    limit_overrides,
    load_instance_from_args,
    note_late,
    positive_int,
)
from kvsched.commands.given import add_given_args, given_inputs, policy_names, read_given, schedule_paths
from kvsched.commands.outputs import add_slo_arg
from kvsched.commands.solve import add_solver_args, model_kwargs, solver_options
from kvsched.errors import InputError
from kvsched.schedule.metrics import format_number
from kvsched.schedule.output_time import solve_deadline
from kvsched.stop import Deadline

PLOT_KINDS = ("gantt", "kv", "load", "regret", "cdf", "anytime")
#: --objective of an instance's plot or report when none is given (a database's takes the one it holds).
DEFAULT_OBJECTIVE = "total-latency"


def _frame(args: argparse.Namespace):  # -> pd.DataFrame
    from kvsched.analysis.store import load_results

    frame = load_results(args.db)
    if frame.empty:
        raise InputError(f"{args.db}: the results database is empty")
    if getattr(args, "sweep", None):
        # Every cell the sweep covers, by the membership table: a cell an earlier sweep wrote keeps that
        # sweep's name in its row, and filtering on the name dropped it (and compared a policy with itself).
        frame = load_results(args.db, sweep=args.sweep)
        if frame.empty:
            raise InputError(f"--sweep: no rows of sweep {args.sweep!r} in {args.db}")
    return frame


# ----------------------------------------------------------------------------- sweep / results
def cmd_sweep(args: argparse.Namespace) -> int:
    from kvsched.analysis.spec import load_spec
    from kvsched.analysis.sweep import run_sweep

    check_outputs(args, ["db"], inputs=["spec"], kind="database")  # an existing database is resumed
    if args.address and args.backend != "ray":
        raise InputError("--address: a Ray cluster's address applies to --backend ray only")
    if args.slo is not None:
        from kvsched.schedule.serving import parse_slo

        parse_slo(args.slo, "s")  # the syntax, before any work (units are checked per instance)
    spec = load_spec(args.spec)
    err = Console(stderr=True)
    show = err.is_terminal if args.progress is None else args.progress
    summary = run_sweep(
        spec,
        args.db,
        workers=args.workers,
        backend=args.backend,
        address=args.address,
        base=Path(args.spec).parent,
        progress=show,
        console=err,
        slo=args.slo,
    )
    err.print(
        f"sweep {spec.name}: {summary.total} cells, {summary.skipped} already done, {summary.written} written "
        f"({summary.errors} with status error) in {summary.seconds:.1f} s -> {args.db}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    for name, reason in summary.failed[:5]:
        err.print(f"crashed, not written (rerun to retry): {name}: {reason}", markup=False, highlight=False)
    if summary.failed:
        more = len(summary.failed) - 5
        if more > 0:
            err.print(f"... and {more} more crashed cells", highlight=False)
        return EXIT_INTERNAL
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    import pandas as pd

    from kvsched.analysis.store import export, load_results

    if args.to:
        if not args.out:
            raise InputError("--to needs --out FILE")
        check_outputs(args, ["out"], inputs=["db"])
        with atomic_output(args.out) as tmp:
            rows = export(args.db, args.to, tmp)
        Console(stderr=True).print(f"wrote {rows} rows to {args.out}", markup=False, highlight=False)
        return 0
    if args.out:
        raise InputError("--out needs --to csv or --to parquet")
    frame = load_results(args.db)
    # Each row once, under the sweep that wrote it (a cell shared with a later sweep is not counted twice).
    table = Table(
        title=f"{escape(str(args.db))}: {len(frame)} cells", caption="sweep: the sweep that wrote the rows"
    )
    for col in ("sweep", "kind", "status", "scope", "bound source", "cells", "runtime (s)"):
        table.add_column(col, justify="right" if col in ("cells", "runtime (s)") else "left")
    if not frame.empty:
        keys = ["sweep", "kind", "status", "scope", "bound_source"]
        grouped = frame.groupby(keys, dropna=False)["runtime"].agg(["count", "sum"])
        for (sweep, kind, status, scope, source), row in grouped.iterrows():
            # A solver row without a scope was written before scopes were stored: unknown, not assumed.
            unknown = "unknown" if kind == "solver" and status != "error" else "-"
            table.add_row(
                escape(str(sweep)),
                str(kind),
                str(status),
                unknown if pd.isna(scope) else str(scope),
                (unknown if pd.isna(scope) else "none") if pd.isna(source) else str(source),
                str(int(row["count"])),
                format_number(float(row["sum"])),
            )
    Console().print(table)
    return 0


def cmd_regret(args: argparse.Namespace) -> int:
    from kvsched.analysis.regret import default_against, describe_reference, regret_table, select_objective

    check_outputs(args, ["csv"], inputs=["db"])
    frame = select_objective(_frame(args), args.objective)
    against = args.against or default_against(frame)
    table = regret_table(frame, against)
    console = Console() if Console().is_terminal else Console(width=160)
    out = Table(title=f"regret {describe_reference(frame, against)}")
    out.add_column("policy", no_wrap=True)
    for col in table.columns:
        out.add_column(col.replace("_", " "), justify="right")
    for name, row in table.iterrows():
        out.add_row(
            str(name), *(format_number(v) if not isinstance(v, int) else str(v) for v in row.tolist())
        )
    console.print(out)
    if args.csv:
        with atomic_output(args.csv) as tmp:
            table.to_csv(tmp)
        Console(stderr=True).print(f"wrote {args.csv}", markup=False, highlight=False)
    return 0


# ----------------------------------------------------------------------------- plot
def _solve(instance: Any, args: argparse.Namespace, deadline: Deadline, figure: str = "figure") -> Any:
    """The solve a figure draws (a Result), within the command's ``deadline`` less the ``figure``'s time."""
    from kvsched.csp import solve

    return solve(
        instance,
        objective=args.objective,
        formulation=args.formulation,
        solver=args.solver,
        options=solver_options(args),
        deadline=solve_deadline(deadline, instance, (figure,), warn="plot"),
        **model_kwargs(args),
    )


def _schedules_for(
    instance: Any, args: argparse.Namespace, deadline: Deadline
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The schedules ``plot kv`` / ``plot cdf`` draw, and their traces (each replayed once, as it ran).

    As in ``compare``, a policy starts only within :data:`~kvsched.analysis.compare.POLICY_SHARE` of the
    time left where a solve follows (else within the time left less the figure's): ``--policies all`` on
    2,000 requests ran for 94 s under ``--time-limit 2``. Those not started are named on one line.
    """
    from kvsched.analysis.compare import CUT, NOT_RUN, POLICY_SHARE, run_policies
    from kvsched.heuristics import make_policy

    names = policy_names(args.policies, allow_none=False)
    usable = solve_deadline(deadline, instance, ("figure",))
    starts_by = usable.share(POLICY_SHARE) if args.solve else usable
    schedules: dict[str, Any] = {}
    traces: dict[str, Any] = {}
    not_run: list[str] = []
    policies = {name: make_policy(name) for name in names}
    for name, sim in run_policies(instance, policies, starts_by, until_one=True):  # a figure needs one
        if not isinstance(sim, str):
            schedules[name], traces[name] = sim.schedule, sim.trace
        elif sim in (NOT_RUN, CUT):
            not_run.append(name)
        else:  # as compare: a policy that cannot run the instance is a line, not the end of the figure
            print(f"kvsched plot: {name} could not run: {sim}", file=sys.stderr)
    if not schedules and not args.solve:
        raise InputError(f"--policies: none of {', '.join(names)} could run this instance")
    if not_run:
        print(
            f"kvsched plot: {len(not_run)} of {len(names)} policies not run or not finished: the time limit "
            f"ran out ({', '.join(not_run)}); a larger --time-limit runs them",
            file=sys.stderr,
        )
    if args.solve:
        res = _solve(instance, args, deadline)
        assert res.schedule is not None
        label = f"optimum ({res.formulation}/{res.solver})"
        schedules[label], traces[label] = res.schedule, res.trace
    return schedules, traces


def cmd_plot(args: argparse.Namespace) -> int:
    from kvsched.analysis import plots

    # --time-limit bounds the whole command: loading, the policies and the solve count against it.
    deadline = Deadline.for_command(args.time_limit)
    kind = args.kind
    if Path(args.out).suffix.lower() not in plots.FORMATS:
        raise InputError(f"--out: {args.out}: use a .png, .svg or .pdf file name")
    check_outputs(args, ["out"], inputs=["source", "schedule"])
    ran = None  # when the schedules drawn were made (an instance only)
    if kind in ("load", "regret"):
        from kvsched.analysis.regret import select_objective

        frame = select_objective(_frame(args), args.objective)
        if kind == "load":
            fig = plots.plot_load(frame, x=args.x, metric=args.metric)
        else:
            fig = plots.plot_regret_vs_size(frame, against=args.against)
    elif kind == "anytime":
        args.objective = args.objective or DEFAULT_OBJECTIVE
        source = _anytime_source(args, deadline)
        ran = deadline.elapsed()
        fig = plots.plot_anytime(*source)
    else:
        args.objective = args.objective or DEFAULT_OBJECTIVE
        instance = load_instance_from_args(args.instance, args)
        if kind == "gantt":
            name, schedule, trace = _one_schedule(instance, args, deadline)
            ran = deadline.elapsed()
            fig = plots.plot_gantt(instance, schedule, title=name, trace=trace)
        else:
            schedules, traces = _schedules_for(instance, args, deadline)
            ran = deadline.elapsed()
            fig = (plots.plot_kv if kind == "kv" else plots.plot_cdfs)(instance, schedules, traces=traces)
    with atomic_output(args.out) as tmp:
        plots.save_figure(fig, tmp)
    path = args.out
    Console(stderr=True).print(f"wrote {path}", markup=False, highlight=False)
    if ran is not None:
        stage = "the solve" if kind == "anytime" or (kind == "gantt" and args.solve) else "the schedules"
        note_late(deadline, {"solved": ran}, command="plot", stage=stage)
    return 0


def _one_schedule(instance: Any, args: argparse.Namespace, deadline: Deadline) -> tuple[str, Any, Any]:
    """The name, schedule and trace (None: replayed by the figure) ``plot gantt`` draws."""
    given = [x for x in (args.policy, args.schedule) if x] + (["solve"] if args.solve else [])
    if len(given) != 1:
        raise InputError("plot gantt: give exactly one of --policy NAME, --schedule FILE or --solve")
    if args.policy:
        from kvsched.heuristics import make_policy, simulate
        from kvsched.heuristics.registry import check_policy_name

        sim = simulate(instance, make_policy(check_policy_name(args.policy, "--policy")))
        return args.policy, sim.schedule, sim.trace
    if args.schedule:
        from kvsched.schedule.io import load_schedule

        return Path(args.schedule).name, load_schedule(args.schedule, instance), None
    res = _solve(instance, args, deadline)
    assert res.schedule is not None
    return f"optimum ({res.formulation}/{res.solver}, {res.status})", res.schedule, res.trace


def _anytime_source(args: argparse.Namespace, deadline: Deadline) -> tuple[Any, ...]:
    """A result document from ``kvsched solve --json``, or an instance to solve now."""
    path = Path(args.instance)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        # Not a result document (a database, a binary file, an instance): read as an instance, whose
        # loader names the problem in one line.
        doc = None
    if isinstance(doc, dict) and "anytime" in doc:
        points = doc["anytime"]
        if doc.get("objective") is not None and doc.get("runtime") is not None and isinstance(points, list):
            points = [*points, [doc["runtime"], doc["objective"], doc.get("best_bound")]]
        return (_anytime_rows(points, path),)
    instance = load_instance_from_args(args.instance, args)
    res = _solve(instance, args, deadline, "curve")
    return (res,)


def _anytime_rows(points: Any, path: Path) -> list[list[float | None]]:
    """The ``[time, incumbent, bound]`` rows of a ``kvsched solve --json`` document, checked.

    A hand-edited or foreign document is one :class:`InputError` naming the row (``anytime.3``, the
    last row being the result's own runtime, objective and best_bound), not a failure in pandas.
    """

    def number(v: Any, *, null: bool) -> bool:
        if v is None:
            return null
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)

    if not isinstance(points, list):
        raise InputError(f"{path}: anytime: expected a list of [time, incumbent, bound] rows")
    for k, row in enumerate(points):
        if not (
            isinstance(row, list)
            and len(row) == 3
            and number(row[0], null=False)
            and row[0] >= 0
            and all(number(v, null=True) for v in row[1:])
        ):
            raise InputError(
                f"{path}: anytime.{k}: expected [time >= 0, incumbent, bound] (numbers; the last two may be "
                f"null), got {json.dumps(row)[:80]}"
            )
    return points


# ----------------------------------------------------------------------------- report
def cmd_report(args: argparse.Namespace) -> int:
    from kvsched.analysis.regret import select_objective
    from kvsched.analysis.report import check_report_folder, database_report, instance_report
    from kvsched.analysis.store import load_results, names_database

    # --time-limit bounds the command: loading and the policies count against the solve.
    deadline = Deadline.for_command(args.time_limit)
    if not Path(args.target).exists():
        raise InputError(f"{args.target}: no such file")
    given = schedule_paths(args.schedule)
    compared = None  # when the policies and the solve returned (an instance only)
    stopped = False  # whether Ctrl-C stopped the comparison (an instance only)
    # By header or by suffix: an empty or damaged .sqlite gets the database's error, not an instance's.
    if names_database(args.target):
        # Read first, as an instance is: a bad database is one error line and leaves no empty --out folder.
        frame = load_results(args.target)
        if frame.empty:
            raise InputError(f"{args.target}: the results database is empty")
        if given:
            raise InputError("--schedule: a results database's report reads its schedules from the database")
        _refuse_instance_flags(args)
        frame = select_objective(frame, args.objective)
        check_report_folder(args.out, "--out", [args.target])
        path = database_report(args.target, args.out, against=args.against, frame=frame)
    else:
        from kvsched.analysis import compare
        from kvsched.commands.solve import print_comparison

        args.objective = args.objective or DEFAULT_OBJECTIVE

        # Read first: a bad instance is one error line and leaves no empty --out folder behind.
        instance = load_instance_from_args(args.target, args)
        policies, schedules = read_given(args, instance)
        check_report_folder(args.out, "--out", [args.target, *given_inputs(args)])
        cmp = compare(
            instance,
            policies,
            schedules=schedules,
            objective=args.objective,
            solver=None if args.no_solver else args.solver,
            formulation=args.formulation,
            options=solver_options(args),
            skip_solver_errors=True,
            solve_options=None if args.no_solver else model_kwargs(args),
            # Time is kept for the table and for drawing the figures after the solve.
            deadline=solve_deadline(deadline, instance, ("summary", "figures"), warn="report"),
            keep_traces=True,  # the figures draw the replays the comparison made
        )
        compared = deadline.elapsed()
        stopped = bool(cmp.interrupted)
        print_comparison(cmp, args.objective, instance.name or args.target)
        # The figures that fit the limit (the page names the ones left out; the solve kept their time).
        path = instance_report(
            instance,
            args.out,
            objective=args.objective,
            source=args.target,
            comparison=cmp,
            deadline=deadline,
        )
    Console(stderr=True).print(f"wrote {path}", markup=False, highlight=False)
    if compared is not None:
        note_late(deadline, {"solved": compared}, command="report", stage="the policies and the solve")
    return interrupted_exit("report", stopped)


def _refuse_instance_flags(args: argparse.Namespace) -> None:
    """One :class:`InputError` when a database's report is given an engine-limit or cost-model flag.

    Refused, as ``--schedule`` is, rather than ignored with a note: the database's cells were solved
    and simulated on their own instances, so no flag can change its report, and a report that looked
    like it had taken one would show other limits than those asked for.
    """
    named = [LIMIT_FLAGS[name] for name in limit_overrides(args)]
    named += [
        flag
        for flag, value in (("--cost-model", args.cost_model), ("--cost-param", args.cost_param))
        if value
    ]
    if named:
        raise InputError(
            f"{named[0]}: a results database's report reads each cell's limits and cost model from the "
            "database; the engine-limit and cost-model flags are for an INSTANCE or a CSV trace"
        )


# ----------------------------------------------------------------------------- parser
#: ``kvsched.analysis.regret.AGAINST``, spelled out here so that building the parser does not import the
#: analysis package (and with it the solvers): every command starts faster (tests check they agree).
AGAINST = ("optimum", "bound", "certified", "best-policy")


def _add_against(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--against",
        choices=AGAINST,
        help="regret reference: optimum (solver incumbent), bound (solver's proven bound), certified (bound "
        "valid for every schedule), best-policy (default: optimum when the sweep ran a solver)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``kvsched`` parser."""
    p = sub.add_parser(
        "sweep",
        help="run a grid of instances x policies (x the exact solver) into a results database",
        description="Run every cell of the sweep SPEC (YAML: instance generators and their axes, policies, an "
        "optional solver; see docs/analysis.md) that the database does not hold yet, in parallel. Each row is "
        "committed as it finishes, so an interrupted sweep keeps its work and a rerun skips it.",
    )
    p.add_argument("spec", help="sweep spec .yaml")
    p.add_argument("--db", default="results.sqlite", help="results database (default results.sqlite)")
    p.add_argument(
        "--workers", type=positive_int, default=2, help="parallel workers (default 2; 1: in process)"
    )
    p.add_argument("--backend", choices=("process", "ray"), default="process", help="(default process)")
    p.add_argument("--address", help="Ray cluster address (with --backend ray; default: a local Ray)")
    add_slo_arg(p)
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: when stderr is a terminal)",
    )
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser(
        "results",
        help="summarise or export a results database",
        description="Without --to, print the cells per sweep, kind and status. With --to, export every row "
        "(configuration parameters and run metrics as columns) as CSV or Parquet (Parquet needs pyarrow).",
    )
    p.add_argument("db", help="results database (.sqlite)")
    p.add_argument("--to", choices=("csv", "parquet"), help="export format")
    p.add_argument("--out", "-o", help="export file")
    p.set_defaults(func=cmd_results)

    p = sub.add_parser(
        "regret",
        help="regret per policy over a sweep's instances",
        description="Aggregate a results database per policy: mean, median and max regret (percent of the "
        "reference), mean absolute regret, stability (std of the percent regret) and win rate.",
    )
    p.add_argument("db", help="results database (.sqlite)")
    _add_against(p)
    p.add_argument("--objective", help="objective to aggregate when the database holds several")
    p.add_argument("--sweep", help="only the cells of this sweep (shared with other sweeps or not)")
    p.add_argument("--csv", help="also write the table as CSV")
    p.set_defaults(func=cmd_regret)

    p = sub.add_parser(
        "plot",
        help="draw a figure (gantt, kv, load, regret, cdf, anytime)",
        description="gantt: one schedule per request with KV usage against M; kv: KV usage of several policies; "
        "cdf: TTFT and TBT distributions; anytime: the solver's incumbent and bound over time (INSTANCE, or a "
        "result .json from kvsched solve --json); load: a metric against load from a results database; "
        "regret: regret against instance size from a results database. PNG, SVG or PDF by --out's suffix.",
    )
    p.add_argument("kind", choices=PLOT_KINDS, help="the figure")
    p.add_argument(
        "source", metavar="INSTANCE|DB", help="instance .json (gantt, kv, cdf, anytime) or database"
    )
    p.add_argument("--out", "-o", required=True, help="figure file (.png, .svg or .pdf)")
    p.add_argument("--policy", help="gantt: the policy to draw")
    p.add_argument("--schedule", help="gantt: a schedule .json to draw")
    p.add_argument(
        "--solve", action="store_true", help="gantt, kv, cdf: also (gantt: instead) the exact optimum"
    )
    p.add_argument(
        "--policies", default="sarathi,vllm,vllm-ef", help="kv, cdf: comma-separated policies, or all"
    )
    p.add_argument("--x", help="load: the x column (default rate when it varies, else n)")
    p.add_argument("--metric", default="mean_latency", help="load: the y column (default mean_latency)")
    p.add_argument("--sweep", help="load, regret: only the cells of this sweep (shared or not)")
    _add_against(p)
    add_solver_args(p)
    # None: a database's figures take the objective it holds (several are refused); an instance's the default.
    p.set_defaults(func=_plot_entry, objective=None)

    p = sub.add_parser(
        "report",
        help="write a self-contained HTML report for an instance or a results database",
        description="For an INSTANCE: solve it (time-limited), compare every policy, and show the table, Gantt "
        "charts of the optimum and the best and worst policies, KV usage, TTFT/TBT distributions and the "
        "solver's progress. For a results DB: the regret table, latency vs load and regret vs size. Writes "
        "OUT/index.html with every figure embedded (no external assets).",
    )
    p.add_argument(
        "target", metavar="INSTANCE|DB", help="instance .json, CSV trace (.csv, .csv.gz) or results database"
    )
    p.add_argument("--out", "-o", default="report", help="output folder (default report/)")
    add_given_args(p)
    p.add_argument("--no-solver", action="store_true", help="compare the policies only")
    _add_against(p)
    add_solver_args(p)
    # As compare, solve, simulate and bound take them (a CSV trace needs -M): for an INSTANCE only.
    add_limit_args(p)
    add_cost_args(p)
    # None: a database's report takes the objective it holds (several are refused); an instance's the default.
    p.set_defaults(func=cmd_report, objective=None)


def _plot_entry(args: argparse.Namespace) -> int:
    # One positional serves both instance and database plots.
    args.instance = args.db = args.source
    return cmd_plot(args)
