"""Exact window re-solves of a schedule (unit time, no token budget): large-neighbourhood search with CP-SAT.

Under unit time without a token or prefill budget eviction is free (:func:`eviction_is_free`): a refill
re-appends the request's I + G tokens in one batch that also generates, exactly like a decode, and takes
no extra time. A schedule is then, up to evictions, its *generating ops*: request r's u-th op (u = 1..O)
runs in some batch and holds I + u - 1 KV tokens during it (the core's rule: a prompt of I tokens, then
one more token per decode; :mod:`kvsched.schedule.core`), and a paused request may drop its KV at no
cost. A plan (:class:`OpPlan`) maps each op to a slot, one of the incumbent's batch start times; its
schedule (:func:`plan_schedule`) is rebuilt batch by batch, holding a paused request's KV while it fits
and evicting the largest paused holders where it does not.

The search (:func:`window_search`) picks a window of consecutive slots [k0, k1) and a set S of requests
with ops in it (drawn at random among those completing there and those active there, then requests
waiting to start or resume), freezes everything else, and re-solves S's ops in the window exactly with CP-SAT:

* op u of r at window slot s_u (a fixed-size interval of one slot, demand its KV in blocks); the ops of
  a request are in order, the first after its arrival; one cumulative of capacity M over them, with the
  frozen requests' KV per slot as fixed blockers: the *residual* capacity the frozen rest leaves, which
  the batch-indexed model cannot take (see :mod:`kvsched.csp.incumbents.lns`);
* a request whose ops go on after k1 keeps its ops in the window and may pull up to ``max_extra`` of its
  later ops into the window (optional intervals, in a chain): its ops after k1 then keep their slots
  but each holds e more tokens (its op indices move up), and its last e ops go, so it completes e ops
  earlier. The KV after k1 stays linear in the chain's presence literals and is checked slot by slot
  against what the frozen rest leaves there;
* the objective is the members' completion times (the instance's total latency restricted to S, less
  constants); the current placement is the hint, so the model always has it as a solution.

A solution that the model says is strictly better is mapped back to a plan, rebuilt into a schedule and
replayed through the core; it is kept only if the replay's value is strictly below the best (the model is
never trusted alone: a mismatch is counted in ``stats['mismatches']`` and the move dropped). Windows go
over the horizon where the schedule is congested first (most requests waiting per slot), then roll on
with offsets, their size adapting to what CP-SAT proves within ``solve_s``, until the deadline; after
each, a small group of requests whose lives overlap is re-solved over their whole lives
(:func:`_group`), where a time window cannot hold a request's life.

Measured (docs/regret_scale-probes.md, *Exact windows*): on the pipeline's schedules of the unit-time 1k rows it
finds nothing in 30 s, and from weaker starts far less than :func:`~kvsched.csp.incumbents.lns.improve`:
at memory load 1 the frozen rest leaves a window about the KV its members hold, slot by slot, and the
members' ops hold different KV, so they can seldom trade slots. The pipeline does not run it.

Only the total-latency objective is searched; other objectives, cost models, budgets or a running cap
return the incumbent unchanged (``stats['window']`` says why).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from kvsched.costmodel.base import CostModel
from kvsched.costmodel.unit import UnitCost
from kvsched.csp.incumbents.base import Incumbent, eviction_is_free
from kvsched.csp.objectives import OBJECTIVES
from kvsched.errors import KvschedError
from kvsched.instances.model import Instance
from kvsched.schedule.data import ProblemData
from kvsched.schedule.ir import Batch, Phase, Schedule
from kvsched.schedule.validate import Trace, instance_cost_model, replay
from kvsched.stop import Deadline

_PREFILL, _DECODE, _REFILL = int(Phase.PREFILL), int(Phase.DECODE), int(Phase.REFILL)


@dataclass(frozen=True, slots=True, eq=False)
class OpPlan:
    """A free-eviction schedule as its generating ops.

    Parameters
    ----------
    starts
        Start time of each slot (the incumbent's batches, in order; an empty slot is no batch).
    ops
        Per request, the slot index of each of its O ops in order (op u at ``ops[r][u - 1]``).
    """

    starts: np.ndarray
    ops: tuple[np.ndarray, ...]


@dataclass(frozen=True, slots=True)
class _Member:
    """One request of a window model: its ops ``ja..jb-1`` (0-based) lie in the window, ``later`` after it."""

    r: int
    ja: int
    jb: int
    later: np.ndarray  # slot indices of its ops after the window
    extra: int  # later ops it may pull into the window


def plan_of(instance: Instance, trace: Trace) -> OpPlan:
    """The generating ops of a replayed schedule: each batch is a slot, each generated token an op.

    Items that generate nothing (a prompt chunk that does not finish it) leave no op: under free
    eviction the plan's schedule processes the prompt whole in the batch that finishes it.
    """
    records = trace.records
    starts = np.array([rec.start for rec in records], dtype=np.float64)
    slots: list[list[int]] = [[] for _ in range(len(instance.requests))]
    for k, rec in enumerate(records):
        for r in rec.generated.tolist():
            slots[r].append(k)
    return OpPlan(starts, tuple(np.array(s, dtype=np.int64) for s in slots))


def _demands(data: ProblemData, r: int, u: int | np.ndarray) -> int | np.ndarray:
    """KV blocks request r holds during its ops ``u`` (1-based): I + u - 1 tokens, rounded up to blocks."""
    return data.blocks(int(data.prompt[r]) + u - 1)


def plan_usage(data: ProblemData, plan: OpPlan) -> np.ndarray:
    """KV blocks each slot's ops hold (paused requests evicted: the least a schedule of the plan holds)."""
    use = np.zeros(plan.starts.size, dtype=np.int64)
    for r, slots in enumerate(plan.ops):
        np.add.at(use, slots, _demands(data, r, np.arange(1, slots.size + 1)))
    return use


def plan_schedule(instance: Instance, plan: OpPlan, slot: float, meta: dict | None = None) -> Schedule:
    """The schedule of ``plan``: one batch per non-empty slot, paused requests evicted only where needed.

    A paused request keeps its KV while the batch fits M with it (fewer evictions, same times); where it
    does not, the largest paused holders are evicted first (eviction is free here, and the largest frees
    the most with the fewest refills).
    """
    data = ProblemData.of(instance)
    n, cap = data.n, data.kv_blocks
    items: list[list[tuple[int, int]]] = [[] for _ in range(plan.starts.size)]
    for r, slots in enumerate(plan.ops):
        for u, k in enumerate(slots.tolist(), start=1):
            items[k].append((r, u))
    held = np.zeros(n, dtype=np.int64)  # KV tokens each request holds between batches
    holders: set[int] = set()
    batches: list[Batch] = []
    for k, row in enumerate(items):
        if not row:
            continue
        row.sort()
        running = {r for r, _ in row}
        need = sum(_demands(data, r, u) for r, u in row)
        paused = sorted((r for r in holders if r not in running), key=lambda r: -held[r])
        total = need + sum(data.blocks(int(held[r])) for r in paused)
        evicted: list[int] = []
        for r in paused:
            if total <= cap:
                break
            total -= data.blocks(int(held[r]))
            evicted.append(r)
            held[r] = 0
            holders.discard(r)
        reqs, toks, phases = [], [], []
        for r, u in row:
            kv = int(data.prompt[r]) + u - 1  # the core's KV during op u
            if u == 1:
                tok, ph = kv, _PREFILL
            elif held[r] > 0:
                tok, ph = 1, _DECODE
            else:  # evicted after generating: refill all I + G known tokens
                tok, ph = kv, _REFILL
            reqs.append(r)
            toks.append(tok)
            phases.append(ph)
            if u == int(data.output[r]):
                held[r] = 0  # complete: released after the batch
                holders.discard(r)
            else:
                held[r] = kv
                holders.add(r)
        batches.append(Batch.of(float(plan.starts[k]), slot, reqs, toks, phases, sorted(evicted)))
    return Schedule(tuple(batches), dict(meta or {}))


def _congestion(data: ProblemData, plan: OpPlan, slot: float) -> np.ndarray:
    """Requests in the system but not in the slot's batch, per slot (where a better order pays most)."""
    k = plan.starts.size
    arrive_slot = np.searchsorted(plan.starts, data.arrival - 1e-9 * slot)
    done_slot = np.array([s[-1] for s in plan.ops], dtype=np.int64)
    in_system = np.zeros(k + 1, dtype=np.int64)
    np.add.at(in_system, np.minimum(arrive_slot, k), 1)
    np.add.at(in_system, done_slot + 1, -1)
    running = np.zeros(k, dtype=np.int64)
    for s in plan.ops:
        np.add.at(running, s, 1)
    return np.cumsum(in_system)[:k] - running


def _members(
    data: ProblemData,
    plan: OpPlan,
    k0: int,
    k1: int,
    slot: float,
    rng: np.random.Generator,
    *,
    max_ops: int,
    max_members: int,
    max_extra: int,
) -> list[_Member]:
    """The requests a window re-solves, drawn at random: those completing in it (whose completions can
    move) and those active in it that go on after it (whose ops can move later in the window at no cost,
    their count there being fixed) in turn, then requests waiting to start or resume after it.

    A member may pull its later ops into the window only where few are left (at most ``4 max_extra``):
    each pulled op adds a token to every later op, which rarely fits where M is full after the window.
    """
    t_end = plan.starts[k1 - 1]
    done, active, waiting = [], [], []
    for r, slots in enumerate(plan.ops):
        if slots[-1] < k0 or data.arrival[r] > t_end + 1e-9 * slot:
            continue
        ja, jb = int(np.searchsorted(slots, k0)), int(np.searchsorted(slots, k1))
        later = slots[jb:]
        extra = min(later.size, max_extra) if later.size <= 4 * max_extra else 0
        m = _Member(r, ja, jb, later, extra)
        if jb > ja and later.size == 0:
            done.append(m)
        elif jb > ja:
            active.append(m)
        elif extra > 0:
            waiting.append(m)
    rng.shuffle(done)
    rng.shuffle(active)
    waiting.sort(key=lambda m: m.later.size)  # the least left to do first: its completion moves most
    order = [x for pair in zip(done, active, strict=False) for x in pair]
    rest = done[len(order) // 2 :] + active[len(order) // 2 :]
    picked: list[_Member] = []
    ops = 0
    for m in [*order, *rest, *waiting]:
        size = m.jb - m.ja + m.extra
        if len(picked) >= max_members:
            break
        if ops + size > max_ops:
            continue  # frozen: its ops stay where they are
        picked.append(m)
        ops += size
    return picked


def _group(
    data: ProblemData,
    plan: OpPlan,
    slot: float,
    rng: np.random.Generator,
    *,
    size: int,
    max_width: int,
    max_ops: int,
) -> tuple[int, int, list[_Member]] | None:
    """A few requests whose lives overlap, re-solved over their whole lives (their ops all in the window).

    A time window rarely holds a request's whole life at memory load 1: the greedy runs a request it
    started to completion, so a window's completing requests already run in every slot of it and the
    others' later ops pin their op counts. Re-solving a small group over the slots from the earliest
    arrival among them to the last completion (at most ``max_width`` slots, the earlier ops frozen) lets
    one start before another, exactly, against the residual the frozen rest leaves. The pivot is drawn
    by its waiting time (latency less its own ops), the others among those alive with it, nearest
    completion first.
    """
    n = len(plan.ops)
    last = np.array([s[-1] for s in plan.ops], dtype=np.int64)
    arrive = np.searchsorted(plan.starts, data.arrival - 1e-9 * slot)
    wait = (plan.starts[last] + slot - data.arrival) / slot - data.output
    if wait.max() <= 0:
        return None
    pivot = int(rng.choice(n, p=wait.clip(0) / wait.clip(0).sum()))
    alive = np.flatnonzero((arrive <= last[pivot]) & (last >= arrive[pivot]))
    alive = alive[alive != pivot]
    near = alive[np.argsort(np.abs(last[alive] - last[pivot]), kind="stable")][: 4 * size]
    group = [pivot, *rng.permutation(near)[: size - 1].tolist()]
    k1 = int(last[group].max()) + 1
    k0 = max(int(arrive[group].min()), k1 - max_width)
    members, ops = [], 0
    for r in group:
        slots = plan.ops[r]
        ja = int(np.searchsorted(slots, k0))
        if ja == slots.size or ops + slots.size - ja > max_ops:  # done before k0, or too large
            continue
        ops += slots.size - ja
        members.append(_Member(r, ja, slots.size, slots[slots.size :], 0))
    return (k0, k1, members) if len(members) >= 2 else None


def _count(plan: OpPlan, k0: int, k1: int) -> int:
    """Requests with an op in [k0, k1) (a window model that took them all re-solved the window whole)."""
    return sum(1 for s in plan.ops if np.any((s >= k0) & (s < k1)))


@dataclass(frozen=True, slots=True)
class _Outcome:
    """What one window model gave: the members' new op slots where it improves, and how it went."""

    ops: dict[int, np.ndarray] | None
    gain: float  # the model's objective decrease (slot units)
    optimal: bool
    seconds: float


def _solve_window(
    data: ProblemData,
    plan: OpPlan,
    use: np.ndarray,
    k0: int,
    k1: int,
    members: list[_Member],
    slot: float,
    seconds: float,
    seed: int,
) -> _Outcome:
    """Re-solve ``members``' ops in slots [k0, k1) with CP-SAT, everything else frozen."""
    from ortools.sat.python import cp_model  # imported here: the package loads without OR-Tools paths

    started = time.perf_counter()
    m = cp_model.CpModel()
    width = k1 - k0
    cap = data.kv_blocks
    t0 = float(plan.starts[k0])
    # End of each window slot in whole slots from t0 (batches may have idle gaps between them).
    ends_in = np.round((plan.starts[k0:k1] - t0) / slot).astype(np.int64) + 1
    frozen = use[k0:k1].copy()  # what the frozen rest holds per window slot, once the members' ops are out
    later_use: dict[int, int] = {}  # slot after the window -> KV of the rest there (extending members out)
    later_terms: dict[int, list] = {}
    intervals, demands, objective, current = [], [], [], 0
    variables: dict[int, tuple[list, list]] = {}  # per member: its ops' start variables and presence literals
    for mem in members:
        r, ja, jb, later, extra = mem.r, mem.ja, mem.jb, mem.later, mem.extra
        slots = plan.ops[r]
        b = jb - ja
        u = np.arange(ja + 1, jb + extra + 1)  # op indices of the window ops and the optional extras
        dem = _demands(data, r, u)
        frozen -= np.bincount(slots[ja:jb] - k0, weights=dem[:b], minlength=width).astype(np.int64)
        earliest = 0
        if ja == 0:  # its first op: not before its arrival (the first slot starting at or after it)
            earliest = max(0, int(np.searchsorted(plan.starts, data.arrival[r] - 1e-9 * slot)) - k0)
        # Pulled ops come after its window ops, one a slot: no more than the slots left after them.
        extra = max(0, min(extra, width - earliest - b))
        starts, present = [], []
        variables[r] = (starts, present)
        for i in range(b + extra):
            lo = earliest + i
            hi = width - 1 - max(0, b - 1 - i)
            s = m.new_int_var(lo, max(lo, hi), f"s{r}_{i}")
            if i < b:
                iv = m.new_fixed_size_interval_var(s, 1, f"i{r}_{i}")
                m.add_hint(s, int(slots[ja + i] - k0))
                if i:
                    m.add(s >= starts[-1] + 1)
            else:
                p = m.new_bool_var(f"p{r}_{i}")
                iv = m.new_optional_fixed_size_interval_var(s, 1, p, f"i{r}_{i}")
                m.add_hint(p, 0)
                m.add_hint(s, lo)
                if i:
                    m.add(s >= starts[-1] + 1).only_enforce_if(p)
                if present:
                    m.add_implication(p, present[-1])
                present.append(p)
            starts.append(s)
            intervals.append(iv)
            demands.append(int(dem[i]))
        if later.size == 0:  # it completes in the window: its last op's end is its completion
            c = m.new_int_var(int(ends_in[0]), int(ends_in[-1]), f"c{r}")
            m.add_element(starts[-1], ends_in.tolist(), c)
            m.add_hint(c, int(ends_in[slots[-1] - k0]))
            objective.append(c)
            current += int(ends_in[slots[-1] - k0])
            continue
        if extra == 0:
            continue  # its completion after the window does not move
        # Pulling e ops in: its later ops i < L - e keep their slots with e more tokens each, the rest go.
        L = later.size
        base_u = np.arange(jb + 1, jb + L + 1)
        ends = (plan.starts[later] - t0) / slot + 1  # completion if its last later op is the i-th
        if not np.allclose(ends, np.round(ends)):
            return _Outcome(None, 0.0, False, time.perf_counter() - started)
        ends = np.round(ends).astype(np.int64)
        current += int(ends[-1])
        # values[i, e]: KV blocks of its i-th later op with e ops pulled in (0 once the op is gone).
        shifted = _demands(data, r, base_u[:, None] + np.arange(extra + 1)[None, :])
        values = np.where(np.arange(L)[:, None] < L - np.arange(extra + 1)[None, :], shifted, 0)
        steps = np.diff(values, axis=1)
        for i, q in enumerate(later.tolist()):
            later_use[q] = later_use.get(q, int(use[q])) - int(values[i, 0])
            terms = later_terms.setdefault(q, [])
            terms.append(int(values[i, 0]))
            terms.extend((present[e], int(steps[i, e])) for e in range(extra))
        chain = int(ends[-1]) + sum(
            present[e - 1] * int(ends[L - 1 - e] - ends[L - e]) for e in range(1, min(extra, L - 1) + 1)
        )
        if extra < L:
            objective.append(chain)
        else:  # all of its later ops may come in: then its last extra op's end is its completion
            c = m.new_int_var(0, int(ends[-1]), f"c{r}")
            m.add(c >= chain).only_enforce_if(present[-1].Not())
            last = m.new_int_var(int(ends_in[0]), int(ends_in[-1]), f"l{r}")
            m.add_element(starts[-1], ends_in.tolist(), last)
            m.add(c >= last).only_enforce_if(present[-1])
            m.add_hint(c, int(ends[-1]))
            objective.append(c)
    if not objective or np.any(frozen > cap):
        return _Outcome(None, 0.0, False, time.perf_counter() - started)
    for k in np.flatnonzero(frozen > 0).tolist():  # the frozen rest's KV: fixed blockers
        intervals.append(m.new_fixed_size_interval_var(int(k), 1, f"f{k}"))
        demands.append(int(frozen[k]))
    m.add_cumulative(intervals, demands, cap)
    for q, terms in later_terms.items():  # after the window: the extended members' KV on what is left
        const = sum(t for t in terms if isinstance(t, int))
        expr = sum(lit * coef for lit, coef in (t for t in terms if not isinstance(t, int)) if coef)
        m.add(expr + const <= cap - later_use[q])
    m.minimize(sum(objective))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 2
    solver.parameters.max_time_in_seconds = max(0.05, seconds)
    solver.parameters.random_seed = seed
    status = solver.solve(m)
    optimal = status == cp_model.OPTIMAL
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return _Outcome(None, 0.0, False, time.perf_counter() - started)
    gain = current - solver.objective_value
    if gain < 0.5:
        return _Outcome(None, 0.0, optimal, time.perf_counter() - started)
    new_ops: dict[int, np.ndarray] = {}
    for mem in members:
        starts, present = variables[mem.r]
        e = sum(bool(solver.value(p)) for p in present)
        window = [k0 + int(solver.value(s)) for s in starts[: mem.jb - mem.ja + e]]
        slots = plan.ops[mem.r]
        new_ops[mem.r] = np.array(
            [*slots[: mem.ja].tolist(), *window, *mem.later[: mem.later.size - e].tolist()], dtype=np.int64
        )
    return _Outcome(new_ops, float(gain), optimal, time.perf_counter() - started)


def _unsupported(instance: Instance, incumbent: Incumbent, cost_model: CostModel) -> str:
    """Why the search cannot run on ``incumbent`` (empty: it can)."""
    if incumbent.objective != "total-latency":
        return f"not run: objective {incumbent.objective} (only total-latency is searched)"
    if not (isinstance(cost_model, UnitCost) and eviction_is_free(instance, cost_model)):
        return "not run: eviction is not free (unit time without a token or prefill budget only)"
    if instance.limits.max_running is not None:
        return "not run: a running cap (the model has no count of holders)"
    if len(instance.requests) == 0 or len(incumbent.schedule) == 0:
        return "not run: nothing to schedule"
    return ""


def _windows(congestion: np.ndarray, width: int, rng: np.random.Generator, first: bool) -> list[int]:
    """Window starts for one pass: half-overlapping, the most congested first on the first pass, then
    shuffled from a random offset (so that later passes cut the horizon elsewhere)."""
    k = congestion.size
    step = max(1, width // 2)
    offset = 0 if first else int(rng.integers(0, step))
    starts = np.arange(offset, max(1, k - 1), step)
    if first:
        score = np.add.reduceat(congestion, starts) if starts.size else starts
        return starts[np.argsort(-score, kind="stable")].tolist()
    return rng.permutation(starts).tolist()


def window_search(
    instance: Instance,
    incumbent: Incumbent,
    deadline: Deadline | None = None,
    *,
    window: int = 30,
    max_ops: int = 400,
    max_members: int = 8,
    max_extra: int = 8,
    solve_s: float = 1.0,
    group: int = 4,
    group_width: int = 600,
    seed: int = 0,
    cost_model: CostModel | None = None,
) -> Incumbent:
    """A schedule no worse than ``incumbent``: windows of its ops re-solved exactly, until ``deadline``.

    Parameters
    ----------
    incumbent
        The schedule to improve (any validated schedule of a unit-time instance without budgets).
    window
        Slots in the first window; it grows while CP-SAT proves its windows optimal within half of
        ``solve_s`` and shrinks where it does not (8 to 240 slots).
    max_ops, max_members
        Ops and requests a window model re-places at most (the others stay frozen).
    max_extra
        Later ops a request may pull into a window.
    solve_s
        CP-SAT's time per window (2 workers).
    group, group_width
        Requests in a group window and its most slots (:func:`_group`; ``group`` < 2: time windows only).

    Returns the best replayed schedule found, with ``stats`` counting windows solved (``windows``),
    proven optimal (``optimal``), kept (``accepted``), and model/replay disagreements (``mismatches``).
    The incumbent itself comes back (with ``stats['window']`` saying why) where the search does not
    apply (:func:`_unsupported`).
    """
    deadline = deadline or Deadline.never()
    cost_model = cost_model if cost_model is not None else instance_cost_model(instance)
    why = _unsupported(instance, incumbent, cost_model)
    if why:
        return Incumbent(
            incumbent.name, incumbent.schedule, incumbent.value, incumbent.objective,
            {**incumbent.stats, "window": why}, incumbent.trace,
        )  # fmt: skip
    assert isinstance(cost_model, UnitCost)
    slot = float(cost_model.slot)
    data = ProblemData.of(instance)
    started = time.perf_counter()
    trace = (
        incumbent.trace if incumbent.trace is not None else replay(instance, incumbent.schedule, cost_model)
    )
    plan = plan_of(instance, trace)
    rel = plan.starts / slot
    if not np.allclose(rel, np.round(rel)):
        return Incumbent(
            incumbent.name, incumbent.schedule, incumbent.value, incumbent.objective,
            {**incumbent.stats, "window": "not run: batches off the whole-slot grid"}, incumbent.trace,
        )  # fmt: skip
    use = plan_usage(data, plan)
    rng = np.random.default_rng(seed)
    best, value = incumbent, incumbent.value
    meta = {"policy": "window-lns", "from": incumbent.name}
    name = f"window({incumbent.name})"
    width, windows, optimal, accepted, mismatches = window, 0, 0, 0, 0
    model_s = rebuild_s = 0.0
    # A kept move costs a rebuild and a replay: no window starts unless one would still fit after it.
    replay_s = [float(incumbent.stats.get("replay_s", 0.0)) or 0.5]
    first, idle = True, 0
    while deadline.remaining() > solve_s + replay_s[0]:
        congestion = _congestion(data, plan, slot)
        improved, proven, tried = False, True, 0
        for k0 in _windows(congestion, width, rng, first):
            # A time window, then a group of requests over their lives (``group`` > 1), in turn.
            for kind in ("time", "group") if group > 1 else ("time",):
                if deadline.remaining() <= min(solve_s, 0.2) + replay_s[0]:
                    break
                if kind == "time":
                    lo, hi = k0, min(plan.starts.size, k0 + width)
                    members = _members(
                        data, plan, lo, hi, slot, rng, max_ops=max_ops, max_members=max_members,
                        max_extra=max_extra,
                    )  # fmt: skip
                else:
                    picked = _group(
                        data, plan, slot, rng, size=group, max_width=group_width, max_ops=3 * max_ops
                    )
                    if picked is None:
                        continue
                    lo, hi, members = picked
                if hi - lo < 2 or not members:
                    continue
                seconds = min(solve_s, deadline.remaining() - replay_s[0])
                out = _solve_window(data, plan, use, lo, hi, members, slot, seconds, seed + windows)
                windows, tried = windows + 1, tried + 1
                optimal += out.optimal
                model_s += out.seconds
                if kind == "time":
                    proven = proven and out.optimal and len(members) == _count(plan, lo, hi)
                    # Grow the window while CP-SAT proves it quickly; shrink it where it cannot prove it.
                    if out.optimal and out.seconds < 0.5 * solve_s:
                        width = min(240, width + max(1, width // 4))
                    elif not out.optimal:
                        width = max(8, width - max(1, width // 5))
                if out.ops is None:
                    continue
                trial = OpPlan(plan.starts, tuple(out.ops.get(r, s) for r, s in enumerate(plan.ops)))
                t = time.perf_counter()
                schedule = plan_schedule(instance, trial, slot, meta)
                try:
                    got = replay(instance, schedule, cost_model)
                except KvschedError:
                    mismatches += 1  # the model and the core disagree: the move is dropped
                    continue
                finally:
                    replay_s[0] = max(replay_s[0] * 0.5, time.perf_counter() - t)
                    rebuild_s += time.perf_counter() - t
                got_value = OBJECTIVES[incumbent.objective](got)
                if abs(got_value - (value - out.gain * slot)) > 1e-6 * max(1.0, abs(value)):
                    mismatches += 1  # replayed and legal, but not what the model said: counted
                if got_value < value - 1e-9:
                    plan, value, accepted, improved = trial, got_value, accepted + 1, True
                    use = plan_usage(data, plan)
                    best = Incumbent(name, schedule, got_value, incumbent.objective, {}, got)
        # Two passes in a row with every time window proven optimal over all its requests and nothing
        # kept: a local optimum of this neighbourhood (small instances get there in well under a second).
        idle = 0 if improved or not proven else idle + 1
        if idle >= 2 or tried == 0:
            break
        first = False
    stats = {
        **incumbent.stats,
        "window_windows": windows,
        "window_optimal": optimal,
        "window_accepted": accepted,
        "window_mismatches": mismatches,
        "window_model_s": round(model_s, 3),
        "window_rebuild_s": round(rebuild_s, 3),
        "window_seconds": round(time.perf_counter() - started, 3),
        "window_width": width,
        "start": incumbent.value,
    }
    return Incumbent(best.name, best.schedule, best.value, best.objective, stats, best.trace)
