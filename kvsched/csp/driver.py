"""``solve()``: instance in, :class:`~kvsched.csp.result.Result` out, by one deadline.

The one path every formulation takes:

1. a :class:`~kvsched.stop.Deadline` for the whole solve (the CLI makes it when
   the command starts, so parsing counts too);
2. bounds valid for every legal schedule (cheap, combinatorial);
3. schedules: the warm start, the formulation's own incumbents, and (where
   nothing of the class is found in time) a fast schedule of any kind; each is
   replayed through the semantic core;
4. the model over schedules no worse than the best of the class, unless it is
   too large for the time left (then the result says why);
5. the back end, stopped at the deadline; its solution decoded, replayed
   strictly, and checked against the model;
6. :func:`~kvsched.csp.certify.certify`: a status and a best bound that are true.

A result always has a validated schedule, and a bound wherever one is known.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvsched.csp.backends import (
    RawSolution,
    SolverOptions,
    check_export_path,
    check_solver,
    export_model,
    solve_model,
)
from kvsched.csp.bounds import portfolio
from kvsched.csp.certificate import Scope, narrower, scope_of
from kvsched.csp.certify import ModelError, Seen, certify, model_bound, tolerance
from kvsched.csp.formulations import make_formulation
from kvsched.csp.formulations.base import Built, Declined, Formulation
from kvsched.csp.incumbents import greedy
from kvsched.csp.pipeline import solve_pipeline
from kvsched.csp.result import AnytimePoint, Result, SolveStatus
from kvsched.csp.run import Progress, SolveLog, check_replayable, with_meta
from kvsched.errors import InputError, KvschedError, expect_path
from kvsched.heuristics import SimResult, make_policy, simulate
from kvsched.instances.model import Instance, expect_instance
from kvsched.schedule.ir import Schedule, expect_schedule
from kvsched.schedule.validate import instance_cost_model, replay
from kvsched.stop import Deadline, check_time_limit
from kvsched.threads import check_threads

FORMULATIONS = ("auto", "time", "batch")
#: ``auto`` runs the exact batch-indexed model up to this many requests (it proves ShareGPT draws of
#: up to 12-15 in a minute), the certified pipeline beyond, or where no exact model applies.
AUTO_EXACT_MAX = 12
#: Share of the time ``auto`` gives the certified pipeline before the exact model, at most (it ends
#: earlier where its stages run out of work: 1 s on 12 ShareGPT requests / 10). Its schedule is the exact
#: model's warm start and its bounds stay in the certificate: a model too large to prove anything in the
#: time (6 chunked `infermax-linear` requests: 42,000 variables, 1.5M nonzeros) then costs nothing, where
#: alone it left the greedy's 1.744 against 1.438 (the pipeline: 1.715 against 1.503 in 13 s).
AUTO_PIPELINE_SHARE = 0.3
#: Share of what is left that the formulation's own incumbents may use.
INCUMBENT_SHARE = 0.5
#: Share of what is left for the time-indexed incumbent of a batch-indexed solve.
TIME_INDEXED_SHARE = 0.2
#: Seconds kept after the back end for decoding and replaying its schedule (at most this share of the limit).
DECODE_MARGIN = 0.5
DECODE_SHARE = 0.03
#: The greedy rule for a first schedule when the formulation has none of its own in time (any class).
FALLBACK_RULE = "remaining-area"
#: Policies tried if the greedy cannot run the instance.
FALLBACK_POLICIES = ("vllm", "sarathi")
#: Share of the time for the bounds portfolio (it takes milliseconds; the share only caps it).
BOUNDS_SHARE = 0.1
#: Share of the time for the first schedule (the greedy finishes in its cheapest mode past it).
FIRST_SHARE = 0.2


def _bounds(run: SolveLog, objective: str, deadline: Deadline) -> None:
    """The bounds portfolio: each bound valid for every legal schedule (docs/bounds.md)."""
    try:
        found = portfolio(run.instance, objective, deadline)
    except KvschedError:  # a cost model no bound covers: no bound of this kind
        return
    for bound in found:
        run.add_bound(bound)
    run.report()


def _fallback(
    run: SolveLog, objective: str, deadline: Deadline, whole: Deadline
) -> tuple[Schedule, float, str] | None:
    """A first schedule of any class, fast: the result when the formulation finds none of its own in time.

    The eviction-aware greedy is event-driven (an idle stretch costs nothing) and
    finishes a complete schedule quickly even once ``deadline`` has passed; where even that would
    overrun ``whole`` (the solve's), it is cut short and the requests it left run against reserved
    peaks (:mod:`kvsched.csp.incumbents.complete`).
    """
    try:
        inc = greedy(run.instance, FALLBACK_RULE, objective=objective, deadline=deadline, stop=whole)
    except KvschedError:
        inc = None
    if inc is not None:
        # greedy() replayed it through the core; it may lie outside the result's scope, so it is not
        # reported as the best schedule until it is the one returned.
        run.record(inc.value, inc.name, scope_of(inc.schedule), incumbent=False)
        run.keep(inc.value, inc.trace)
        return inc.schedule, inc.value, inc.name
    for name in FALLBACK_POLICIES:
        try:
            schedule = simulate(run.instance, make_policy(name)).schedule
        except KvschedError:
            continue
        return schedule, run.evaluate(schedule, f"policy {name}", incumbent=False), f"policy {name}"
    return None


def check_options(options: SolverOptions) -> None:
    """A bad option is one :class:`InputError` naming it, before any work (as :func:`kvsched.compare` does)."""
    if not isinstance(options, SolverOptions):
        raise InputError(f"options: expected kvsched.SolverOptions(...), got {type(options).__name__}")
    check_threads(options.threads, "options.threads")
    limit = options.time_limit
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int | float):  # (float("1") would take "1")
            raise InputError(f"options.time_limit: must be a number of seconds or None, got {limit!r}")
        check_time_limit(limit, "options.time_limit")
    gap = options.gap  # type first: "0" < 1 is a TypeError, and NaN passes no comparison
    if isinstance(gap, bool) or not isinstance(gap, int | float) or not 0 <= gap < 1:
        raise InputError(f"options.gap: must be in [0, 1) (a number), got {gap!r}")
    if not isinstance(options.log, bool):  # (a str "False" would turn the solver's log on)
        raise InputError(f"options.log: must be True or False, got {options.log!r}")
    seed = options.seed  # the back ends (numpy's generators among them) take only a seed >= 0
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"options.seed: must be a whole number >= 0, got {seed!r}")


def solve(
    instance: Instance,
    *,
    objective: str = "total-latency",
    formulation: str = "auto",
    solver: str = "highs",
    options: SolverOptions | None = None,
    warm_start: Schedule | SimResult | None = None,
    export: str | Path | None = None,
    allow_eviction: bool = True,
    strengthen: bool = True,
    deadline: Deadline | None = None,
    progress: Progress | None = None,
    time_limit: float | None = None,
) -> Result:
    """Find a hindsight-optimal schedule, or the best one found and a proven bound, by a deadline.

    Parameters
    ----------
    objective
        ``total-latency`` (sum of completion minus arrival), ``makespan`` or ``sum-ttft``.
    formulation
        ``auto`` (default): up to :data:`AUTO_EXACT_MAX` requests under unit or
        infermax-linear time, the certified pipeline (:mod:`kvsched.csp.pipeline`)
        for a share of the time and then the batch-indexed model from its best
        schedule; the pipeline alone otherwise; the result's ``stats["auto"]``
        says which and why.
        ``time``: the time-indexed model (unit time; schedules that serve each
        request without a break: :data:`Scope.CONTIGUOUS`);
        ``batch``: the batch-indexed model (every legal schedule: chunking,
        eviction, arrivals; unit or infermax-linear time; block size 1).
    solver
        ``highs``, ``cbc`` or ``cpsat``.
    options
        Threads, gap, seed, log, and ``time_limit`` when no ``deadline`` is given.
    warm_start
        A schedule to start from (used when it lies in the formulation's class
        and beats the formulation's own), or a policy's :class:`~kvsched.heuristics.SimResult` (its
        schedule, not replayed again: the simulator's core checked every batch as it was made).
    export
        Also write the model as ``.mps`` or ``.lp`` (checked first); written only where an exact model
        is built and passed to the back end, which ``stats["exported"]`` (the path) then says.
    allow_eviction
        ``batch`` only: ``False`` restricts it to eviction-free schedules.
    strengthen
        ``time`` only: local search and reduced-cost windows (``False``: the baseline).
    deadline
        When everything must be done (default: ``options.time_limit`` from now).
    progress
        Called with an :class:`AnytimePoint` (elapsed seconds, best objective,
        best bound) whenever either improves, like OR-Tools' solution callbacks.
    time_limit
        Wall-clock seconds for the whole solve (a shorthand for
        ``deadline=Deadline.after(time_limit)``; default ``options.time_limit``).

    Returns
    -------
    Result
        Always with a replayed, legal schedule; ``optimal`` only when a proven
        bound meets its objective; ``scope`` says which schedules the optimum
        and the bound range over.
    """
    expect_instance(instance)  # its requests checked too: before any bound reads a NaN arrival
    options = options or SolverOptions()
    check_options(options)
    warm_trace = None
    if isinstance(warm_start, SimResult):
        # Its trace is the core's own, on this instance's cost model (10k requests under the A100 fit: a
        # second replay was 3 s of `compare --time-limit 10`).
        trace = warm_start.trace
        if trace.instance is instance and trace.state.cost_model is instance_cost_model(instance):
            warm_trace = trace
        warm_start = warm_start.schedule
    if warm_start is not None:
        expect_schedule(warm_start, "warm_start")
    if export is not None:
        check_export_path(expect_path(export, "export"))
    if progress is not None and not callable(progress):
        raise InputError(
            f"progress: expected a function called with each AnytimePoint (or None), got {progress!r}"
        )
    if deadline is None:
        # Under the API's own name (Deadline.after would say --time-limit, the CLI's).
        seconds = options.time_limit if time_limit is None else check_time_limit(time_limit, "time_limit")
        deadline = Deadline.after(seconds)
    check_solver(solver)
    check_replayable(instance, deadline)
    run = SolveLog(instance, objective, progress)
    if warm_start is not None:
        # Each stage would drop an illegal warm start without a word (it is not an incumbent): a
        # schedule of another instance, or one timed by another cost model, is the caller's mistake.
        # Replayed inside the time limit, and only once: the first evaluation reads this replay.
        try:
            run.replayed(warm_start, warm_trace or replay(instance, warm_start))
        except KvschedError as exc:
            raise InputError(f"warm_start: not a legal schedule of this instance: {exc}") from None
    if formulation == "auto":
        chosen, why = choose_formulation(instance, objective, allow_eviction)
        if chosen == "pipeline":
            result = solve_pipeline(run, objective, deadline, warm_start, options.gap)
        elif allow_eviction:
            result = _pipeline_then_exact(run, objective, solver, options, deadline, warm_start, export)
        else:
            form = make_formulation(
                chosen, instance, objective, allow_eviction=False, solver=solver, seed=options.seed
            )
            result = _solve_exact(
                run, form, objective, solver, options, deadline, warm_start, export, strengthen
            )
        return replace(result, stats={**result.stats, "auto": why})
    form = make_formulation(
        formulation, instance, objective, allow_eviction=allow_eviction, solver=solver, seed=options.seed
    )
    return _solve_exact(run, form, objective, solver, options, deadline, warm_start, export, strengthen)


def _solve_exact(
    run: SolveLog,
    form: Formulation,
    objective: str,
    solver: str,
    options: SolverOptions,
    deadline: Deadline,
    warm_start: Schedule | None,
    export: str | Path | None,
    strengthen: bool,
    *,
    outside: bool = True,
) -> Result | None:
    """One exact formulation's solve. ``outside=False``: None instead of a schedule outside its class."""
    instance = run.instance
    _bounds(run, objective, deadline.share(BOUNDS_SHARE))
    first = None
    if outside:
        # A first schedule of any class, fast (event-driven greedy): everything after only improves it.
        first = _fallback(run, objective, deadline.share(FIRST_SHARE), deadline)
    hopeless = form.hopeless(deadline)
    if hopeless:
        if first is None:
            return None
        return _finish(run, form, objective, solver, *first, None, {}, hopeless, scope=Scope.ALL)

    # ----------------------------------------------------------- schedules
    candidates: list[tuple[Schedule, str]] = []
    if warm_start is not None:
        candidates.append((warm_start, "warm start"))
    if form.time_indexed_warm_start:
        sub = _time_indexed_incumbent(instance, objective, options, deadline.share(TIME_INDEXED_SHARE))
        if sub is not None:
            candidates.append((sub, "time-indexed"))
    candidates += form.incumbents(deadline.share(INCUMBENT_SHARE), options)
    best: tuple[Schedule, float, str] | None = None
    if first is not None and form.in_class(first[0]):  # replayed once already
        run.seen.append(Seen(first[1], narrower(form.scope, scope_of(first[0])), first[2]))
        best = first
    for schedule, label in candidates:
        if best is not None and deadline.expired():  # each replay of a long schedule takes a while
            break
        try:
            value = run.evaluate(schedule, label, incumbent=False)
        except KvschedError:  # an illegal warm start is not an incumbent
            continue
        if form.in_class(schedule):
            run.seen[-1] = Seen(value, narrower(form.scope, scope_of(schedule)), label)
            run.adopt(schedule, value)
            if best is None or value < best[1] - tolerance(value, run.origin):
                best = (schedule, value, label)
    if best is None:
        if first is None:
            return None
        why = "no schedule of the class was found in time"
        return _finish(run, form, objective, solver, *first, None, {}, why, scope=Scope.ALL)

    # --------------------------------------------------------------- model
    hint, upper, hint_source = best
    built = form.build(hint, deadline, options, strengthen)
    for b in built.bounds:
        run.add_bound(b)
    if isinstance(built, Declined):
        if built.incumbent is not None:
            value = run.evaluate(built.incumbent, "local search", form.scope)
            if value < upper:
                hint, upper, hint_source = built.incumbent, value, f"{hint_source} + local search"
        return _finish(
            run, form, objective, solver, hint, upper, hint_source, None, built.stats, built.reason
        )
    run.report()
    return _solve_built(
        run, form, built, objective, solver, options, deadline, hint, upper, hint_source, export
    )


def _pipeline_then_exact(
    run: SolveLog,
    objective: str,
    solver: str,
    options: SolverOptions,
    deadline: Deadline,
    warm_start: Schedule | None,
    export: str | Path | None,
) -> Result:
    """``auto`` on a small instance: the certified pipeline first (:data:`AUTO_PIPELINE_SHARE`), then the
    exact batch-indexed model from its best schedule, both in one log, so that the result is never worse than
    either and its certificate holds every bound either proved (both range over every legal schedule)."""
    form = make_formulation("batch", run.instance, objective, solver=solver, seed=options.seed)
    try:
        first = solve_pipeline(run, objective, deadline.share(AUTO_PIPELINE_SHARE), warm_start, options.gap)
    except KvschedError:  # no greedy rule or policy ran it: the exact model alone
        result = _solve_exact(run, form, objective, solver, options, deadline, warm_start, export, True)
        if result is None:
            raise
        return result
    if first.status == SolveStatus.OPTIMAL or deadline.expired() or first.stopped in ("interrupted", "gap"):
        return first
    exact = _solve_exact(run, form, objective, solver, options, deadline, first.schedule, export, True)
    pipeline = {"pipeline": {"objective": first.objective, "found_by": first.stats.get("found_by")}}
    if exact is not None and exact.objective <= first.objective + tolerance(first.objective, run.origin):
        return replace(exact, stats={**exact.stats, **pipeline})
    # The model was declined before it saw the pipeline's schedule (too large for the time left): the
    # pipeline's schedule stands, against every bound found since.
    status, bound = certify(first.objective, Scope.ALL, run.bounds, run.seen, origin=run.origin)
    why = exact.stats.get("stopped", "") if exact is not None else "no schedule of the model's class in time"
    return Result.settled(
        status,
        first.objective,
        bound,
        run.started,
        origin=run.origin,
        schedule=with_meta(first.schedule, status=str(status)),
        anytime=tuple(run.points),
        solver=first.solver,
        formulation=first.formulation,
        objective_name=objective,
        stats={**first.stats, "exact_model": why},
        scope=Scope.ALL,
        bounds=tuple(run.bounds),
        stopped="" if status == SolveStatus.OPTIMAL else (first.stopped or "deadline"),
        trace=first.trace,
    )


def choose_formulation(instance: Instance, objective: str, allow_eviction: bool) -> tuple[str, str]:
    """What ``--formulation auto`` runs on ``instance``, and why (one line for the user)."""
    n = len(instance)
    if not allow_eviction:
        return "batch", "eviction-free schedules only: the batch-indexed model"
    if n > AUTO_EXACT_MAX:
        return (
            "pipeline",
            f"{n} requests: the certified pipeline (exact models prove up to about {AUTO_EXACT_MAX})",
        )
    try:
        make_formulation("batch", instance, objective)
    except KvschedError as exc:
        return "pipeline", f"the certified pipeline (no exact model: {exc})"
    return (
        "batch",
        f"{n} requests: the certified pipeline, then the exact batch-indexed model from its best schedule "
        "(every legal schedule)",
    )


def _time_indexed_incumbent(
    instance: Instance, objective: str, options: SolverOptions, deadline: Deadline
) -> Schedule | None:
    """The time-indexed model's best schedule by ``deadline``: a warm start for the batch-indexed model.

    It has no chunking or evictions, but where those do not pay its optimum is a
    far better incumbent than the policies (142 against 161 on 12 ShareGPT
    requests / 40): the horizon and every window shrink with it. None where the
    class does not apply or has nothing by the deadline.
    """
    try:
        form = make_formulation("time", instance, objective, seed=options.seed)
        result = _solve_exact(
            SolveLog(instance, objective, None), form, objective, "highs", options, deadline, None, None, True,
            outside=False,
        )  # fmt: skip
    except KvschedError:  # outside the time-indexed class (chunks needed, arrivals off the grid, ...)
        return None
    return None if result is None else result.schedule


def _solve_built(
    run: SolveLog,
    form: Formulation,
    built: Built,
    objective: str,
    solver: str,
    options: SolverOptions,
    deadline: Deadline,
    hint: Schedule,
    upper: float,
    hint_source: str,
    export: str | Path | None,
) -> Result:
    model, scale = built.model, form.scale
    bad = model.violations(model.hint)
    if bad:
        raise ModelError(f"the warm start violates the model: {bad[0]}")
    if export is not None:
        export_model(model, export)
    margin = min(DECODE_MARGIN, DECODE_SHARE * deadline.limit) if deadline.bounded else 0.0
    user = run.progress

    def forward(p: AnytimePoint) -> None:
        if user is not None:
            user(
                AnytimePoint(
                    run.elapsed(),
                    p.incumbent * scale if p.incumbent is not None else None,
                    p.bound * scale if p.bound is not None else None,
                )
            )

    try:
        raw = solve_model(model, solver, options, deadline.before(margin))
    except KeyboardInterrupt:  # Ctrl-C: keep the incumbent
        raw = RawSolution(SolveStatus.UNKNOWN, None, None, None, run.elapsed(), stopped="interrupted")
    for p in raw.anytime:
        forward(p)
    schedule, value, found_by = hint, upper, hint_source
    if raw.x is not None:
        decoded = built.decode(raw.x)
        decoded_value = run.measure(replay(run.instance, decoded))  # strict: raises if illegal
        _check_model(form, built, decoded, decoded_value, raw, options, run.origin)
        run.seen.append(Seen(decoded_value, form.scope, "decoded"))
        # Never a worse schedule for the one held, not even by the objective's rounding: a decoded schedule
        # 1.2e-9 s worse than the warm start's replaced it and was called optimal.
        if decoded_value <= upper:
            schedule, value, found_by = decoded, decoded_value, solver
    run.add_bound(
        model_bound(raw, scale=scale, integral=model.integral_objective, source=solver, scope=form.scope)
    )
    run.report(incumbent=value)
    stats = {**built.stats, "upper_bound": upper, "found_by": found_by}
    if export is not None:  # the caller can tell an export from a solve that built no model to write
        stats["exported"] = str(export)
    stopped = raw.stopped or ("deadline" if deadline.expired() else "")
    return _finish(run, form, objective, solver, schedule, value, hint_source, raw, stats, stopped)


def _check_model(
    form: Formulation,
    built: Built,
    schedule: Schedule,
    value: float,
    raw: RawSolution,
    options: SolverOptions,
    origin: float,
) -> None:
    """The model must value the decoded schedule as the core does, and never claim better (``origin``: the
    objective's, :func:`~kvsched.csp.certify.tolerance`)."""
    scale = form.scale
    tol = tolerance(value, origin)
    if built.encode is not None:
        own = built.encode(schedule)
        bad = built.model.violations(own)
        if bad:
            raise ModelError(f"the model rejects the schedule decoded from its own solution: {bad[0]}")
        if abs(built.model.objective_value(own) * scale - value) > tol:
            raise ModelError(
                f"the model values the decoded schedule at {built.model.objective_value(own) * scale!r}, "
                f"the core at {value!r}"
            )
    if raw.objective is not None:
        claimed = raw.objective * scale
        if claimed < value - tol:
            raise ModelError(f"solver objective {claimed!r} is below the replayed {value!r}")
        exact = built.encode is None or (raw.status == SolveStatus.OPTIMAL and options.gap == 0)
        if exact and claimed > value + tol:
            raise ModelError(f"solver objective {claimed!r} differs from the replayed {value!r}")


def _finish(
    run: SolveLog,
    form: Formulation,
    objective: str,
    solver: str,
    schedule: Schedule,
    value: float,
    source: str,
    raw: RawSolution | None,
    stats: dict,
    stopped: str,
    *,
    scope: Scope | None = None,
) -> Result:
    scope = scope or form.scope
    status, bound = certify(
        value, scope, run.bounds, run.seen, None if raw is None else raw.status, origin=run.origin
    )
    schedule = with_meta(schedule, solver=solver, objective=objective, status=str(status), scope=str(scope))
    every = [b for b in run.bounds if b.scope == Scope.ALL]
    stats = {
        "upper_bound": value,  # the best schedule known before the back end ran, where it ran
        **stats,
        "batches": len(schedule),  # (counted without spelling the runs out; a run never evicts)
        "evictions": schedule.num_evictions,
        "warm_start": source,
        "bound_for_every_schedule": max((b.value for b in every), default=None),
    }
    if stopped and status != SolveStatus.OPTIMAL:
        stats["stopped"] = stopped
    run.report(incumbent=value)
    return Result.settled(
        status,
        value,
        bound,
        run.started,
        origin=run.origin,
        schedule=schedule,
        anytime=tuple(run.points),
        solver=solver,
        formulation=form.name,
        objective_name=objective,
        stats=stats,
        scope=scope,
        bounds=tuple(run.bounds),
        stopped="" if status == SolveStatus.OPTIMAL else stopped,
        trace=run.trace_of(value),
    )
