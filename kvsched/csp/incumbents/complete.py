"""Finish every unfinished request against reserved peaks: the completion of a schedule cut short for time.

A greedy run on a very large instance (100,000 requests, tens of millions of output tokens) can take
longer than a solve's whole time limit, and the greedy cannot leave a complete schedule halfway. Where
its run would overrun (:func:`~kvsched.csp.incumbents.greedy.decide`'s ``stop``), the batches it decided
are kept and the requests it left are finished by :func:`reserved_batches`, whose cost is a few core steps
per request instead of one item per generated token. Its schedule is poorer than the greedy's (each
running request holds the memory of its peak from its admission on, so fewer run at once, and decodes
pause while admitted prompts run), but it is legal and complete within the limit, and the certified gap
says how poor.

Every entry is made by the semantic core from the state the kept batches leave
(:meth:`~kvsched.schedule.core.EngineState.make_batch`, :meth:`~kvsched.schedule.core.EngineState.plan_run`
and :meth:`~kvsched.schedule.core.EngineState.make_run`), and :func:`~kvsched.schedule.validate.replay`
checks and applies each one as it comes.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

import numpy as np

from kvsched.schedule.core import EngineState
from kvsched.schedule.ir import Batch, Phase, Run

#: What completing one request costs, in items of the kept batches' replay (timed on the batches decided
#: so far: :func:`~kvsched.csp.incumbents.greedy.decide`), a high estimate. At 100,000 ShareGPT requests at
#: memory load 1 the completion took 262-330 us a request (1.7 entries each) where that replay took 2.4 us
#: an item: 110-140 items.
ITEMS_PER_REQUEST = 150.0
#: Seconds completing one request costs, a high estimate for callers that have no replay to time it by (a
#: policy's simulation cut for time): 294 us a request at 10k Azure conversation requests under the A100
#: fit (35k entries), 262-330 us at 100k ShareGPT requests under unit time, on an idle 2-core machine.
SECONDS_PER_REQUEST = 6e-4
_DECODE = int(Phase.DECODE)
_NONE = np.zeros(0, dtype=np.int64)
_NONE.setflags(write=False)


def reserved_batches(state: EngineState) -> Iterator[Batch | Run]:
    """The entries that finish every unfinished request of ``state``, admitted against their peaks.

    A request is admitted while the KV of its peak (I + O - 1, in blocks) fits beside the peaks of those
    admitted before it and ``max_running`` allows, so no admitted request can run out of memory before it
    completes (each request alone fits every feasible instance:
    :meth:`~kvsched.instances.model.Instance.check_feasible`). Among the requests that have arrived by
    the engine's clock, those with the fewest tokens left to process (prompt or refill tokens, then
    decodes) go first (shortest first minimises total latency on one machine); when none has arrived and
    none runs, the engine idles to the next arrival. The admitted requests' prompts (or refills) run
    first, packed into batches of at most the token budgets, then every admitted request decodes in one
    run until the next completion, where admission is tried again. The first entry evicts every request
    holding KV that the first admission leaves out.

    The entries are made from ``state`` as it is when each is asked for: the caller applies each one
    before asking for the next (:func:`~kvsched.schedule.validate.replay`'s ``then``).
    """
    limits = state.instance.limits
    budgets = [b for b in (limits.max_batch_tokens, limits.max_prefill_tokens) if b is not None]
    budget = int(min(budgets)) if budgets else None
    most = limits.max_running or state.n
    pending = np.flatnonzero(~state.done)
    # Requests by arrival; those arrived wait in a heap by tokens left (prompt or refill, plus decodes).
    order = pending[np.argsort(state.arrival[pending], kind="stable")].tolist()
    left = state.unprocessed(pending) + state.output[pending] - state.generated[pending]
    work = dict(zip(pending.tolist(), left.tolist(), strict=True))
    peaks = state.data.blocks(state.data.peak[pending])  # the instance's own peaks, I + O - 1, in blocks
    peak = dict(zip(pending.tolist(), peaks.tolist(), strict=True))
    evict = np.flatnonzero(state.kv > 0)
    ready: list[tuple[int, int]] = []
    running = _NONE  # the requests decoding, in the order of the last run
    room = state.kv_block_capacity
    seen = state.num_done  # completions already known
    nxt = 0
    while nxt < len(order) or ready or running.size:
        clock = state.clock
        if not ready and not running.size:  # idle to the next arrival
            clock = max(clock, float(state.arrival[order[nxt]]))
        while nxt < len(order) and state.arrival[order[nxt]] <= clock:
            heapq.heappush(ready, (work[order[nxt]], order[nxt]))
            nxt += 1
        admitted: list[int] = []
        while ready and running.size + len(admitted) < most and peak[ready[0][1]] <= room:
            _, j = heapq.heappop(ready)
            admitted.append(j)
            room -= peak[j]
        ev = evict
        if evict.size:  # (the first admission only)
            ev, evict = evict[~np.isin(evict, admitted)], _NONE
        members = running
        if admitted:
            yield from _prompts(state, admitted, budget, clock, ev)
            fresh = [j for j in admitted if not state.done[j]]
            members = np.concatenate((running, np.array(fresh, dtype=np.int64))) if fresh else running
        if members.size:
            members.setflags(write=False)
            k, _ = state.plan_run(members)
            yield state.make_run(state.clock, members, k)
            left = state.left_decoding()  # the core's own answer: the members that did not complete
            running = _NONE if left is None else left
        for j in state.completed_since(seen):
            room += peak[j]
        seen = state.num_done


def _prompts(
    state: EngineState, admitted: list[int], budget: int | None, clock: float, evicted: np.ndarray
) -> Iterator[Batch]:
    """The admitted requests' prompt or refill tokens, packed in order into batches of at most ``budget``
    tokens, the first batch evicting ``evicted`` (with the first request's decode where none has prompt
    tokens left). A request's prompt is done once its tokens left have run (the core checks each batch)."""
    requests = np.array(admitted, dtype=np.int64)
    # (A request's phase after the evictions is the state's: no admitted request is evicted.)
    prompt = state.phase_of(requests) != _DECODE
    todo = list(zip(requests[prompt].tolist(), state.unprocessed(requests[prompt]).tolist(), strict=True))
    if not todo:
        if evicted.size:
            yield state.make_batch(clock, admitted[:1], [1], evicted)
        return
    while todo:
        batch, tokens, rest, room = [], [], [], budget
        for j, need in todo:
            take = need if room is None else min(need, room)
            if take:
                batch.append(j)
                tokens.append(take)
                if room is not None:
                    room -= take
            if need > take:
                rest.append((j, need - take))
        yield state.make_batch(clock, batch, tokens, evicted)
        clock, evicted, todo = state.clock, evicted[:0], rest
