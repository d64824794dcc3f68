"""Hypothesis strategies for small instances, and a builder of random *legal* schedules.

Reusable by any test file::

    from tests.strategies import SETTINGS, instances, legal_schedules

    @SETTINGS
    @given(legal_schedules())
    def test_something(built): ...

:func:`build_legal_schedule` is the workhorse: it drives an
:class:`~kvsched.schedule.core.EngineState` with random batches (random
evictions of KV-holding requests, a random subset of the arrived unfinished
requests, random prefill/refill chunk sizes), keeps a batch only when
``state.check`` finds nothing (shrinking it by dropping items otherwise), jumps
to the next arrival when nothing has arrived, and always terminates with every
request complete: when a random batch shrinks to nothing, or after a bounded
number of random steps, it falls back to running the oldest arrived request
alone (evicting everyone else if needed), which is always feasible because
instances satisfy I + O - 1 <= M in blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from kvsched.costmodel import CostModel, InfermaxLinear, UnitCost
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.core import TIME_TOL, EngineState
from kvsched.schedule.ir import Batch, Phase, Schedule

#: Deterministic, deadline-free settings for property tests (CI must not flake).
SETTINGS = settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)

#: Cost-model names the strategies draw from.
COST_MODELS = ("unit", "infermax-linear")

#: Arrivals are drawn in 0..5 "slots"; a slot lasts this long under each cost model, so that
#: arrivals interleave with batches (an InfermaxLinear batch of a few tokens takes ~6 ms).
ARRIVAL_SCALE = {"unit": 1.0, "infermax-linear": 0.01}


def budget_trio(time_model: TimeModel) -> Instance:
    """Three requests under a token and a prefill budget (one arriving late): small enough for
    :func:`tests.brute.brute_force`, tight enough that budgets, chunking and evictions all matter."""
    return Instance(
        (Request("a", 0, 3, 2), Request("b", 0, 1, 2), Request("c", 1, 1, 2)),
        Limits(kv_capacity=4, max_batch_tokens=3, max_prefill_tokens=2),
        time_model,
    )


def cost_model_for(instance: Instance) -> CostModel:
    """The cost model an instance built by these strategies names."""
    name = instance.time_model.name
    if name == "unit":
        return UnitCost(**instance.time_model.params)
    if name == "infermax-linear":
        return InfermaxLinear(**instance.time_model.params)
    raise ValueError(f"no cost model for {name!r}")


# --------------------------------------------------------------------------- instances
@st.composite
def instances(
    draw: st.DrawFn,
    *,
    min_requests: int = 1,
    max_requests: int = 6,
    cost: str | None = None,
    budgets: bool = True,
    max_prompt: int = 12,
    min_output: int = 1,
    max_output: int = 6,
) -> Instance:
    """Small random feasible instances.

    1-6 requests (by default), I in 1..12, O in 1..6, arrivals in 0..5 slots
    (integers or floats), block size 1..4, M >= the largest peak I + O - 1 in
    blocks (tight half of the time), and optional token budget C, prefill
    budget P and ``max_running``. ``cost`` fixes the time model (``"unit"`` or
    ``"infermax-linear"``); by default it is drawn.
    """
    n = draw(st.integers(min_requests, max_requests))
    cost_name = cost if cost is not None else draw(st.sampled_from(COST_MODELS))
    scale = ARRIVAL_SCALE[cost_name]
    float_arrivals = draw(st.booleans())
    arrival_st = (
        st.floats(0.0, 5.0, allow_nan=False, allow_infinity=False, allow_subnormal=False)
        if float_arrivals
        else st.integers(0, 5).map(float)
    )
    requests = []
    for k in range(n):
        prompt = draw(st.integers(1, max_prompt))
        output = draw(st.integers(min_output, max_output))
        arrival = draw(arrival_st) * scale
        requests.append(Request(id=f"r{k}", arrival=arrival, prompt=prompt, output=output))
    block = draw(st.integers(1, 4))
    peak = max(r.peak_kv for r in requests)
    need = -(-peak // block) * block
    tight = draw(st.booleans())
    kv_capacity = need if tight else need + draw(st.integers(0, 3 * need))
    C = P = running = None
    if budgets:
        C = draw(st.none() | st.integers(1, 24))
        P = draw(st.none() | st.integers(1, 16))
        running = draw(st.none() | st.integers(1, 4))
    limits = Limits(
        kv_capacity=kv_capacity,
        block_size=block,
        max_batch_tokens=C,
        max_prefill_tokens=P,
        max_running=running,
    )
    inst = Instance(tuple(requests), limits, TimeModel(cost_name), name="hypothesis")
    inst.check_feasible()
    return inst


# ------------------------------------------------------------------- legal schedules
@dataclass(frozen=True, eq=False)
class BuiltSchedule:
    """A random legal schedule and what the builder knows about it.

    ``dropped_kv[i]`` is the KV request ``i`` lost to evictions, so every
    request processes exactly ``I + O - 1 + dropped_kv[i]`` tokens in all.
    """

    instance: Instance
    schedule: Schedule
    cost_model: CostModel
    dropped_kv: np.ndarray
    num_evictions: int
    fallback_steps: int


def _oldest(state: EngineState, live: np.ndarray) -> int:
    cand = np.flatnonzero(live)
    order = np.lexsort((cand, state.arrival[cand]))
    return int(cand[order[0]])


def _solo_tokens(state: EngineState, pos: int) -> int:
    """Tokens for ``pos`` run alone: the whole next step, capped by C and P."""
    lim = state.instance.limits
    left = int(state.unprocessed(pos))
    if state.phase_of(np.array([pos]))[0] == Phase.DECODE:
        return 1
    for cap in (lim.max_batch_tokens, lim.max_prefill_tokens):
        if cap is not None:
            left = min(left, cap)
    return left


def build_legal_schedule(
    instance: Instance,
    rng: np.random.Generator | int,
    cost_model: CostModel | None = None,
    *,
    p_evict: float = 0.25,
    p_idle: float = 0.1,
    max_random_steps: int | None = None,
) -> BuiltSchedule:
    """Build a random schedule of ``instance`` that is legal by construction.

    Parameters
    ----------
    rng
        A numpy generator, or a seed.
    cost_model
        Durations come from it; defaults to the instance's own.
    p_evict
        Probability that a step considers evictions at all (each KV holder is
        then evicted with probability 1/3).
    p_idle
        Probability that a step idles a little before starting its batch.
    max_random_steps
        Random steps before the builder only runs the oldest request alone
        (which guarantees termination). Defaults to ``3 * sum(I + O) + 10``.
    """
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    cm = cost_model if cost_model is not None else cost_model_for(instance)
    state = EngineState(instance, cm)
    total_work = int(sum(r.prompt + r.output for r in instance.requests))
    random_steps = 3 * total_work + 10 if max_random_steps is None else max_random_steps
    hard_cap = random_steps + (total_work + 2) * (len(instance) + 2) + 50
    batches: list[Batch] = []
    dropped = np.zeros(state.n, dtype=np.int64)
    evictions = 0
    fallbacks = 0
    t = 0.0
    steps = 0
    while not state.all_done:
        steps += 1
        if steps > hard_cap:  # pragma: no cover - would be a builder bug
            raise RuntimeError("build_legal_schedule did not terminate")
        t = max(t, state.clock)
        live = ~state.done & (state.arrival <= t + TIME_TOL)
        if not live.any():
            t = float(state.arrival[~state.done].min())
            continue
        if batches and rng.random() < p_idle:
            t += float(rng.choice([0.25, 0.5, 1.0])) * batches[-1].duration
        batch = None
        if steps <= random_steps:
            batch = _random_batch(state, t, live, rng, p_evict)
        if batch is None:
            batch = _fallback_batch(state, t, live)
            fallbacks += 1
        found = state.check(batch)
        if found:  # pragma: no cover - the fallback is always legal
            raise AssertionError(f"builder produced an illegal batch: {found}")
        ev = batch.evicted
        dropped[ev] += state.kv[ev]
        evictions += int(ev.size)
        state.apply(batch)
        batches.append(batch)
    return BuiltSchedule(
        instance=instance,
        schedule=Schedule(tuple(batches), {"builder": "random-legal"}),
        cost_model=cm,
        dropped_kv=dropped,
        num_evictions=evictions,
        fallback_steps=fallbacks,
    )


def _random_batch(
    state: EngineState, t: float, live: np.ndarray, rng: np.random.Generator, p_evict: float
) -> Batch | None:
    holders = np.flatnonzero(state.kv > 0)
    ev = np.zeros(0, dtype=np.int64)
    if holders.size and rng.random() < p_evict:
        ev = holders[rng.random(holders.size) < 1 / 3]
    cand = np.setdiff1d(np.flatnonzero(live), ev)
    if cand.size == 0:
        return None
    # Requests holding KV usually keep running (continuous batching); others join at random.
    keep = np.where(state.kv[cand] > 0, 0.85, rng.uniform(0.3, 1.0))
    cand = cand[rng.random(cand.size) < keep]
    if cand.size == 0:
        cand = np.flatnonzero(live)
        cand = np.setdiff1d(cand, ev)[:1]
    rng.shuffle(cand)
    lim = state.instance.limits
    caps = [c for c in (lim.max_batch_tokens, lim.max_prefill_tokens) if c is not None]
    tokens = []
    for pos in cand:
        left = int(state.unprocessed(int(pos)))
        if caps and left > 1 and rng.random() < 0.8:
            left = min(left, *caps)  # usually respect the budgets; sometimes let the shrink loop act
        if left <= 1 or rng.random() < 0.5:
            tokens.append(left)
        else:
            tokens.append(int(rng.integers(1, left + 1)))
    req = [int(p) for p in cand]
    while req:
        batch = state.make_batch(t, req, tokens, ev)
        if not state.check(batch):
            return batch
        # Shrink: halve a chunk, or drop an item (usually one that would start holding KV).
        multi = [k for k, c in enumerate(tokens) if c > 1]
        if multi and rng.random() < 0.5:
            k = multi[int(rng.integers(len(multi)))]
            tokens[k] = int(rng.integers(1, tokens[k]))
            continue
        fresh = [k for k, p in enumerate(req) if state.kv[p] == 0]
        pool = fresh if fresh and rng.random() < 0.8 else list(range(len(req)))
        k = pool[int(rng.integers(len(pool)))]
        del req[k], tokens[k]
    return None


def _fallback_batch(state: EngineState, t: float, live: np.ndarray) -> Batch:
    pos = _oldest(state, live)
    tok = _solo_tokens(state, pos)
    batch = state.make_batch(t, [pos], [tok])
    if state.check(batch):
        others = np.flatnonzero(state.kv > 0)
        others = others[others != pos]
        batch = state.make_batch(t, [pos], [tok], others)
    return batch


def random_legal_schedule(instance: Instance, seed: int, **kwargs: float) -> BuiltSchedule:
    """:func:`build_legal_schedule` with a seed (for fixed-seed tests)."""
    return build_legal_schedule(instance, np.random.default_rng(seed), **kwargs)


@st.composite
def legal_schedules(
    draw: st.DrawFn, instance_strategy: st.SearchStrategy[Instance] | None = None
) -> BuiltSchedule:
    """A random instance (from ``instance_strategy``) and a random legal schedule of it."""
    inst = draw(instance_strategy if instance_strategy is not None else instances())
    seed = draw(st.integers(0, 2**32 - 1))
    p_evict = draw(st.sampled_from([0.0, 0.25, 0.6]))
    return build_legal_schedule(inst, np.random.default_rng(seed), p_evict=p_evict)


# ------------------------------------------------------------------ schedule surgery
def relaxed(instance: Instance, **overrides: int | None) -> Instance:
    """``instance`` with unlimited budgets and a huge M (block size kept), then ``overrides``.

    A legal schedule stays legal under relaxed limits, so corruption tests use
    it to make sure the corruption is the *only* thing wrong.
    """
    lim = Limits(kv_capacity=10**9, block_size=instance.limits.block_size)
    if overrides:
        lim = replace(lim, **overrides)
    return replace(instance, limits=lim)


def with_limits(instance: Instance, **changes: int | None) -> Instance:
    """``instance`` with some limits changed."""
    return replace(instance, limits=replace(instance.limits, **changes))


def copy_batch(batch: Batch, **changes: object) -> Batch:
    """A fresh :meth:`Batch.of` copy of ``batch`` through plain Python lists, with ``changes``."""
    fields = {
        "start": batch.start,
        "duration": batch.duration,
        "requests": batch.requests.tolist(),
        "tokens": batch.tokens.tolist(),
        "phases": batch.phases.tolist(),
        "evicted": batch.evicted.tolist(),
    }
    fields.update(changes)
    return Batch.of(**fields)  # type: ignore[arg-type]


def copy_schedule(schedule: Schedule) -> Schedule:
    """A deep copy of ``schedule`` built from plain Python values only."""
    return Schedule(tuple(copy_batch(b) for b in schedule.batches), dict(schedule.meta))


def state_before(instance: Instance, schedule: Schedule, k: int, cost_model: CostModel) -> EngineState:
    """The engine state just before batch ``k`` of a legal ``schedule``."""
    state = EngineState(instance, cost_model)
    for batch in schedule.batches[:k]:
        state.apply(batch)
    return state


def replace_batch(schedule: Schedule, k: int, new: Batch | None, *, shift: bool = True) -> Schedule:
    """``schedule`` with batch ``k`` replaced by ``new`` (or removed if ``None``).

    With ``shift``, when ``new`` ends later than the batch it replaces, every
    later batch moves later by the difference, so nothing overlaps.
    """
    old = schedule.batches[k]
    later = list(schedule.batches[k + 1 :])
    if shift and new is not None and new.end > old.end:
        delta = new.end - old.end
        later = [copy_batch(b, start=b.start + delta) for b in later]
    head = list(schedule.batches[:k])
    mid = [] if new is None else [new]
    return Schedule(tuple(head + mid + later), dict(schedule.meta))


def insert_batch(schedule: Schedule, k: int, new: Batch) -> Schedule:
    """``schedule`` with ``new`` inserted as batch ``k`` (later batches shifted by its duration)."""
    later = [copy_batch(b, start=b.start + new.duration) for b in schedule.batches[k:]]
    return Schedule(tuple([*schedule.batches[:k], new, *later]), dict(schedule.meta))


def item_batches(schedule: Schedule, pos: int) -> list[int]:
    """Indices of the batches that process request ``pos``."""
    return [k for k, b in enumerate(schedule.batches) if pos in b.requests]


def schedule_from_starts(instance: Instance, starts: list[int] | tuple[int, ...]) -> Schedule:
    """The unit-time, no-chunking, no-eviction schedule that starts request ``i`` in round ``starts[i]``.

    Round t is the batch starting at time t (the MC-SF model, seed 004 Sec. 3):
    a request processes its whole prompt in its start round and then one decode
    per round until it completes. Rounds with nothing to run are skipped (the
    engine idles). Batches are built with :meth:`EngineState.make_batch` and
    applied *without* checking, so an infeasible choice of starts yields an
    illegal schedule for the validator to report.
    """
    state = EngineState(instance, UnitCost())
    batches = []
    t = min(starts)
    while not state.all_done:
        run = [i for i in range(state.n) if starts[i] <= t and not state.done[i]]
        if run:
            tokens = [int(state.unprocessed(i)) for i in run]
            batch = state.make_batch(float(t), run, tokens)
            state.apply(batch)
            batches.append(batch)
        t += 1
    return Schedule(tuple(batches), {"builder": "from-starts", "starts": list(starts)})
