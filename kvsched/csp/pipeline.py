"""The certified pipeline: an optimum interval for instances of any size, by one deadline.

For instances too large for an exact model (or under cost models no exact model
takes), ``solve(formulation="auto")`` runs these stages, each under a share of
what is left, each keeping what the earlier ones found:

1. the bounds portfolio (:func:`kvsched.csp.bounds.portfolio`): closed-form
   bounds valid for every legal schedule, in milliseconds;
2. incumbents (:mod:`kvsched.csp.incumbents`): the eviction-aware greedy under
   several priority rules, then fast policies; each replayed by the core;
3. under unit time, the chain Lagrangian (:func:`kvsched.csp.bounds.chain_lagrangian`):
   a bound valid for every legal schedule, evictions included, warm-started
   from the best incumbent; under a seconds-based cost model (total latency),
   the batch-rate LP (:mod:`kvsched.csp.bounds.fluid_lp`), the batch-count bound
   (:mod:`kvsched.csp.bounds.batch_count`) and the seconds Lagrangian
   (:mod:`kvsched.csp.bounds.seconds_lagrangian`) on shares of that time;
4. under seconds-based cost models, the best greedy variant under running caps
   (:func:`kvsched.csp.incumbents.best.search_running_caps`: admission control, searched);
5. large-neighbourhood search on the best incumbent with what is left (windows of
   priorities re-ordered and re-simulated; :func:`kvsched.csp.incumbents.improve`), where the chain
   Lagrangian ran first moving the requests with the largest reduced costs at its multipliers
   (:class:`kvsched.csp.bounds.chain_guide.ChainGuide`).

The result's scope is every legal schedule; its bound is the best of the
portfolio and the Lagrangian, each named by its source; it is ``optimal`` only
when that bound meets the best schedule. Once the bounds found meet the best
schedule, the stages left are skipped (none could change the answer) and
``stats["proven_by"]`` says which stage's bounds closed the gap.
"""

from __future__ import annotations

from kvsched.costmodel import UnitCost
from kvsched.csp.bounds import chain_lagrangian, portfolio
from kvsched.csp.bounds.batch_count import SOURCE as BATCH_COUNT
from kvsched.csp.bounds.batch_count import batch_count_bound, unit_copy
from kvsched.csp.bounds.chain import ChainLagrangian, compiled_kernels
from kvsched.csp.bounds.chain_guide import ChainGuide
from kvsched.csp.bounds.fluid_lp import fluid_lp_anytime
from kvsched.csp.bounds.seconds_lagrangian import compiled_kernels as seconds_kernels
from kvsched.csp.bounds.seconds_lagrangian import predict_start, seconds_lagrangian
from kvsched.csp.bounds.sharing_lp import sharing_lp_bound
from kvsched.csp.certificate import Bound, Scope, scope_of
from kvsched.csp.certify import certify
from kvsched.csp.incumbents import Incumbent, best_incumbent, improve
from kvsched.csp.incumbents.best import search_running_caps
from kvsched.csp.result import AnytimePoint, Result, SolveStatus, relative_gap
from kvsched.csp.run import SolveLog, with_meta
from kvsched.errors import KvschedError
from kvsched.jit import compile_seconds, use_compiled
from kvsched.schedule.ir import Schedule
from kvsched.schedule.validate import instance_cost_model
from kvsched.stop import INTERRUPTS, Deadline, interrupted

#: Shares of what is left for each stage.
BOUNDS_SHARE = 0.05
INCUMBENT_SHARE = 0.3
LAGRANGIAN_SHARE = 0.75
#: Seconds the chain Lagrangian needs at the least where the best schedule's replay is kept (else twice that
#: replay's time): its set-up and first pricings at 100k requests take about 1.2 s.
LAGRANGIAN_MIN_SECONDS = 2.0
#: Share of the Lagrangian stage's time the seconds Lagrangian takes (under seconds-based cost models its
#: gains are small, see docs/bounds.md; the local search keeps the rest).
SECONDS_LAGRANGIAN_SHARE = 0.4
#: Share of that the batch-count bound takes first (the unit copy's portfolio and chain Lagrangian).
BATCH_COUNT_SHARE = 0.4
#: Share of the Lagrangian stage's time the batch-rate LP takes first under seconds-based cost models (total
#: latency): on the A100 row of docs/regret_scale.md it is the best bound for its time, and a finer grid is what raises
#: it (0.85 against 0.7: 4,310 against 4,214 in a 60 s solve, D = 1.24 s against 1.41 s; the seconds Lagrangian
#: after it stayed below mean busy time there, and the chunked linear rows keep their batch-count bounds).
FLUID_LP_SHARE = 0.85
#: Share of the Lagrangian stage's time the processor-sharing LP takes before the batch-rate LP (which then takes
#: FLUID_LP_SHARE of the rest): on the A100 1k row it is the stronger of the two for its time (docs/bounds.md,
#: *The processor-sharing LP*).
SHARING_LP_SHARE = 0.6
#: The processor-sharing LP is not run from this many requests on: at 10k its coarse grid gives far less than
#: mean busy time (172k against 480k on the A100 10k row).
SHARING_LP_MAX_REQUESTS = 5_000
#: Share of the limit kept after the local search (certifying and returning the result).
FINISH_MARGIN = 0.03


def _proven(log: SolveLog, value: float, gap: float = 0.0) -> bool:
    """Whether the bounds found so far meet ``value``, the best schedule's, or leave a certified gap of at
    most ``gap`` (``--gap``): once they do, no later stage can change the answer (the schedule is optimal, or
    as close as asked, and a bound above the best one would be above it too), so the stages left are skipped
    (an 8-request solve proven by its first bounds ran its LPs for 10 s of a 20 s limit)."""
    status, bound = certify(value, Scope.ALL, log.bounds, log.seen, origin=log.origin)
    if status == SolveStatus.OPTIMAL:
        return True
    met = relative_gap(value, None if bound is None else bound.value, log.origin)
    return gap > 0 and met is not None and met <= gap


def _settled(log: SolveLog, value: float, gap: float, stats: dict, stage: str) -> None:
    """Record in ``stats`` that ``stage``'s bounds proved ``value`` optimal (``proven_by``) or met the gap
    asked for (``gap_met_by``), where they do and nothing had before."""
    if "proven_by" in stats or "gap_met_by" in stats:
        return
    if _proven(log, value):
        stats["proven_by"] = stage
    elif gap > 0 and _proven(log, value, gap):
        stats["gap_met_by"] = stage


def _done(stats: dict) -> bool:
    """Whether no later stage is to run: the schedule is proven, the gap asked for met, or Ctrl-C came."""
    return "proven_by" in stats or "gap_met_by" in stats or "interrupted" in stats


def _incumbents(
    log: SolveLog, objective: str, deadline: Deadline, whole: Deadline, warm: Incumbent | None
) -> list[Incumbent]:
    """The greedy variants and fast policies that fit ``deadline`` (:func:`best_incumbent`; the first
    schedule must fit ``whole``, the solve's), and ``warm``, the warm start evaluated, if any."""
    # The running caps come later (_running_caps), once the bounds have had their time. With a warm
    # start in hand no first schedule is needed, so none may overrun the stage (`compare --time-limit 10`
    # on 10k A100 requests ran sarathi again here, uncut, after its policy stage had cut it: 12.5 s).
    first = whole if warm is None else deadline
    best = best_incumbent(
        log.instance, objective, deadline, running_caps=False, first_deadline=first, given=warm
    )
    if best is warm:
        return [warm]
    # Record what best_incumbent tried: the first and the best schedules replayed by the core, the others
    # valued on the greedy's own log (equal to the replay, tests/test_csp_incumbents.py), so that every bound
    # is checked against them too.
    for name, value in best.stats.get("tried", {}).items():
        log.record(value, name, Scope.ALL, incumbent=False)
    log.record(best.value, best.name, scope_of(best.schedule))
    log.keep(best.value, best.trace)
    return [best] if warm is None else [best, warm]


def _running_caps(log: SolveLog, best: Incumbent, deadline: Deadline, stats: dict) -> Incumbent:
    """The best incumbent's greedy variant under running caps (:func:`search_running_caps`: seconds-based
    cost models only), first of what the bounds leave: on the A100 1k row of docs/regret_scale.md it gains
    more than the local search, and run before the bounds it took a second or two from the sharing LP."""
    tried: dict[str, float] = {}
    try:
        capped = search_running_caps(log.instance, best, deadline, tried=tried)
    except KvschedError as exc:  # a warm start whose params name a variant the greedy cannot run here
        stats["running_caps"] = f"not run: {exc}"
        return best
    if not tried:
        return best
    for name, value in tried.items():
        log.record(value, name, Scope.ALL, incumbent=False)
    stats["running_caps"] = tried
    if capped.value < best.value:
        log.record(capped.value, capped.name, scope_of(capped.schedule))
        log.keep(capped.value, capped.trace)
        return capped
    return best


def _lagrangian(
    log: SolveLog, objective: str, best: Incumbent, deadline: Deadline, gap: float = 0.0
) -> tuple[dict, ChainLagrangian | None]:
    """The Lagrangian stage's bounds (added to ``log``), its stats, and the chain Lagrangian where it ran
    (its later bounds are left out once the best schedule is proven, or within ``gap``)."""
    if not isinstance(instance_cost_model(log.instance), UnitCost) and objective == "total-latency":
        stats = _sharing_lp(log, deadline.share(SHARING_LP_SHARE))
        if not _proven(log, best.value, gap):
            stats.update(_fluid_lp(log, deadline.share(FLUID_LP_SHARE)))
        if not _proven(log, best.value, gap):
            stats.update(_seconds_lagrangian(log, best, deadline.share(SECONDS_LAGRANGIAN_SHARE)))
        return stats, None
    if not isinstance(instance_cost_model(log.instance), UnitCost) or objective == "makespan":
        return {}, None
    # Without the best schedule's replay the Lagrangian must make one (and then needs time to climb);
    # with it, its first pricings come within about a second at 100k requests (4.52e7 against the area
    # bound's 3.46e7 in 9.8 s on ShareGPT 100k at memory load 1, where 20 s had been left unused).
    need = 2 * float(best.stats.get("replay_s", 0.0))
    if log.trace_of(best.value) is not None:
        need = min(need, LAGRANGIAN_MIN_SECONDS)
    if deadline.remaining() < need:
        return {"lagrangian": "not run: no time left", "out_of_time": ["lagrangian"]}, None
    if not use_compiled(compiled_kernels(objective), deadline):
        return {
            "lagrangian": f"not run: its kernels are not compiled yet, and compiling them (about "
            f"{compile_seconds(compiled_kernels(objective)):.0f} s, once) does not fit in the time left "
            "(kvsched warmup compiles them)",
            "out_of_time": ["lagrangian"],
        }, None
    # The best schedule's replay warm-starts the multipliers (y_t = requests in system / M) and is kept
    # for the result, so nothing is replayed twice.
    if log.trace_of(best.value) is None:
        log.evaluate(best.schedule, best.name)
    started = log.elapsed()
    try:
        lag = chain_lagrangian(log.instance, objective, incumbent=log.trace_of(best.value), deadline=deadline)
    except KvschedError as exc:
        return {"lagrangian": f"not run: {exc}"}, None
    before = max((b.value for b in log.bounds), default=None)
    for seconds, value in lag.history:  # the curve shows the best bound so far, never a dip
        best = value if before is None else max(before, value)
        log.points.append(AnytimePoint(started + seconds, log.best_value, best))
    log.add_bound(lag.bound)
    log.report()
    stats = {"lagrangian_iterations": lag.iterations, "lagrangian_seconds": lag.seconds}
    return stats, lag


def _seconds_lagrangian(log: SolveLog, best: Incumbent, deadline: Deadline) -> dict:
    """The batch-count bound, then the seconds Lagrangian (:mod:`kvsched.csp.bounds.seconds_lagrangian`), on a
    share of the stage's time."""
    stats = _batch_count(log, deadline.share(BATCH_COUNT_SHARE))
    if deadline.remaining() < 2 * float(best.stats.get("replay_s", 0.0)):
        return {**stats, "seconds_lagrangian": "not run: no time left", "out_of_time": ["seconds lagrangian"]}
    # Its data and first pricing check no deadline: at 100k requests they took 9 s and 14-17 s, and a 60 s
    # solve spent 8.5 s on the data alone and then had no time to price.
    need = predict_start(log.instance)
    if deadline.bounded and need > deadline.remaining():
        return {
            **stats,
            "seconds_lagrangian": f"not run: its data and first pricing are predicted to take {need:.1f} s, "
            f"{deadline.remaining():.1f} s left",
            "out_of_time": ["seconds lagrangian"],
        }
    if not use_compiled(seconds_kernels(), deadline):
        return {
            **stats,
            "seconds_lagrangian": "not run: its kernels are not compiled yet (kvsched warmup compiles them)",
            "out_of_time": ["seconds lagrangian"],
        }
    if log.trace_of(best.value) is None:
        log.evaluate(best.schedule, best.name)
    started = log.elapsed()
    try:
        lag = seconds_lagrangian(log.instance, incumbent=log.trace_of(best.value), deadline=deadline)
    except KvschedError as exc:
        return {**stats, "seconds_lagrangian": f"not run: {exc}"}
    before = max((b.value for b in log.bounds), default=None)
    for seconds, value in lag.history:  # the curve shows the best bound so far, never a dip
        log.points.append(
            AnytimePoint(started + seconds, log.best_value, value if before is None else max(before, value))
        )
    log.add_bound(lag.bound)
    log.report()
    return {
        **stats,
        "seconds_lagrangian_iterations": lag.iterations,
        "seconds_lagrangian_seconds": lag.seconds,
    }


def _fluid_lp(log: SolveLog, deadline: Deadline) -> dict:
    """The batch-rate LP (:mod:`kvsched.csp.bounds.fluid_lp`) on finer grids while its share lasts."""
    started = log.elapsed()
    rounds = fluid_lp_anytime(log.instance, deadline)
    for got in rounds:
        if got.bound is not None:
            log.add_bound(got.bound)
    if any(got.bound is not None for got in rounds):
        log.points.append(AnytimePoint(log.elapsed(), log.best_value, max(b.value for b in log.bounds)))
        log.report()
    return {
        "batch_rate_lp_seconds": log.elapsed() - started,
        "batch_rate_lp_steps": [round(got.step, 6) for got in rounds if got.bound is not None],
    }


def _sharing_lp(log: SolveLog, deadline: Deadline) -> dict:
    """The processor-sharing LP (:mod:`kvsched.csp.bounds.sharing_lp`), cutting-plane rounds while its share lasts."""
    if len(log.instance.requests) >= SHARING_LP_MAX_REQUESTS:
        return {"sharing_lp": f"not run: {SHARING_LP_MAX_REQUESTS:,} requests or more"}
    started = log.elapsed()
    got = sharing_lp_bound(log.instance, deadline)
    if got.bound is None:
        return {"sharing_lp": f"no bound: {got.status}"}
    before = max((b.value for b in log.bounds), default=got.bound.value)
    for seconds, value in got.history:  # the curve shows the best bound so far, never a dip
        log.points.append(AnytimePoint(started + seconds, log.best_value, max(before, value)))
    log.add_bound(got.bound)
    log.report()
    return {
        "sharing_lp_seconds": log.elapsed() - started,
        "sharing_lp_step": round(got.step, 6),
        "sharing_lp_rounds": got.rounds,
    }


def _batch_count(log: SolveLog, deadline: Deadline) -> dict:
    """The batch-count bound (:mod:`kvsched.csp.bounds.batch_count`) from the unit copy's portfolio and, where it
    can pay off and its kernels are compiled, its chain Lagrangian."""
    copy = unit_copy(log.instance)
    unit = max(b.value for b in portfolio(copy, "total-latency", deadline))
    value = batch_count_bound(log.instance, unit)
    if value is None:
        return {}
    started = log.elapsed()
    if value > 0 and not deadline.expired() and use_compiled(compiled_kernels("total-latency"), deadline):
        try:
            lag = chain_lagrangian(copy, deadline=deadline)
            unit = max(unit, lag.bound.value)
        except KvschedError:
            pass
    bound = Bound(batch_count_bound(log.instance, unit) or 0.0, BATCH_COUNT, Scope.ALL)
    log.points.append(AnytimePoint(log.elapsed(), log.best_value, max(b.value for b in [*log.bounds, bound])))
    log.add_bound(bound)
    log.report()
    return {"batch_count_seconds": log.elapsed() - started}


def solve_pipeline(
    log: SolveLog, objective: str, deadline: Deadline, warm_start: Schedule | None, gap: float = 0.0
) -> Result:
    """Run the pipeline's stages by ``deadline`` and certify the best schedule against the best bound.

    ``gap`` (``--gap``): where the certified gap is at most this after a stage, the stages left are skipped
    (``stopped`` ``"gap"``); it is read between stages, not inside one.
    """
    stats: dict = {}
    for bound in portfolio(log.instance, objective, deadline.share(BOUNDS_SHARE)):
        log.add_bound(bound)
    log.report()
    warm = None
    if warm_start is not None:
        try:
            value = log.evaluate(warm_start, "warm start")
            warm = Incumbent("warm start", warm_start, value, objective, {}, log.trace_of(value))
        except KvschedError:
            pass
    found = _incumbents(log, objective, deadline.share(INCUMBENT_SHARE), deadline, warm)
    # A first schedule made by a policy because no greedy run fitted, or a greedy run cut short for time:
    # the stages did not run out of work.
    short_of_time = any(
        inc.stats.get("greedy_skipped_for_time") or inc.stats.get("cut_for_time") for inc in found
    )
    best = min(found, key=lambda inc: inc.value)
    stats["incumbents"] = dict(best.stats.get("tried", {}))
    if best.stats.get("skipped"):
        stats["skipped"] = list(best.stats["skipped"])
    # The local search gets what the Lagrangian leaves; where that would not fit two of its candidates
    # (10k requests: a greedy run with its replay takes 5-10 s), the Lagrangian takes it instead (it
    # left 12 s of a 60 s solve idle on Azure conversations 10k).
    run = sum(float(best.stats.get(k, 0.0)) for k in ("decide_s", "build_s", "replay_s"))
    lagrangian = deadline.share(LAGRANGIAN_SHARE)
    if run > 0 and deadline.remaining() - lagrangian.remaining() < 2 * run + FINISH_MARGIN * deadline.limit:
        lagrangian = deadline.before(FINISH_MARGIN * deadline.limit)
    guide = None
    _settled(log, best.value, gap, stats, "the bounds portfolio")
    if not _done(stats):
        try:
            found_stats, lag = _lagrangian(log, objective, best, lagrangian, gap)
            stats.update(found_stats)
            if lag is not None:
                guide = ChainGuide.from_lagrangian(lag, deadline)
        except INTERRUPTS as exc:  # Ctrl-C: keep the best schedule and the bounds found so far
            if not interrupted(exc):
                raise
            stats["interrupted"] = "during the Lagrangian"
        _settled(log, best.value, gap, stats, "the Lagrangian stage's bounds")
    # After Ctrl-C no stage starts: the user asked for what there is.
    if not deadline.expired() and not _done(stats):
        try:
            best = _running_caps(log, best, deadline.before(FINISH_MARGIN * deadline.limit), stats)
        except INTERRUPTS as exc:
            if not interrupted(exc):
                raise
            stats["interrupted"] = "during the running-cap search"
        _settled(log, best.value, gap, stats, "the running-cap search")
    if not deadline.expired() and not _done(stats):
        try:
            better = improve(log.instance, best, deadline.before(FINISH_MARGIN * deadline.limit), guide=guide)
        except INTERRUPTS as exc:
            if not interrupted(exc):
                raise
            better = best
            stats["interrupted"] = "during the local search"
        if better.stats.get("out_of_time"):
            stats["out_of_time"] = [*stats.get("out_of_time", []), "local search"]
        if better.value < best.value:
            log.record(better.value, better.name, scope_of(better.schedule))
            # The local search's replay is the result's: the command then reports from it inside the
            # limit (replaying a 10k schedule again for its metrics took 4.9 s past a 60 s limit).
            log.keep(better.value, better.trace)
            best = better
            stats["improved_by"] = "large-neighbourhood search"
    status, bound = certify(best.value, Scope.ALL, log.bounds, log.seen, origin=log.origin)
    schedule = with_meta(best.schedule, objective=objective, status=str(status), scope=str(Scope.ALL))
    log.report(incumbent=best.value)
    return Result.settled(
        status,
        best.value,
        bound,
        log.started,
        origin=log.origin,
        schedule=schedule,
        anytime=tuple(log.points),
        solver="kvsched",
        formulation="pipeline",
        objective_name=objective,
        stats={**stats, "found_by": best.name, "batches": len(best.schedule)},
        scope=Scope.ALL,
        bounds=tuple(log.bounds),
        # Before the deadline the stages have run out of work (the local search found no improving move and
        # the Lagrangian stalled or converged), unless a policy made the first schedule because no greedy
        # run fitted, or a stage was left out or stopped because its next step would not fit
        # (``stats["out_of_time"]``: 100k requests had a 60 s solve end at 22 s as "converged" with a 75% gap,
        # the Lagrangian and the local search priced out), or the certified gap met ``gap`` ("gap").
        stopped=""
        if status == SolveStatus.OPTIMAL
        else "interrupted"
        if "interrupted" in stats
        else "gap"
        if "gap_met_by" in stats
        else ("deadline" if deadline.expired() or short_of_time or stats.get("out_of_time") else "converged"),
        trace=log.trace_of(best.value),
    )
