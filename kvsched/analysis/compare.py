"""Regret of every heuristic against the exact optimum, on one instance and one cost model.

Each policy runs in the simulator, whose semantic core checks every batch as
it is made (one pass: ``validate=True`` replays each schedule again through the
independent validator), and its trace is measured. The exact solver is warm-started from the best
heuristic schedule. A policy's objective ``h`` is measured against three
references, each column named after its reference (see :func:`add_regret`):

* ``regret_vs_solver = h - incumbent``: the solver's best schedule, the
  optimum over the result's ``scope`` when it is proven;
* ``max_regret_vs_scope_bound = h - B``: B the proven bound over ``scope``
  (equal to ``regret_vs_solver`` when the optimum is proven). The regret
  against the optimum over ``scope`` lies in ``[h - incumbent, h - B]``;
* ``max_regret_vs_all_schedules = h - L``: L a lower bound valid for every
  legal schedule (the combinatorial bounds, and the solver's bounds whose
  scope is every schedule). No heuristic can be further from the true optimum
  than this: the *certified* regret.

The ``scope`` column names the set the solver's optimum ranges over. The
time-indexed formulation covers only schedules without chunking, pauses or
evictions, so a heuristic may beat its optimum (negative regret): that is a
finding about the schedule class, and the certified column stays valid.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import pandas as pd

from kvsched.csp import BACKENDS, FORMULATIONS, Result, Scope, SolverOptions, SolveStatus, solve
from kvsched.csp.bounds import portfolio
from kvsched.csp.driver import check_options
from kvsched.csp.formulations import FORMULATIONS as EXACT_FORMULATIONS
from kvsched.csp.formulations import make_formulation
from kvsched.csp.incumbents.complete import reserved_batches
from kvsched.csp.objectives import OBJECTIVES, objective_origin
from kvsched.errors import InputError, KvschedError
from kvsched.heuristics import POLICIES, Policy, SimResult, make_policy, simulate
from kvsched.heuristics.own import is_file_ref, missing_members
from kvsched.heuristics.registry import check_policy_name
from kvsched.instances.model import Instance, expect_instance
from kvsched.schedule.ir import Schedule, expect_schedule
from kvsched.schedule.metrics import RunMetrics, request_columns, run_metrics
from kvsched.schedule.records import Rule, Violation
from kvsched.schedule.serving import SLO, ServingMetrics, expect_slo, serving_metrics
from kvsched.schedule.tokens import BatchClock, token_stats
from kvsched.schedule.validate import Trace, replay
from kvsched.stop import INTERRUPTS, Deadline, DeadlineReached, interrupted

#: The regret columns, each named after what it is measured against (see :func:`add_regret`).
REGRET = "regret_vs_solver"
REGRET_PCT = "regret_vs_solver_pct"
MAX_REGRET_SCOPE = "max_regret_vs_scope_bound"
MAX_REGRET_ALL = "max_regret_vs_all_schedules"
REGRET_COLUMNS = (REGRET, REGRET_PCT, MAX_REGRET_SCOPE, MAX_REGRET_ALL)
#: Keyword arguments of :func:`kvsched.csp.solve` that ``solve_options`` may set (compare sets the rest).
SOLVE_OPTIONS = ("allow_eviction", "strengthen", "export")
#: Share of a comparison's time limit in which policies may start (all of it without a solver): the solver's
#: first schedule and bounds need the rest.
POLICY_SHARE = 0.5
#: The ``error`` of a policy that a time limit left unrun.
NOT_RUN = "not run: the time limit ran out before it"
#: The ``error`` of a policy that Ctrl-C left unrun (or stopped while it ran).
INTERRUPTED = "not run: interrupted (Ctrl-C)"
#: The ``error`` of a policy stopped by the time limit while it ran (a slow policy on 100k requests ran
#: for 17 minutes inside ``compare --time-limit 20``).
CUT = "not finished: the time limit ran out while it ran"


@dataclass(frozen=True, slots=True, eq=False)
class Comparison:
    """The outcome of :func:`compare`.

    Parameters
    ----------
    table
        One row per policy (and one for the solver), indexed by name.
    result
        The solver's result (``None`` when no solver ran).
    objective
        The objective every row is measured in.
    lower_bound
        The best lower bound valid for every legal schedule (``None`` if none is known).
    schedules
        Every schedule compared, by row name.
    metrics
        The whole-run metrics of every schedule compared, by row name.
    solver_error
        Why the solver could not run (only with ``skip_solver_errors=True``).
    serving
        The serving metrics (TTFT, TPOT, ITL, E2EL, goodput) of every schedule compared, by row name.
    traces
        With ``keep_traces``: the replays of the solver's schedule and of the best and the worst policy
        (what :func:`~kvsched.analysis.report.instance_report` draws), by row name; else empty.
    interrupted
        Where Ctrl-C stopped the comparison (``"during the policies"``, ``"during the solve"``), else ``""``:
        the rows finished before it are kept, the policies after it are :data:`INTERRUPTED` rows.
    """

    table: pd.DataFrame
    result: Result | None
    objective: str
    lower_bound: float | None
    schedules: Mapping[str, Schedule] = field(default_factory=dict)
    metrics: Mapping[str, RunMetrics] = field(default_factory=dict)
    solver_error: str | None = None
    serving: Mapping[str, ServingMetrics] = field(default_factory=dict)
    traces: Mapping[str, Trace] = field(default_factory=dict)
    interrupted: str = ""


def _row(
    m: RunMetrics, s: ServingMetrics, name: str, value: float, kind: str, runtime: float
) -> dict[str, Any]:
    good = {} if s.good_requests is None else {"goodput_fraction": s.goodput_fraction}
    return {
        "name": name,
        "kind": kind,
        "objective": value,
        "mean_latency": m.mean_latency,
        "mean_ttft": m.mean_ttft,
        "p99_ttft": m.p99_ttft,
        "max_tbt": m.max_tbt,
        f"tokens_per_{s.time_unit}": m.tokens_per_s,  # tokens_per_slot under the unit model
        "makespan": m.makespan,
        "evictions": m.evictions,
        "batches": m.num_batches,
        "runtime_s": runtime,
        **good,
    }


def policy_names(policies: str | Iterable[str], what: str = "policies", *, files: bool = False) -> list[str]:
    """Registered policy names from ``"all"``, ``"a,b"`` or a sequence of names; else :class:`InputError`.

    With ``files``, a policy of one's own named ``FILE.py:CLASS`` passes as well (the command line's form).
    The error names the argument (``what``) and the offending value; a name given twice is refused.
    """
    if isinstance(policies, str):
        text = policies.strip()
        names = list(POLICIES) if text == "all" else [p.strip() for p in text.split(",") if p.strip()]
    else:
        try:
            names = list(policies)
        except TypeError:
            raise InputError(
                f"{what}: expected 'all', a comma-separated string or a list of policy names, "
                f"got {type(policies).__name__}"
            ) from None
        for name in names:
            if not isinstance(name, str):
                raise InputError(f"{what}: policy names are strings, got {name!r}")
    for name in names:
        if not (files and is_file_ref(name)):
            check_policy_name(name, what)
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InputError(f"{what}: {', '.join(map(repr, dup))} given more than once")
    return names


def _check_arguments(objective: str, solver: str | None, formulation: str) -> None:
    if objective not in OBJECTIVES:
        raise InputError(f"objective: unknown objective {objective!r} (known: {', '.join(OBJECTIVES)})")
    if solver is not None and solver not in BACKENDS:
        raise InputError(f"solver: unknown solver {solver!r} (known: {', '.join(BACKENDS)}, or None)")
    if formulation not in FORMULATIONS:
        raise InputError(
            f"formulation: unknown formulation {formulation!r} (known: {', '.join(FORMULATIONS)})"
        )


def _policies(policies: object, params: Mapping[str, Mapping[str, Any]]) -> dict[str, Policy]:
    """Every policy built before any runs, so that a bad name or parameter stops the comparison.

    ``policies`` as :func:`compare` takes it: registered names (``"all"``, ``"a,b"``) and policy objects.
    """
    if isinstance(policies, str):
        entries: list[object] = list(policy_names(policies))
    elif _is_policy(policies):
        entries = [policies]
    else:
        try:
            entries = list(policies)  # type: ignore[call-overload]
        except TypeError:
            raise InputError(
                "policies: expected 'all', a comma-separated string or a list of policy names and Policy "
                f"objects, got {type(policies).__name__}"
            ) from None
    names = policy_names([e for e in entries if isinstance(e, str)])  # known names, each once
    labels = [e if isinstance(e, str) else _policy_label(e) for e in entries]
    dup = sorted({n for n in labels if labels.count(n) > 1})
    if dup:
        raise InputError(
            f"policies: {', '.join(map(repr, dup))} given more than once (a Policy's name names its row)"
        )
    stray = sorted(set(params) - set(names))
    if stray:
        own = [n for n in stray if n in labels]
        if own:
            raise InputError(
                f"policy_params: {', '.join(map(repr, own))} is a Policy object: give its parameters "
                "when you build it"
            )
        raise InputError(f"policy_params: {', '.join(map(repr, stray))} not among the policies compared")
    out: dict[str, Policy] = {}
    for entry, label in zip(entries, labels, strict=True):
        if not isinstance(entry, str):
            out[label] = entry  # type: ignore[assignment]
            continue
        try:
            out[label] = make_policy(entry, **params.get(entry, {}))
        except InputError as exc:
            raise InputError(f"policy_params: {exc}") from None
    return out


def _is_policy(value: object) -> bool:
    return not isinstance(value, str | bytes | type) and not missing_members(value)


def _policy_label(value: object) -> str:
    """The row name of a policy object; else one :class:`InputError` saying what it lacks."""
    if isinstance(value, type):
        raise InputError(
            f"policies: {value.__name__} is a class: pass an instance of it ({value.__name__}(...))"
        )
    missing = missing_members(value)
    if missing:
        raise InputError(
            f"policies: expected a policy name or a Policy object, got {type(value).__name__} "
            f"(it has no {', '.join(missing)}; see kvsched.Policy)"
        )
    for method in ("reset", "next_batch"):
        if not callable(getattr(value, method)):
            raise InputError(
                f"policies: {type(value).__name__}.{method} is not a method (see kvsched.Policy)"
            )
    name = value.name
    if not isinstance(name, str) or not name.strip():
        raise InputError(
            f"policies: a {type(value).__name__}'s name names its row: expected a non-empty string, "
            f"got {name!r}"
        )
    return name


def _expect_schedules(schedules: object, policies: Mapping[str, Policy]) -> dict[str, Schedule]:
    """``schedules`` as a dict of names to schedules (checked, none named like a policy), or one error."""
    if schedules is None:
        return {}
    if not isinstance(schedules, Mapping):
        got = type(schedules).__name__
        raise InputError(f"schedules: expected a mapping of names to Schedule objects, got {got}")
    out: dict[str, Schedule] = {}
    for name, schedule in schedules.items():
        if not isinstance(name, str) or not name.strip():
            raise InputError(f"schedules: each schedule is named by a non-empty string, got {name!r}")
        if name in policies:
            raise InputError(f"schedules: {name!r} is also a policy's name (each row has its own)")
        out[name] = expect_schedule(schedule, f"schedules[{name!r}]")
    return out


def illegal_schedule(violations: list[Violation]) -> str:
    """The ``error`` of a row whose schedule the core refused: the count and the first violation."""
    first = violations[0]
    plural = "s" if len(violations) > 1 else ""
    text = f"illegal schedule ({len(violations)} violation{plural}; the first: {first})"
    rules = {v.rule for v in violations}
    # Batches longer than the model's also overlap the next ones' starts: still only a matter of timing.
    if Rule.WRONG_DURATION in rules and rules <= {Rule.WRONG_DURATION, Rule.OVERLAP}:
        text += (
            " - its batch durations are not the cost model's: kvsched.retime(instance, schedule, cost_model)"
        )
        text += " rebuilds them (compare --retime on the command line)"
    return text


def _check_solver(
    instance: Instance,
    objective: str,
    solver: str,
    formulation: str,
    options: SolverOptions,
    solve_options: Mapping[str, Any],
) -> str | None:
    """Check the solver's configuration before anything runs (a bad one raises :class:`InputError`).

    Returns why the formulation cannot take ``instance`` (e.g. the time-indexed
    model on a seconds-based cost model), or None: building the formulation
    object checks that in milliseconds, where the solve itself would only find
    it after every policy has run. A name the solve driver resolves itself
    (``auto``, which takes every instance) has no formulation object to build.
    """
    check_options(options)  # the solve's own checks (time limit, threads, gap, seed), before any policy runs
    stray = sorted(set(solve_options) - set(SOLVE_OPTIONS))
    if stray:
        raise InputError(
            f"solve_options: unknown {', '.join(map(repr, stray))} (known: {', '.join(SOLVE_OPTIONS)})"
        )
    if formulation not in EXACT_FORMULATIONS:
        return None
    try:
        make_formulation(
            formulation,
            instance,
            objective,
            allow_eviction=bool(solve_options.get("allow_eviction", True)),
            solver=solver,
            seed=options.seed,
        )
    except KvschedError as exc:
        return str(exc)
    return None


def _metrics(trace: Any, slo: SLO | None) -> tuple[RunMetrics, ServingMetrics]:
    """A trace's run and serving metrics from one batch clock, one pass over its token gaps and one set
    of per-request columns (no DataFrame: built, then read back, it cost ~7 ms a policy, and the run
    metrics laid out the clock again)."""
    clock = BatchClock.of(trace)
    stats = token_stats(trace, clock)
    columns = request_columns(trace, stats)
    run = run_metrics(trace, requests=columns, clock=clock)
    return run, serving_metrics(trace, slo, requests=[columns], stats=[stats])


def compare(
    instance: Instance,
    policies: str | Iterable[str],
    *,
    objective: str = "total-latency",
    solver: str | None = "highs",
    formulation: str = "auto",
    options: SolverOptions | None = None,
    policy_params: Mapping[str, Mapping[str, Any]] | None = None,
    skip_solver_errors: bool = False,
    solve_options: Mapping[str, Any] | None = None,
    slo: SLO | None = None,
    deadline: Deadline | None = None,
    validate: bool = False,
    schedules: Mapping[str, Schedule] | None = None,
    keep_traces: bool = False,
) -> Comparison:
    """Run ``policies`` and the exact solver on ``instance`` and tabulate their regret.

    ``policies`` is ``"all"``, a comma-separated string or a sequence of
    registered names and :class:`~kvsched.heuristics.Policy` objects (your own
    scheduler: its row is named by its ``name``); an unknown name, a bad ``objective``, ``solver`` or
    ``formulation``, or a parameter in ``policy_params`` that its policy does
    not take raises :class:`~kvsched.errors.InputError` naming the argument,
    before anything runs. ``schedules`` adds schedules made elsewhere (a name for
    each: an engine's log, a schedule file), each replayed through the semantic core
    on the instance's cost model; an illegal one is a row whose ``error`` gives its
    first violation, a legal one is measured and may warm-start the solver like the
    policies' best. ``slo`` gives every schedule's goodput (column
    ``goodput_fraction`` and :attr:`Comparison.serving`).
    A policy that cannot run the instance (e.g. a whole-prompt policy facing a
    prompt over its budget) is reported in the ``error`` column instead of
    stopping the comparison. With ``skip_solver_errors``, so is a solver that
    cannot take the instance (e.g. the time-indexed model on a non-unit cost
    model): the comparison has no solver row and says why in ``solver_error``.
    ``solve_options`` are further keyword arguments of
    :func:`kvsched.csp.solve` (e.g. ``allow_eviction``, ``strengthen``).
    The solver's options and whether its formulation can take the instance are
    checked before any policy runs, so a bad configuration fails at once.
    ``deadline`` is when the comparison must end; the policies run first and
    count against it, each started only within :data:`POLICY_SHARE` of the time
    left (all of it without a solver), so that a limit holds whatever the
    instance's size: a policy not started is a row whose ``error`` is
    :data:`NOT_RUN`, one still running when that share ends is stopped, :data:`CUT`. The solver gets what is left (with nothing left it still
    returns its fast schedule and bounds). Without it every policy runs and the
    solve has ``options.time_limit`` from its own start. ``validate`` replays every policy's
    schedule through :func:`~kvsched.schedule.validate.replay` (the simulator's core
    already checked each batch; the tests replay every policy's schedules). ``keep_traces`` keeps the
    traces a report draws (:attr:`Comparison.traces`; a replay of 100,000 requests takes half a minute,
    and three are held at most, not one per policy).
    """
    _check_arguments(objective, solver, formulation)
    if deadline is not None and not isinstance(deadline, Deadline):
        got = type(deadline).__name__
        raise InputError(
            f"deadline: expected a kvsched Deadline (kvsched.Deadline.after(seconds)), got {got}"
        )
    expect_instance(instance)  # an impossible request is one error, not a failed row per policy
    expect_slo(slo)
    measure = OBJECTIVES[objective]
    built = _policies(policies, policy_params or {})
    given = _expect_schedules(schedules, built)
    if not built and not given and solver is None:
        raise InputError("policies: nothing to compare (no policy and no solver)")
    solver_error = None
    if solver is not None:
        solver_error = _check_solver(
            instance, objective, solver, formulation, options or SolverOptions(), solve_options or {}
        )
        if solver_error is not None and not skip_solver_errors:
            raise InputError(solver_error)
    rows: list[dict[str, Any]] = []
    compared: dict[str, Schedule] = {}
    metrics: dict[str, RunMetrics] = {}
    serving: dict[str, ServingMetrics] = {}
    kept = _Extremes() if keep_traces else None
    # The schedules given first: they are what the comparison is for, and the policies' share of the time is
    # of what they leave (a replay cannot stop halfway and leave a measure).
    given_rows: list[dict[str, Any]] = []
    for name, schedule in given.items():
        started = time.monotonic()
        trace = replay(instance, schedule, strict=False)
        if trace.violations:
            given_rows.append({"name": name, "kind": "schedule", "error": illegal_schedule(trace.violations)})
            continue
        metrics[name], serving[name] = _metrics(trace, slo)
        took = time.monotonic() - started
        given_rows.append(_row(metrics[name], serving[name], name, measure(trace), "schedule", took))
        compared[name] = schedule
    solving = solver is not None and solver_error is None
    policies_by = _policy_deadline(deadline, solving)
    stopped = ""
    # A policy cut for time and finished against reserved peaks: not its row, but a start for the solver,
    # which would otherwise make a first schedule of its own (10k requests under the A100 fit: it ran
    # sarathi again, uncut, after the policies' share had cut it, and `--time-limit 10` ended at 12.5 s).
    start: tuple[float, SimResult] | None = None  # the best run so far, its value first
    try:
        for name, sim in run_policies(instance, built, policies_by, finish=solving):
            if isinstance(sim, str):
                rows.append({"name": name, "kind": "policy", "error": sim})
                continue
            if sim.cut:
                rows.append({"name": name, "kind": "policy", "error": CUT})
                value = measure(sim.trace)
                if start is None or value < start[0]:
                    start = (value, sim)
                continue
            # The core checked every batch as the simulator made it: its trace is the replay's.
            trace = replay(instance, sim.schedule) if validate else sim.trace
            metrics[name], serving[name] = _metrics(trace, slo)
            rows.append(_row(metrics[name], serving[name], name, measure(trace), "policy", sim.runtime))
            compared[name] = sim.schedule
            if start is None or rows[-1]["objective"] < start[0]:
                start = (rows[-1]["objective"], sim)
            if kept is not None:
                kept.offer(name, rows[-1]["objective"], trace)
    except INTERRUPTS as exc:  # Ctrl-C: the rows finished are kept, nothing more starts
        if not interrupted(exc):
            raise
        stopped = "during the policies"
        done = {r["name"] for r in rows}
        rows += [{"name": n, "kind": "policy", "error": INTERRUPTED} for n in built if n not in done]
    rows += given_rows  # (the table lists the policies first)

    result = None
    if solver is not None and solver_error is None and not stopped:
        ran = [r for r in rows if "objective" in r]
        best = min(ran, key=lambda r: r["objective"]) if ran else None
        # A policy's own run is not replayed again by the solve (a given schedule is, there).
        warm: Schedule | SimResult | None = None
        if best is not None:
            warm = compared[best["name"]]
        if start is not None and (best is None or start[0] <= best["objective"]):
            warm = start[1]
        try:
            result = solve(
                instance,
                objective=objective,
                formulation=formulation,
                solver=solver,
                options=options,
                warm_start=warm,
                deadline=deadline,
                **(solve_options or {}),
            )
        except KvschedError as exc:
            if not skip_solver_errors:
                raise
            solver_error = str(exc)
    if result is not None:
        assert result.schedule is not None  # a solve always returns a schedule
        label = f"optimum ({result.formulation}/{solver})"
        trace = result.trace or replay(instance, result.schedule)  # the solve replayed it already
        metrics[label], serving[label] = _metrics(trace, slo)
        rows.append(_row(metrics[label], serving[label], label, measure(trace), "solver", result.runtime))
        compared[label] = result.schedule
        if kept is not None:
            kept.traces[label] = trace

    lower = global_lower_bound(instance, objective, result)
    table = pd.DataFrame(rows).set_index("name")
    if "error" not in table.columns:
        table["error"] = None
    if "objective" not in table.columns:  # no policy could run and no solver ran
        table["objective"] = float("nan")
    if result is not None:
        # A proven optimum is its own bound: the interval closes (the proven bound may sit below it by
        # less than the objective's rounding).
        proven = result.status == SolveStatus.OPTIMAL
        add_regret(
            table,
            result.objective,
            result.objective if proven else result.best_bound,
            lower,
            origin=objective_origin(instance, objective),
        )
        table["scope"] = str(result.scope)
    elif lower is not None:
        add_regret(table, None, None, lower)
    traces = {} if kept is None else kept.traces
    if result is not None and result.stopped == "interrupted":
        stopped = "during the solve"
    return Comparison(
        table, result, objective, lower, compared, metrics, solver_error, serving, traces, stopped
    )


class _Extremes:
    """The traces of the best and the worst policy so far (the first of equals), the others let go."""

    def __init__(self) -> None:
        self.traces: dict[str, Trace] = {}
        self._best: tuple[float, str] | None = None
        self._worst: tuple[float, str] | None = None

    def offer(self, name: str, value: float, trace: Trace) -> None:
        if self._best is None or value < self._best[0]:
            self._best = (value, name)
        if self._worst is None or value > self._worst[0]:
            self._worst = (value, name)
        keep = {self._best[1], self._worst[1]}
        if name in keep:
            self.traces[name] = trace
        for held in [n for n in self.traces if n not in keep]:
            del self.traces[held]


def run_policies(
    instance: Instance,
    policies: Mapping[str, Policy],
    starts_by: Deadline,
    *,
    until_one: bool = False,
    finish: bool = False,
) -> Iterator[tuple[str, SimResult | str]]:
    """Each policy's simulation in turn, or why it has none: :data:`NOT_RUN` (``starts_by`` had passed),
    :data:`CUT` (it passed while the policy ran: a slow policy on 100k requests ran for 17 minutes inside
    ``compare --time-limit 20``) or the policy's own error (it cannot run the instance).

    With ``until_one``, policies start and finish whatever the time until one has a schedule (``plot``
    draws at least one). With ``finish``, a policy cut for time comes back finished against reserved peaks
    by ``starts_by`` (:func:`~kvsched.csp.incumbents.complete.reserved_batches`; ``SimResult.cut`` > 0): not
    the policy's schedule, but a legal one for a solver to start from.
    """
    have_one = not until_one
    for name, policy in policies.items():
        if have_one and starts_by.expired():
            yield name, NOT_RUN
            continue
        try:
            # (Finished once cut, without a reserve for it: finishing a request costs about what the policy
            # spends on one, so a reserve would only cut it sooner, for a poorer schedule.)
            sim = simulate(
                instance, policy, deadline=starts_by if have_one else None,
                finish=reserved_batches if finish else None,
            )  # fmt: skip
        except DeadlineReached:
            yield name, CUT
            continue
        except KvschedError as exc:
            yield name, str(exc)
            continue
        have_one = True
        yield name, sim  # (one cut and finished ends after starts_by: no policy starts after it)


def _policy_deadline(deadline: Deadline | None, solver: bool) -> Deadline:
    """When the last policy may start: within :data:`POLICY_SHARE` of ``deadline``'s time left where a solver
    runs after the policies, else by ``deadline`` (never without one)."""
    if deadline is None:
        return Deadline.never()
    return deadline.share(POLICY_SHARE) if solver else deadline


def add_regret(
    table: pd.DataFrame,
    incumbent: float | None,
    bound: float | None,
    lower: float | None,
    *,
    origin: float = 0.0,
) -> pd.DataFrame:
    """Add the regret columns to ``table`` (which has an ``objective`` column), in place.

    The one definition of regret, shared by :func:`compare` and the sweep
    aggregation (:mod:`kvsched.analysis.regret`). Each column is named after
    its reference.

    Parameters
    ----------
    incumbent
        The solver's best schedule (or any reference objective): gives
        ``regret_vs_solver`` and ``regret_vs_solver_pct``.
    bound
        The solver's proven bound over its scope (its objective when proven
        optimal): gives ``max_regret_vs_scope_bound``, the upper end of the
        regret interval against the optimum over that scope.
    lower
        A lower bound valid for every legal schedule: gives
        ``max_regret_vs_all_schedules`` (the certified regret).
    origin
        The time the objective counts from (the first arrival for the makespan, an absolute time:
        :func:`~kvsched.csp.objectives.objective_origin`): ``regret_vs_solver_pct`` is in percent of the
        incumbent less it (a makespan of 50,010 s against 50,009 s on a trace starting at 50,000 s is
        11% worse, not 0.002%).
    """
    # A public helper: a wrong argument is one InputError naming it, not a TypeError from pandas.
    if not isinstance(table, pd.DataFrame) or "objective" not in table.columns:
        got = (
            type(table).__name__ if not isinstance(table, pd.DataFrame) else "a DataFrame with no such column"
        )
        raise InputError(f"table: expected a pandas DataFrame with an 'objective' column, got {got}")
    for label, value in (("incumbent", incumbent), ("bound", bound), ("lower", lower), ("origin", origin)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, Real)):
            raise InputError(f"{label}: expected a number or None, got {type(value).__name__}")
    if incumbent is not None:
        table[REGRET] = table["objective"] - incumbent
        span = incumbent - float(origin)
        table[REGRET_PCT] = 100.0 * table[REGRET] / span if span else float("nan")
        table[MAX_REGRET_SCOPE] = table["objective"] - bound if bound is not None else float("nan")
    if lower is not None:
        table[MAX_REGRET_ALL] = table["objective"] - lower
    return table


#: The bounds portfolio takes milliseconds; this caps it on huge instances.
PORTFOLIO_SECONDS = 2.0


def global_lower_bound(instance: Instance, objective: str, result: Result | None) -> float | None:
    """The best lower bound on ``objective`` valid for every legal schedule of ``instance``.

    The bounds portfolio (every cost model: :func:`kvsched.csp.bounds.portfolio`),
    the solver's bounds whose scope is every schedule, and its proven optimum
    when its scope is every schedule; ``None`` if none is known.
    """
    bounds = []
    try:
        found = portfolio(instance, objective, Deadline.after(PORTFOLIO_SECONDS))
    except KvschedError:
        found = []
    bounds += [b.value for b in found if b.source not in ("trivial", "empty")]
    if result is not None:
        # Only bounds whose scope is every legal schedule (docs/bounds.md: bound sources and scopes).
        every = result.all_schedules_bound
        if every is not None:
            bounds.append(every.value)
        if result.status == SolveStatus.OPTIMAL and result.scope == Scope.ALL:
            bounds.append(result.objective)
    return max(bounds) if bounds else None
