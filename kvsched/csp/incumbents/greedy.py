"""The eviction-aware priority greedy: a legal, complete schedule for an instance of any size, fast.

Every batch walks the requests in priority order (smallest key first, see
:mod:`~kvsched.csp.incumbents.rules`) and packs them first-fit into the KV
capacity, the token budgets C and P (prefills and refills are chunked to what
is left of them) and ``max_running``. A request already holding KV that does not
fit is paused while its KV still fits, and evicted otherwise; with ``preempt`` a
higher-priority waiting request takes the memory of lower-priority holders,
which are then evicted (free under unit time without a budget: the refill
re-appends I + G tokens and generates in the same batch, exactly as a decode
would; with a budget it costs tokens, which the packing charges). Where an eviction
costs, an admission ``lookahead`` keeps room for the running requests' next
decodes, so that fewer fresh prefills are evicted again.

The decisions run in a compiled kernel (:mod:`~kvsched.csp.incumbents._kernel`),
batch durations come from the instance's own cost model (the object the core
checks them against), and the schedule is replayed through the core before it
is returned.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Literal, overload

import numpy as np

from kvsched.costmodel.base import BatchView, CostModel
from kvsched.costmodel.unit import UnitCost
from kvsched.csp.incumbents import _kernel as K
from kvsched.csp.incumbents.base import Incumbent, Unbuilt, entries_seconds
from kvsched.csp.incumbents.complete import ITEMS_PER_REQUEST, reserved_batches
from kvsched.csp.incumbents.log import BatchLog, sealed, with_room
from kvsched.csp.incumbents.rules import kv_area, rule_keys
from kvsched.csp.objectives import objective_function
from kvsched.instances.model import Instance
from kvsched.jit import is_compiled, use_compiled
from kvsched.schedule.core import EngineState
from kvsched.schedule.data import ProblemData
from kvsched.schedule.ir import Batch, Run, Schedule
from kvsched.schedule.validate import instance_cost_model, replay
from kvsched.stop import Deadline

#: Batches decided between two deadline checks (compiled, interpreted kernel).
CHUNK_JIT, CHUNK_PY = 4096, 64
#: Seconds the interpreted kernel takes per batch (measured 0.5-0.8 ms on 2 loaded cores), for choosing it
#: over a cold compile (:func:`kvsched.jit.use_compiled`).
PY_SECONDS_PER_BATCH = 1e-3
#: Seconds per output token of a whole greedy run (decide, build, replay) in its cheapest mode, a low
#: estimate: measured 0.54 us at 10k ShareGPT requests and 0.78 us at 100k on 2 loaded cores. Low on
#: purpose: at 10k a first schedule's share (1.5 s of a 10 s limit) still preempts (-1.8% total latency);
#: at 100k (34.5 M tokens, a 7-11 s share of a 60 s limit) the whole run is in the cheapest mode.
CHEAP_SECONDS_PER_TOKEN = 4e-7
#: Seconds per output token of a whole greedy run, high estimates for deciding whether one fits a deadline
#: before any has been timed: unit time (0.78 us measured at 100k ShareGPT requests), and seconds-based cost
#: models, which price every batch (3.3 us at 100k Azure conversation requests under the A100 fit: 81.7 s,
#: of it 43 s deciding, 20 s building and 19 s replaying; 2 loaded cores).
UNIT_RUN_SECONDS_PER_TOKEN, COSTLY_RUN_SECONDS_PER_TOKEN = 1e-6, 4e-6
#: Batches the cut's probe builds and replays (the first ones; a sample small enough to cost little where the
#: run then fits after all: at 10k ShareGPT requests all at 0 the first chunk of 4,096 was a third of the run).
PROBE_BATCHES = 1024
#: Margin on the estimated cost of completing a cut run's requests (:func:`_finish_estimate`).
FINISH_MARGIN = 1.25
#: Seconds building and replaying a greedy run's batches take per second deciding them, a high estimate
#: (unit time, 100k ShareGPT requests: 79.5 s against 9.2 s, 8.6; A100 fit, 100k Azure conversations: 0.9).
#: Only the gate of the measured estimate: a run whose pace so far says it ends well inside ``stop`` is not
#: probed.
FINISH_PER_DECIDE = 10.0


def compiled_kernels() -> list:
    """The numba kernels this greedy runs (what ``kvsched warmup`` compiles and checks)."""
    return [K.advance_jit]


def run_estimate(instance: Instance, cost_model: CostModel) -> float:
    """A high estimate of one whole greedy run's seconds on ``instance`` (decide, build, replay)."""
    per_token = (
        UNIT_RUN_SECONDS_PER_TOKEN if isinstance(cost_model, UnitCost) else COSTLY_RUN_SECONDS_PER_TOKEN
    )
    return per_token * float(ProblemData.of(instance).output.sum())


def interpreted_seconds(instance: Instance) -> float:
    """A low estimate of the interpreted kernel's time: every schedule has at least this many batches.

    Each request generates one token per batch (``max O`` batches), and a batch
    holds at most M tokens of KV while request j holds at least ``I_j + k`` in
    its k-th generating batch (so at least its KV area over M batches in all).
    """
    data = ProblemData.of(instance)
    area = float(np.sum(kv_area(data.prompt, data.output)))
    batches = max(float(data.output.max(initial=0)), area / instance.limits.kv_capacity)
    return PY_SECONDS_PER_BATCH * batches


def decide(
    instance: Instance,
    rule: str = "remaining-area",
    *,
    preempt: bool = True,
    priority: np.ndarray | None = None,
    scale: np.ndarray | None = None,
    lookahead: int = 0,
    refill_weight: float = 0.0,
    min_chunk: int = 0,
    fit_chunk: bool = False,
    fill: bool = False,
    token_cap: int = 0,
    running_cap: int = 0,
    deadline: Deadline | None = None,
    cost_model: CostModel | None = None,
    jit: bool = True,
    stop: Deadline | None = None,
) -> BatchLog:
    """Run the greedy's decisions and return its batch log (not yet a schedule, not yet replayed).

    Parameters
    ----------
    rule
        Priority rule (:data:`~kvsched.csp.incumbents.rules.RULES`).
    preempt
        Let waiting requests evict lower-priority holders (else holders always go first).
    priority
        External per-request keys (smallest first), overriding ``rule``.
    scale
        Per-request positive factors on the rule's keys (see :func:`~kvsched.csp.incumbents.rules.rule_keys`).
    lookahead
        Admit a waiting request only if, after it, the KV left covers ``lookahead`` more tokens
        for every request run in the batch so far: fewer admissions that the next decodes evict
        again, which pays where eviction is not free (token budgets, seconds-based cost models).
    refill_weight
        Price of evicting a holder, in units of what its refill costs: its key is lowered by
        ``refill_weight`` times the refill's batches ``ceil(m / min(C, P))`` (times its KV m under the
        area rules), so that holders whose refill is long are ranked ahead, paused or evicted last,
        and preempted only by requests that much smaller. With a token budget a refill of m > C tokens
        spans several batches that hold KV without generating and take budget from prefills (0: off).
    min_chunk
        Start a waiting request only with a first chunk of at least this many tokens (or its whole
        prompt): no long prompt is started on the budget's last few tokens (clamped to C and P).
    fit_chunk
        A started prefill or refill whose next chunk does not fit the KV left runs a smaller one
        that does, rather than pausing on what it holds.
    fill
        After each batch's first-fit walk, replace run items of the lowest priority by requests that
        did not fit (waiting ones, holders the walk evicted) and are closer to completion, where the
        KV left allows: one by two whose rates 1 / (O - G) sum above its own (one more item), or one
        by a larger one with fewer tokens left (more KV used). First-fit leaves every misfit ranked
        before a run item larger than that item plus the KV left, so no such swap keeps the priority
        order. Where eviction is free (unit time, no token budget) a replaced holder is evicted;
        elsewhere only admissions are replaced (they stay waiting).
    token_cap
        Fill a batch with at most this many tokens (below the budgets C and P; 0: off): a knot of the
        cost model's token term (:func:`kvsched.csp.incumbents.knots.token_caps`), past which a batch pays
        a step of its non-attention time that its few extra tokens do not earn back. The schedule is legal
        under the instance's own budgets (it keeps a tighter one).
    running_cap
        Let at most this many requests hold KV during a batch (below the instance's ``max_running``;
        0: off): admission control, so that fewer requests share each batch and the ones admitted finish
        sooner (:func:`kvsched.csp.incumbents.admission.running_cap_search` picks it per instance).
    deadline
        Once it expires the kernel stops first-fit search and preemption: it finishes
        the schedule with the cheapest rule it has (holders first, waiting list walked
        up to its first misfit). The schedule is always complete.
    cost_model
        Batch durations; defaults to the instance's own.
    jit
        Use the compiled kernel (else the interpreted reference, same decisions); a kernel not
        compiled yet is compiled only where that fits the deadline or beats the interpreted
        reference (:func:`kvsched.jit.use_compiled`).
    stop
        Where finishing would overrun it (:func:`must_stop`, asked between chunks of batches), the run
        stops and returns the batches decided so far, ``finished`` False.
    """
    started = time.perf_counter()
    instance.check_feasible()
    deadline = deadline or Deadline.never()
    if jit and not is_compiled(K.advance_jit):  # cold: compile it, or run the interpreted reference
        jit = use_compiled([K.advance_jit], deadline, interpreted_seconds=interpreted_seconds(instance))
    cost_model = cost_model if cost_model is not None else instance_cost_model(instance)
    n = len(instance)
    code, skey = rule_keys(instance, rule, priority, scale)
    lim = instance.limits
    ia = np.zeros((7, n), dtype=np.int64)
    data = ProblemData.of(instance)
    ia[0] = data.prompt
    ia[1] = data.output
    fa = np.zeros((2, n), dtype=np.float64)
    fa[0] = data.arrival
    fa[1] = skey
    const = isinstance(cost_model, UnitCost)
    batch_tokens, prefill_tokens = (
        _capped(lim.max_batch_tokens, token_cap),
        _capped(lim.max_prefill_tokens, token_cap),
    )
    # A refill costs nothing only under unit time without a budget (best.eviction_is_free).
    free_eviction = const and batch_tokens is None and prefill_tokens is None

    def budget(value: int | None) -> int:
        return -1 if value is None else int(value)

    limits = np.array(
        [
            lim.kv_blocks,
            lim.block_size,
            budget(batch_tokens),
            budget(prefill_tokens),
            budget(_capped(lim.max_running, running_cap)),
            code,
            int(preempt),
            0,
            int(const),
            int(lookahead),
            # Clamped to the budgets, so that the first item of a batch is always admissible.
            min(
                [
                    int(min_chunk),
                    *(b for b in (batch_tokens, prefill_tokens) if b is not None),
                ]
            ),
            int(fit_chunk),
            (K.FILL_EVICT if free_eviction else K.FILL_ADMIT) if fill else K.FILL_OFF,
        ],
        dtype=np.int64,
    )
    sc = np.zeros(9, dtype=np.int64)
    ib = np.zeros((12, n), dtype=np.int64)
    ib[4] = np.argsort(fa[0], kind="stable")
    fb = np.zeros((6, n), dtype=np.float64)
    clock = np.array(
        [float(fa[0].min()) if n else 0.0, cost_model.slot if const else np.nan, float(refill_weight)]
    )
    cap_b = max(1024, 2 * int(ia[1].max(initial=1)))
    bf = np.zeros((2, cap_b))
    bi = np.zeros((2, cap_b + 1), dtype=np.int64)
    # Every schedule logs at least one item per generated token (sum of O): room for a quarter more
    # from the start, so that the largest buffer is seldom copied (np.zeros is committed as written).
    it = np.zeros((4, 4 * cap_b + n + int(1.25 * ia[1].sum())), dtype=np.int64)
    ev = np.zeros(cap_b + n, dtype=np.int64)
    kernel = K.advance_jit if jit else K.advance_py
    chunk = CHUNK_JIT if jit else CHUNK_PY
    # A run that evicts this many batches' worth of work is thrashing: finish without preemption.
    thrash = 4 * int(ia[0].sum() + ia[1].sum()) + n
    timed = 0  # batches whose start and duration are final
    now = clock[0]
    probe: tuple[float, int, int] | None = None
    while n:
        status = kernel(ia, fa, limits, sc, clock, ib, fb, bf, bi, it, ev, chunk)
        nb = int(sc[3])
        if not const:
            now = _time_batches(cost_model, bf, bi, it, timed, nb, now)
            clock[0] = now
        timed = nb
        if status == K.DONE:
            break
        if status == K.GROW:
            bf, bi, it, ev = _grow(bf, bi, it, ev, n, sc)
        if limits[7] == 0 and (deadline.expired() or nb > thrash):
            limits[6], limits[7] = 0, 1
        if stop is not None and stop.bounded:
            if probe is None:
                if nb < PROBE_BATCHES and stop.remaining() > 0.0:
                    # A smaller sample prices the replay's fixed overhead as if every item cost it: under a
                    # seconds-based model the kernel hands back each batch, and a one-item probe (0.2 ms)
                    # once cut 10k A100 requests after their first batch with a minute left (the run: 2 s).
                    continue
                # The probe replays what is decided so far (at 10k requests a first chunk is a good part of
                # the run): only where the run, at its pace so far, might not finish by ``stop`` at all.
                progress = float(ia[2].sum()) / max(float(ia[1].sum()), 1.0)  # tokens generated, a share
                spent = time.perf_counter() - started
                if spent * (1.0 + FINISH_PER_DECIDE) < progress * stop.remaining():
                    continue
                probe = _finish_probe(instance, cost_model, _log(bf, bi, it, ev, sc, n, PROBE_BATCHES))
            if must_stop(stop, _finish_estimate(probe, nb, int(sc[4]), n - int(sc[6]))):
                break
    return _log(bf, bi, it, ev, sc, n)


def _log(
    bf: np.ndarray,
    bi: np.ndarray,
    it: np.ndarray,
    ev: np.ndarray,
    sc: np.ndarray,
    n: int,
    upto: int | None = None,
) -> BatchLog:
    """The kernel's buffers as a :class:`BatchLog` of the batches decided so far, or of the first ``upto``
    of them. The item arrays are sealed views of the final log (:func:`~.log.sealed`: the kernel is done
    with it) and copies of a log taken mid-run (the kernel goes on writing)."""
    nb, ni, ne = int(sc[3]), int(sc[4]), int(sc[5])
    final = upto is None
    if upto is not None and upto < nb:
        nb, ni, ne = upto, int(bi[0, upto]), int(bi[1, upto])
    items = sealed if final else np.copy
    return BatchLog(
        bf[0, :nb].copy(),
        bf[1, :nb].copy(),
        bi[0, : nb + 1].copy(),
        bi[1, : nb + 1].copy(),
        items(it[0, :ni]),
        items(it[1, :ni]),
        items(it[2, :ni]),
        sealed(it[3, :ni].astype(np.int8)),
        ev[:ne].copy(),
        finished=int(sc[6]) == n and nb == int(sc[3]),
    )


def _finish_probe(instance: Instance, cost_model: CostModel, log: BatchLog) -> tuple[float, int, int]:
    """Seconds to build and replay ``log``'s batches (requests left unfinished), and their batch and item
    counts.

    Replaying dominates a large run (unit time, 100k ShareGPT requests: 9 s deciding, 11 s building, 68 s
    replaying; A100 fit, 100k Azure conversations: 43 / 20 / 19 s), and its cost per batch depends on the
    machine and the batches' sizes, so it is measured here rather than estimated from the decisions' time.
    """
    t0 = time.perf_counter()
    schedule = log.to_schedule()
    built = time.perf_counter() - t0
    return (
        built + entries_seconds(instance, schedule.entries, cost_model),
        log.num_batches,
        int(log.requests.size),
    )


def _finish_estimate(probe: tuple[float, int, int], batches: int, items: int, unfinished: int) -> float:
    """Seconds to stop now: build and replay ``batches`` holding ``items`` (scaled from ``probe`` by whichever
    grew more: a batch costs a fixed part and a part per item) and complete the ``unfinished`` requests
    (:data:`~kvsched.csp.incumbents.complete.ITEMS_PER_REQUEST` of the probe's items each: the completion's
    entries are made, checked and applied by the same core, with a margin of :data:`FINISH_MARGIN`)."""
    seconds, batches0, items0 = probe
    replaying = seconds * max(batches / max(batches0, 1), items / max(items0, 1))
    completing = seconds / max(items0, 1) * ITEMS_PER_REQUEST * unfinished
    # (The scaling by whichever grew more already bounds the replay's cost a + b x items from above.)
    return replaying + FINISH_MARGIN * completing


def must_stop(stop: Deadline, finish: float) -> bool:
    """Whether a run must stop now to end by ``stop``, ``finish`` seconds being what stopping now costs
    (:func:`_finish_estimate`): once that reaches what is left of ``stop``, every later batch would end
    past it."""
    return stop.bounded and finish >= stop.remaining()


def _capped(budget: int | None, cap: int) -> int | None:
    """A token budget tightened to ``cap`` (0: no cap)."""
    if not cap:
        return budget
    return cap if budget is None else min(int(budget), int(cap))


def _time_batches(
    cost_model: CostModel, bf: np.ndarray, bi: np.ndarray, it: np.ndarray, lo: int, hi: int, now: float
) -> float:
    """Durations (from the cost model) and starts of batches ``lo:hi``; the end of the last one.

    A batch starts when the previous one ends, or at the arrival the kernel idled to.
    """
    for b in range(lo, hi):
        a, z = bi[0, b], bi[0, b + 1]
        view = BatchView(it[1, a:z], it[2, a:z], it[3, a:z].astype(np.int8))
        duration = float(cost_model.batch_time(view))
        start = max(float(bf[0, b]), now)
        bf[0, b], bf[1, b] = start, duration
        now = start + duration
    return now


def _grow(
    bf: np.ndarray, bi: np.ndarray, it: np.ndarray, ev: np.ndarray, n: int, sc: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The log buffers the kernel ran out of, grown (:func:`~.log.with_room`; room for one more batch of
    every request)."""
    nbat, nit, nev = int(sc[3]), int(sc[4]), int(sc[5])
    bf = with_room(bf, nbat + 2)
    bi = with_room(bi, bf.shape[1] + 1)
    it = with_room(it, nit + n + 1)  # the kernel's next batch logs at most n items
    ev = with_room(ev, nev + n + 1)  # ... and evicts at most n holders
    return bf, bi, it, ev


def incumbent_of(
    instance: Instance,
    log: BatchLog,
    label: str,
    params: dict,
    objective: str,
    cost_model: CostModel,
    *,
    decide_s: float,
    replay_schedule: bool = True,
    build: bool = True,
    value: float | None = None,
) -> Incumbent | Unbuilt:
    """A producer's log as an :class:`Incumbent`: its schedule (``label`` and ``params`` as provenance),
    replayed through the core and valued on the replay, or, without ``replay_schedule``, valued on the
    log (:func:`log_value`, no trace). ``stats``: the seconds spent deciding (``decide_s``), building and
    replaying, and the batch and eviction counts. The greedy and the knapsack greedy both end here.
    Without ``build`` (and ``replay_schedule``) a finished log comes back :class:`Unbuilt`: valued on the
    log, its schedule built only if asked for. ``value``: the log's value where it is known already (an
    unbuilt run's, not read off the log twice)."""
    if not build and not replay_schedule and log.finished:
        t1 = time.perf_counter()
        value = log_value(instance, log, objective)
        stats = {"decide_s": decide_s, "value_s": time.perf_counter() - t1, "batches": log.num_batches}

        def built() -> Incumbent:
            made = incumbent_of(
                instance, log, label, params, objective, cost_model, decide_s=decide_s, replay_schedule=False,
                value=value,
            )  # fmt: skip
            assert isinstance(made, Incumbent)
            return made

        return Unbuilt(label, value, objective, stats, built)
    t1 = time.perf_counter()
    schedule = log.to_schedule({"policy": label, "params": params})
    t2 = time.perf_counter()
    cut: dict = {}
    if not log.finished:
        # Cut short for time: the requests left are finished against reserved peaks, each entry made and applied
        # by the core in the same replay (the schedule is the decided batches and then those).
        made: list[Batch | Run] = []

        def rest(state: EngineState) -> Iterator[Batch | Run]:
            cut["unfinished"] = state.n - state.num_done
            for entry in reserved_batches(state):
                made.append(entry)
                yield entry

        trace = replay(instance, schedule, cost_model, then=rest)
        label += "+reserved-batches"
        meta = {**schedule.meta, "policy": label, "completed_against_reserved_peaks": cut["unfinished"]}
        schedule = Schedule((*schedule.entries, *made), meta)
    elif replay_schedule:
        trace = replay(instance, schedule, cost_model)
    else:
        trace = None
    if trace is not None:
        value = objective_function(objective)(trace)
    elif value is None:
        value = log_value(instance, log, objective)
    stats = {
        "decide_s": decide_s,
        "build_s": t2 - t1,
        "replay_s": time.perf_counter() - t2,
        "batches": log.num_batches,
        "entries": len(schedule.entries),
        "evictions": log.num_evictions,
    }
    if cut:
        # The counts are the whole schedule's: the completion's batches and its evictions too.
        stats["batches"] = len(schedule)
        stats["evictions"] = schedule.num_evictions
        # The requests the greedy had not finished when it was cut short (the first schedule of a solve whose
        # limit a whole greedy run would overrun).
        stats["cut_for_time"] = cut["unfinished"]
    return Incumbent(label, schedule, value, objective, stats, trace)


def log_value(instance: Instance, log: BatchLog, objective: str) -> float:
    """The objective of a greedy log's schedule as the log itself says it (no replay).

    Request j generates its first token in the first item whose KV after the batch (context + tokens)
    reaches I_j, and its last in the first that reaches I_j + O_j - 1 (known tokens only grow to it at
    the final op, whether a decode, a prefill or a refill's last chunk); each completes at the end of
    that item's batch. Equal to the replay's value where the greedy's state mirrors the core's, which
    the tests check; the local search builds and replays the schedules it ends with.
    """
    data = ProblemData.of(instance)
    n, prompt, output, arrival = data.n, data.prompt, data.output, data.arrival
    ends = log.start + log.duration
    batch = np.repeat(np.arange(log.num_batches), np.diff(log.item_ptr))
    known = log.context + log.tokens
    target = prompt if objective == "sum-ttft" else prompt + output - 1
    hit = np.flatnonzero(known == target[log.requests])
    done = np.full(n, np.nan)
    reqs, first = np.unique(log.requests[hit], return_index=True)  # each request's first hit
    done[reqs] = ends[batch[hit[first]]]
    if objective == "makespan":
        return float(np.max(done)) if n else 0.0
    return float(np.sum(done - arrival))


@overload
def greedy(
    instance: Instance, rule: str = ..., *, build: Literal[True] = ..., **kwargs: Any
) -> Incumbent: ...
@overload
def greedy(instance: Instance, rule: str = ..., *, build: bool, **kwargs: Any) -> Incumbent | Unbuilt: ...


def greedy(
    instance: Instance,
    rule: str = "remaining-area",
    *,
    preempt: bool = True,
    priority: np.ndarray | None = None,
    scale: np.ndarray | None = None,
    lookahead: int = 0,
    refill_weight: float = 0.0,
    min_chunk: int = 0,
    fit_chunk: bool = False,
    fill: bool = False,
    token_cap: int = 0,
    running_cap: int = 0,
    objective: str = "total-latency",
    deadline: Deadline | None = None,
    cost_model: CostModel | None = None,
    jit: bool = True,
    name: str | None = None,
    replay_schedule: bool = True,
    stop: Deadline | None = None,
    build: bool = True,
) -> Incumbent | Unbuilt:
    """The greedy's schedule, replayed through the core, with its objective value.

    Parameters are those of :func:`decide`; ``objective`` names what ``value`` measures
    and ``name`` overrides the incumbent's name. ``stats`` holds the seconds spent
    deciding, building the schedule and replaying it, and the batch and eviction counts.
    ``replay_schedule=False`` skips the replay: ``value`` is then read off the greedy's own log
    (:func:`log_value`) and ``trace`` is None; with ``build=False`` as well the run comes back
    :class:`~kvsched.csp.incumbents.base.Unbuilt`, its schedule not built until asked for. The local
    search uses both for its candidates, and builds and replays only the ones it ends with.
    Where even a run in the cheapest mode is expected to take longer than what is left of
    ``deadline`` (:data:`CHEAP_SECONDS_PER_TOKEN`), it runs in that mode from the start.

    Raises
    ------
    ScheduleError
        If the core rejects a batch (a bug in the greedy, never a user error).
    """
    objective_function(objective)  # an unknown objective is refused before any work
    cost_model = cost_model if cost_model is not None else instance_cost_model(instance)
    t0 = time.perf_counter()
    if deadline is not None and deadline.bounded:
        # Where even a run in the cheapest mode is expected to overrun, every batch is decided that way:
        # a preempting start evicts more, and the replay (most of a run) grows with the evictions.
        tokens = int(ProblemData.of(instance).output.sum())
        if deadline.remaining() < CHEAP_SECONDS_PER_TOKEN * tokens:
            deadline = Deadline(time.monotonic(), deadline.limit)
    log = decide(
        instance,
        rule,
        preempt=preempt,
        priority=priority,
        scale=scale,
        lookahead=lookahead,
        refill_weight=refill_weight,
        min_chunk=min_chunk,
        fit_chunk=fit_chunk,
        fill=fill,
        token_cap=token_cap,
        running_cap=running_cap,
        deadline=deadline,
        cost_model=cost_model,
        jit=jit,
        stop=stop,
    )
    t1 = time.perf_counter()
    label = name or (
        ("greedy:priority" if priority is not None else f"greedy:{rule}")
        + ("" if preempt else "/no-preempt")
        + (f"/lookahead={lookahead}" if lookahead else "")
        + (f"/refill-weight={refill_weight:g}" if refill_weight else "")
        + (f"/min-chunk={min_chunk}" if min_chunk else "")
        + ("/fit-chunk" if fit_chunk else "")
        + ("/fill" if fill else "")
        + (f"/token-cap={token_cap}" if token_cap else "")
        + (f"/running-cap={running_cap}" if running_cap else "")
    )
    params = {"rule": rule, "preempt": preempt, "lookahead": lookahead}
    if refill_weight or min_chunk or fit_chunk:  # the original three alone where these are off
        params.update(refill_weight=float(refill_weight), min_chunk=int(min_chunk), fit_chunk=bool(fit_chunk))
    if fill:
        params.update(fill=True)
    if token_cap:
        params.update(token_cap=int(token_cap))
    if running_cap:
        params.update(running_cap=int(running_cap))
    return incumbent_of(
        instance, log, label, params, objective, cost_model, decide_s=t1 - t0, replay_schedule=replay_schedule,
        build=build,
    )  # fmt: skip
