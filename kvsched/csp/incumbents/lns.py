"""Large-neighbourhood search over the greedy's priorities: rolling windows re-ordered and re-simulated.

A solution is a priority vector (one static key per request) that the greedy turns
into a schedule. The neighbourhoods re-order a window of ``window`` consecutive
requests of the current order (by alternative keys, reversal, adjacent swaps,
random shuffles) and re-simulate the whole instance; a move is kept only when the
replayed schedule is strictly better. Windows roll over the order with half
overlap until the deadline or a pass without improvement. For a greedy under a moving key, the
windows re-weight per-request key scales instead (:func:`_scaled_search`), and where every search
ends before the deadline an iterated local search kicks the best scales (:func:`_kicked_search`).

Why not an exact window re-solve with the batch-indexed model: it has no way to
freeze the requests outside a window (it takes a constant KV capacity and budget,
not the residual left by the frozen schedule), and a sub-instance solved alone
ignores the rest's memory. Re-ordering and re-simulating stays exact about
legality (every candidate is a full schedule replayed through the core) at the
price of a heuristic neighbourhood.

Where eviction is free (unit time, no budget) the exact re-solve exists:
:func:`kvsched.csp.incumbents.window.window_search` re-places a window's ops
with CP-SAT against the residual the frozen rest leaves, and replays every
schedule it keeps. It is a correct, usable tool (tests/test_csp_incumbents_window.py),
but it is not run here or by the pipeline: on the pipeline's final schedules
of the three unit-time 1k rows of docs/regret_scale.md it found nothing in
30 s (nor did 30 s more of :func:`improve`); at memory load 1 the frozen rest
leaves no slack to trade (docs/regret_scale-probes.md, *Exact windows*).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np

from kvsched.costmodel.base import CostModel
from kvsched.csp.incumbents._kernel import advance_jit
from kvsched.csp.incumbents.base import Incumbent, Unbuilt, confirmed
from kvsched.csp.incumbents.greedy import greedy, run_estimate
from kvsched.csp.incumbents.knapsack import knapsack
from kvsched.csp.incumbents.knots import PROMPT_WEIGHTED, prompt_scale
from kvsched.csp.incumbents.rules import kv_area
from kvsched.instances.model import Instance
from kvsched.jit import compile_seconds, is_compiled
from kvsched.schedule.data import ProblemData
from kvsched.schedule.validate import Trace, instance_cost_model, replay
from kvsched.stop import Deadline


def completion_order(instance: Instance, incumbent: Incumbent) -> np.ndarray:
    """Request positions by completion time in ``incumbent`` (ties by first scheduling, then position)."""
    trace = incumbent.trace if incumbent.trace is not None else replay(instance, incumbent.schedule)
    st = trace.state
    return np.lexsort((np.arange(st.n), st.first_scheduled, st.completion))


def _moves(
    window: np.ndarray, prompt: np.ndarray, output: np.ndarray, rng: np.random.Generator
) -> Iterator[np.ndarray]:
    """Re-orderings of ``window`` (request positions in their current order)."""
    area = kv_area(prompt[window], output[window])
    for key in (area, output[window], prompt[window]):
        yield window[np.argsort(key, kind="stable")]
    yield window[::-1]
    for k in range(window.size - 1):
        swapped = window.copy()
        swapped[k], swapped[k + 1] = swapped[k + 1], swapped[k]
        yield swapped
    for _ in range(2):
        yield rng.permutation(window)


#: Factors a window of per-request key scales is multiplied by (earlier, later, a little, a lot).
SCALE_MOVES = (0.5, 2.0, 0.8, 1.25, 0.2, 5.0)
#: The guided search's moves on one request's key scale: earlier (a little, much, to the front) or later.
GUIDED_MOVES = (0.3, 0.05, 0.005, 3.0)
#: Requests the guided search tries, largest reduced cost first, before it gives up on a guide.
GUIDED_TOP = 40
#: Share of the local search's time the guided search may take (the windows keep the rest).
GUIDED_SHARE = 0.5
#: Candidates in a row without a better schedule after which the guided search hands over to the windows.
GUIDED_PATIENCE = 12
#: Kicks in a row without a better schedule after which the iterated local search ends.
KICK_PATIENCE = 30
#: Spread of the log-normal factors a kick multiplies a stretch of key scales by.
KICK_SIGMA = 1.0
#: The descent after a kick re-weights this many kick lengths of the completion order on either side of it.
KICK_REACH = 2
_DYNAMIC_RULES = ("remaining-area", "remaining-output")


#: The greedy's keyword arguments the local search re-runs an incumbent with.
_GREEDY_KEYS = (
    "rule",
    "preempt",
    "lookahead",
    "refill_weight",
    "min_chunk",
    "fit_chunk",
    "fill",
    "token_cap",
    "running_cap",
)
_KNAPSACK_KEYS = ("candidates", "cells", "tail", "min_chunk", "hold_weight", "chunk_discount", "ratio_power")


def rerunner(
    instance: Instance, incumbent: Incumbent, cost_model: CostModel
) -> Callable[..., Incumbent | Unbuilt] | None:
    """How to re-make ``incumbent`` with per-request key scales: ``rerun(scale, deadline, name)``.

    For an incumbent of the greedy under a dynamic rule or of the knapsack greedy (its schedule's meta
    says which, with its parameters); None otherwise.

    Parameters
    ----------
    instance
        The instance ``incumbent`` schedules.
    incumbent
        A schedule of the greedy or the knapsack greedy.
    cost_model
        The instance's cost model.

    Returns
    -------
    Callable[..., Incumbent | Unbuilt] or None
        ``rerun(scale, deadline, name)``: the same greedy with its key times ``scale`` (per request; ones
        re-make ``incumbent``); None for an incumbent it cannot re-make.
    """
    meta = incumbent.schedule.meta or {}
    params = meta.get("params")
    if not isinstance(params, dict) or params.get("rule") not in _DYNAMIC_RULES:
        return None
    policy, objective = str(meta.get("policy", "")), incumbent.objective
    if policy.startswith("greedy:"):
        kwargs = {k: params[k] for k in _GREEDY_KEYS if k in params}
        # A prompt-weighted incumbent's key was scaled already: the search's scales multiply that one.
        base = (
            prompt_scale(instance, cost_model, int(params.get("token_cap", 0)))
            if params.get(PROMPT_WEIGHTED)
            else None
        )
        return lambda scale, deadline, name: greedy(
            instance, scale=scale if base is None else scale * base, objective=objective, deadline=deadline,
            cost_model=cost_model, name=name, replay_schedule=False, build=False, **kwargs,
        )  # fmt: skip
    if policy.startswith("knapsack:"):
        kwargs = {k: params[k] for k in _KNAPSACK_KEYS if k in params}
        return lambda scale, deadline, name: knapsack(
            instance, scale=scale, objective=objective, deadline=deadline, name=name, replay_schedule=False,
            build=False, **kwargs,
        )  # fmt: skip
    return None


def _try_scales(
    instance: Instance,
    rerun: Callable[..., Incumbent | Unbuilt],
    trial: np.ndarray,
    value: float,
    deadline: Deadline,
    name: str,
    cost_model: CostModel,
    run_s: list[float],
) -> Incumbent | None:
    """The incumbent re-made with the key scales ``trial``, replayed, where it is strictly better than
    ``value``; else None."""
    return _kept(instance, _timed(rerun, trial, deadline, name, run_s), value, cost_model)


def _timed(
    rerun: Callable[..., Incumbent | Unbuilt],
    trial: np.ndarray,
    deadline: Deadline,
    name: str,
    run_s: list[float],
) -> Incumbent | Unbuilt:
    """``rerun(trial, deadline, name)``, unreplayed (unbuilt); ``run_s[0]`` keeps the longest candidate run."""
    started = time.perf_counter()
    cand = rerun(trial, deadline, name)
    run_s[0] = max(run_s[0], time.perf_counter() - started)
    return cand


def _kept(
    instance: Instance, cand: Incumbent | Unbuilt, value: float, cost_model: CostModel
) -> Incumbent | None:
    """``cand`` built and replayed where its own value is strictly better than ``value``, if the replay is
    too; else None (a candidate is valued on the greedy's own log, and built and replayed only before it is
    kept)."""
    if cand.value < value - 1e-9:
        cand = confirmed(instance, cand, cost_model)
    return cand if cand.value < value - 1e-9 else None


def _settled(
    instance: Instance, best: Incumbent | Unbuilt, start: Incumbent, cost_model: CostModel
) -> Incumbent:
    """A search's winner ``best`` built and replayed, or ``start`` where the replay does not beat it.

    A search moves from candidate to candidate on their values read off the greedy's log and builds and
    replays only the one it ends with: replaying every candidate it moved through took 30-65% of 20 s
    searches at 1k requests (Azure code, Azure conversations, ShareGPT). The log's value equals the
    replay's (tested); should they ever differ, the search still returns a replayed schedule, never a
    value the core did not confirm.
    """
    if best is start:
        return start
    made = confirmed(instance, best, cost_model)
    return made if made.value < start.value - 1e-9 else start


def _guided_search(
    instance: Instance,
    best: Incumbent,
    rerun: Callable[..., Incumbent | Unbuilt],
    deadline: Deadline,
    *,
    guide: Callable[[Trace], np.ndarray],
    cost_model: CostModel,
    run_s: list[float],
) -> tuple[Incumbent, np.ndarray, int, int]:
    """One request's key scale at a time, the requests the guide blames most first.

    ``guide(trace)`` scores each request of a replayed schedule (e.g. its reduced cost at the chain
    Lagrangian's multipliers, :class:`kvsched.csp.bounds.chain_guide.ChainGuide`). The
    :data:`GUIDED_TOP` requests of largest positive score are tried in turn with each factor of
    :data:`GUIDED_MOVES` on their scale; the first strictly better replayed schedule is kept, the scores
    are read again from it, and the search starts over from the top. It ends at the deadline, after
    :data:`GUIDED_PATIENCE` candidates in a row without a better schedule, or when none of them improves.
    Returns the best incumbent, its scales, and the candidates simulated and kept.
    """
    scale = np.ones(len(instance), dtype=np.float64)
    evaluations = accepted = misses = 0
    name = f"lns({best.name})"
    if best.trace is None:
        best = confirmed(instance, best, cost_model)
    while misses < GUIDED_PATIENCE:
        scores = guide(best.trace)  # type: ignore[arg-type]
        improved = False
        for j in np.argsort(-scores, kind="stable")[:GUIDED_TOP]:
            if scores[j] <= 0.0:
                break
            for factor in GUIDED_MOVES:
                if deadline.remaining() <= run_s[0] or misses >= GUIDED_PATIENCE:
                    return best, scale, evaluations, accepted
                trial = scale.copy()
                trial[j] *= factor
                cand = _try_scales(instance, rerun, trial, best.value, deadline, name, cost_model, run_s)
                evaluations += 1
                if cand is not None:
                    scale, best, improved = trial, cand, True
                    accepted, misses = accepted + 1, 0
                    break
                misses += 1
            if improved:
                break
        if not improved:
            break
    return best, scale, evaluations, accepted


def _scaled_search(
    instance: Instance,
    best: Incumbent,
    rerun: Callable[..., Incumbent | Unbuilt],
    deadline: Deadline,
    *,
    order: np.ndarray,
    window: int,
    rng: np.random.Generator,
    cost_model: CostModel,
    max_passes: int,
    run_s: list[float],
    scale: np.ndarray | None = None,
) -> tuple[Incumbent, np.ndarray, int, int]:
    """Windows of the completion order re-weighted: the greedy's own moving key times a per-request scale.

    ``rerun(scale, deadline, name)`` re-makes the incumbent with the scales (:func:`rerunner`). A move multiplies the scales of one window (requests adjacent in completion order; large windows
    first) by a factor of :data:`SCALE_MOVES`, moving them earlier or later while their keys still shrink as they generate;
    it is kept when the replayed schedule is strictly better. ``scale`` is where it starts (the scales
    that re-make ``best``; default ones). ``order`` may be a stretch of the completion order: the
    windows then cover that stretch only. Returns the best incumbent, its scales, and the numbers of
    candidates simulated and kept.
    """
    n = len(order)
    scale = np.ones(len(instance), dtype=np.float64) if scale is None else scale.copy()
    start, start_scale = best, scale
    winner: Incumbent | Unbuilt = best
    value = best.value
    evaluations = accepted = 0
    name = f"lns({best.name})"

    def fits() -> bool:
        return deadline.remaining() > run_s[0]

    # Coarse to fine: windows of an eighth and a 32nd of the order and of 32 requests first, then
    # ``window`` for up to ``max_passes`` passes (12 s on three 1k Azure rows: 0.05-1.2% below windows
    # of 10 from the start, each).
    coarse = [size for size in (n // 8, n // 32, 32) if size > window]
    for size in [*coarse, *[window] * max_passes]:
        improved = False
        starts = np.arange(0, max(1, n - 1), max(1, size // 2))
        for lo in rng.permutation(starts):
            members = order[lo : lo + size]
            for factor in SCALE_MOVES:
                if not fits():
                    break
                trial = scale.copy()
                trial[members] *= factor
                cand = _timed(rerun, trial, deadline, name, run_s)
                evaluations += 1
                if cand.value < value - 1e-9:  # on the log's value: only the winner is replayed
                    scale, value, improved = trial, cand.value, True
                    winner, accepted = cand, accepted + 1
                    break  # the next window
            if not fits():
                break
        if not fits() or (size == window and not improved):
            break
    best = _settled(instance, winner, start, cost_model)
    return (best, scale, evaluations, accepted) if best is not start else (start, start_scale, evaluations, 0)


def _kicked_search(
    instance: Instance,
    best: Incumbent,
    scale: np.ndarray,
    rerun: Callable[..., Incumbent | Unbuilt],
    deadline: Deadline,
    *,
    window: int,
    rng: np.random.Generator,
    cost_model: CostModel,
    run_s: list[float],
    patience: int = KICK_PATIENCE,
) -> tuple[Incumbent, int, int, int]:
    """Iterated local search: kick the best scales, search the windows once from there, keep what is no worse.

    A kick multiplies the scales of a random stretch of the best schedule's completion order (2 to
    n / 10 requests) by independent log-normal factors (sigma :data:`KICK_SIGMA`), far enough to leave the
    windows' local optimum; one pass of :func:`_scaled_search` over the stretch and :data:`KICK_REACH` of
    its lengths on either side then descends from the kicked schedule. The result replaces the best where it is no worse (equal values let the search drift
    along a plateau). It ends at the deadline or after ``patience`` kicks in a row without a strictly
    better schedule. Returns the best incumbent, the candidates simulated and kept, and the kicks.
    """
    n = len(instance)
    evaluations = accepted = misses = kicks = 0
    name = best.name
    while misses < patience and deadline.remaining() > run_s[0]:
        kicks += 1
        order = completion_order(instance, best)
        size = min(n, int(rng.integers(2, max(3, n // 10) + 1)))
        lo = int(rng.integers(0, n - size + 1))
        trial = scale.copy()
        trial[order[lo : lo + size]] *= np.exp(rng.normal(0.0, KICK_SIGMA, size))
        kicked = confirmed(instance, _timed(rerun, trial, deadline, name, run_s), cost_model)
        evaluations += 1
        # The descent re-weights windows around the kick only (the rest of the order was a local optimum).
        around = completion_order(instance, kicked)[
            max(0, lo - KICK_REACH * size) : lo + (KICK_REACH + 1) * size
        ]
        cand, cand_scale, evals, _ = _scaled_search(
            instance, kicked, rerun, deadline, order=around, window=window,
            rng=rng, cost_model=cost_model, max_passes=1, run_s=run_s, scale=trial,
        )  # fmt: skip
        evaluations += evals
        # ``cand`` is the kicked schedule or one _scaled_search kept: replayed either way.
        better = cand.value < best.value - 1e-9
        accepted, misses = (accepted + 1, 0) if better else (accepted, misses + 1)
        if cand.value <= best.value + 1e-9:
            best, scale = cand, cand_scale
    return best, evaluations, accepted, kicks


def improve(
    instance: Instance,
    incumbent: Incumbent,
    deadline: Deadline | None = None,
    *,
    keys: np.ndarray | None = None,
    window: int = 10,
    preempt: bool = True,
    lookahead: int = 0,
    fill: bool | None = None,
    seed: int = 0,
    cost_model: CostModel | None = None,
    max_passes: int = 3,
    guide: Callable[[Trace], np.ndarray] | None = None,
    kick_patience: int = KICK_PATIENCE,
) -> Incumbent:
    """A schedule no worse than ``incumbent``: the best replayed schedule found before ``deadline``.

    Parameters
    ----------
    incumbent
        The schedule to beat (any validated schedule).
    keys
        The first priority vector (smallest first), e.g. the static keys the incumbent's greedy
        used or a relaxation's alpha-points; default: the incumbent's completion order.
    window
        Requests re-ordered together.
    preempt, lookahead, fill
        The greedy mode the priority vectors are simulated in (see :func:`~kvsched.csp.incumbents.greedy.decide`);
        ``fill`` None: as the incumbent's greedy did (off where the incumbent is no greedy's).
    max_passes
        Passes over the whole order (a pass without improvement also ends the search).
    guide
        Per-request scores of a replayed schedule, largest where moving the request should pay most
        (e.g. :class:`kvsched.csp.bounds.chain_guide.ChainGuide`); where given, the scale search first
        moves those requests one at a time (:func:`_guided_search`, up to :data:`GUIDED_SHARE` of the
        time), then its windows go on from there; time still left at the end goes to windows from the
        incumbent's own scales.
    kick_patience
        Where the searches end before the deadline, an iterated local search kicks the best scales
        (:func:`_kicked_search`) until this many kicks in a row find nothing better; 0 turns it off.

    Where ``incumbent`` is the greedy's under a dynamic rule or the knapsack greedy's (its schedule's
    meta says so) and no ``keys`` are given, half the time first goes to windows of per-request scales
    on that rule's key (:func:`_scaled_search`, re-made by the incumbent's own producer and mode), the
    rest to the static orders.
    ``stats`` counts the candidates simulated (``evaluations``) and kept (``accepted``), and says whether
    the search stopped because its next candidate would not fit before ``deadline`` (``out_of_time``).
    """
    deadline = deadline or Deadline.never()
    cost_model = cost_model if cost_model is not None else instance_cost_model(instance)
    rng = np.random.default_rng(seed)
    n = len(instance)
    data = ProblemData.of(instance)
    prompt, output = data.prompt, data.output
    best = incumbent
    evaluations = accepted = 0
    # A candidate costs one greedy run (decide and build; valued on the greedy's own log, and replayed
    # only where it would be kept): one starts only where a whole run with its replay (the incumbent's
    # own, where it was one) fits before the deadline, since it always runs to a complete schedule.
    run_s = [sum(float(incumbent.stats.get(k, 0.0)) for k in ("decide_s", "build_s", "replay_s"))]
    if "decide_s" not in incumbent.stats:  # no greedy made it (a policy's): no run timed yet
        run_s[0] = run_estimate(instance, cost_model)
        if not is_compiled(advance_jit):
            # A cold kernel (a fresh install): the first candidate compiles it where that fits (an interpreted
            # run may take many times its low estimate: a 10 s solve of 10k requests once ran one for 230 s).
            run_s[0] += compile_seconds([advance_jit])

    def fits() -> bool:
        return deadline.remaining() > run_s[0]

    if fill is None:
        params = incumbent.schedule.meta.get("params") if incumbent.schedule.meta else None
        fill = bool(params.get("fill", False)) if isinstance(params, dict) else False

    def simulate(order: np.ndarray) -> Incumbent | Unbuilt:
        keys = np.empty(n, dtype=np.float64)
        keys[order] = np.arange(n, dtype=np.float64)
        started = time.perf_counter()
        cand = greedy(
            instance,
            priority=keys,
            preempt=preempt,
            lookahead=lookahead,
            fill=fill,
            objective=incumbent.objective,
            deadline=deadline,
            cost_model=cost_model,
            name="lns",
            replay_schedule=False,
            build=False,
        )
        run_s[0] = max(run_s[0], time.perf_counter() - started)
        return cand

    dynamic = rerunner(instance, incumbent, cost_model) if keys is None else None
    # The best schedule the key scales ``scale`` re-make (the static orders' cannot be), for the kicks.
    scaled, scale = incumbent, np.ones(n, dtype=np.float64)
    if n >= 2 and dynamic is not None and fits():
        # The incumbent is a greedy under a moving key: search per-request scales of that key first,
        # with half the time (its schedules start where the incumbent is; a static order starts far off).
        if guide is not None:
            # Measured on Azure code 1k (unit, no budget; docs/regret_scale-probes.md): from the greedy's 36,702,
            # 20 guided candidates reach 36,111 where the windows' best in 900 s is 36,199.
            best, scale, evals, kept = _guided_search(
                instance, best, dynamic, deadline.share(GUIDED_SHARE), guide=guide, cost_model=cost_model,
                run_s=run_s,
            )  # fmt: skip
            evaluations, accepted = evaluations + evals, accepted + kept
        half = deadline.share(0.5)
        best, scale, evals, kept = _scaled_search(
            instance, best, dynamic, half, order=completion_order(instance, best), window=window,
            rng=rng, cost_model=cost_model, max_passes=max_passes, run_s=run_s, scale=scale,
        )  # fmt: skip
        evaluations, accepted = evaluations + evals, accepted + kept
        scaled = best
    if n >= 2 and fits():
        if keys is None:
            order = completion_order(instance, incumbent)
        else:
            order = np.lexsort((np.arange(n), np.asarray(keys, dtype=np.float64)))
        # The static orders' line of search moves on the log's values; only its best, where it beats the
        # schedule so far, is built and replayed (at the end).
        before = best
        winner: Incumbent | Unbuilt = best
        static_kept = 0
        first = simulate(order)
        evaluations += 1
        value = first.value
        if value < winner.value - 1e-9:
            winner, static_kept = first, 1
        step = max(1, window // 2)
        for _ in range(max_passes):
            improved = False
            for lo in range(0, max(1, n - 1), step):
                hi = min(n, lo + window)
                for moved in _moves(order[lo:hi].copy(), prompt, output, rng):
                    if not fits():
                        break
                    trial = order.copy()
                    trial[lo:hi] = moved
                    cand = simulate(trial)
                    evaluations += 1
                    if cand.value < value - 1e-9:
                        order, value, improved = trial, cand.value, True
                        if cand.value < winner.value - 1e-9:
                            winner, static_kept = cand, static_kept + 1
                if not fits():
                    break
            if not improved or not fits():
                break
        best = _settled(instance, winner, before, cost_model)
        accepted += static_kept if best is not before else 0
    if guide is not None and dynamic is not None and fits():
        # The guided moves changed where the windows started; where both searches ended before the deadline
        # (small instances), the windows also go from the incumbent's own scales: Azure code 100 with
        # C = P = 2048 ended at 2,796 after guided moves against 2,791 without.
        alt, alt_scale, evals, kept = _scaled_search(
            instance, incumbent, dynamic, deadline, order=completion_order(instance, incumbent), window=window,
            rng=rng, cost_model=cost_model, max_passes=max_passes, run_s=run_s,
        )  # fmt: skip
        evaluations += evals
        if alt.value < scaled.value:
            scaled, scale = alt, alt_scale
        if alt.value < best.value:
            best, accepted = alt, accepted + kept
    kicks = 0
    if n >= 2 and dynamic is not None and kick_patience > 0 and fits():
        # Every search ended before the deadline (small instances): iterated local search from the best
        # schedule the scales make. Measured in 60 s solves on Azure code 100 with C = P = 2048: 2,789 -> 2,769.
        kicked, evals, kept, kicks = _kicked_search(
            instance, scaled, scale, dynamic, deadline, window=window, rng=rng, cost_model=cost_model,
            run_s=run_s, patience=kick_patience,
        )  # fmt: skip
        evaluations += evals
        if kicked.value < best.value:
            best, accepted = kicked, accepted + kept
    stats = dict(best.stats)
    stats.update(evaluations=evaluations, accepted=accepted, kicks=kicks, start=incumbent.value)
    # Whether the search stopped because its next candidate would not fit, rather than for want of moves.
    stats["out_of_time"] = bool(n >= 2 and not fits())
    name = best.name if best is incumbent else f"lns({incumbent.name})"
    return Incumbent(name, best.schedule, best.value, best.objective, stats, best.trace)
