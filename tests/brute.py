"""An independent brute force: the optimum of a tiny instance by Dijkstra over engine states.

It knows nothing of the solvers' models: every transition is judged by the semantic core. The
solver tests, the bound tests and the certificate tests compare against it.
"""

import copy
import dataclasses
import heapq
import itertools
from collections import Counter

import numpy as np

from kvsched.instances.model import Instance, Request
from kvsched.schedule.core import EngineState
from kvsched.schedule.ir import Phase
from kvsched.schedule.validate import instance_cost_model


def brute_force(instance: Instance, objective: str, allow_eviction: bool = True) -> float:
    """The optimum of :func:`_brute_force`, computed once per instance, objective and class in a test run.

    Many tests ask for the same optimum (a certificate and the every-schedule bound of the same draw, the same
    budget trio under the same cost model in several files): the search is pure, so its answer is reused.
    The key is what decides the optimum: the requests and limits (frozen, compared field by field, floats
    exactly) and the time model (its parameters' repr: a dict). Not the instance's repr, which is a summary.
    """
    tm = instance.time_model
    key = (tuple(instance.requests), instance.limits, tm.name, repr(tm.params), objective, allow_eviction)
    if key not in _OPTIMA:
        _OPTIMA[key] = _brute_force(instance, objective, allow_eviction)
    return _OPTIMA[key]


_OPTIMA: dict[tuple, float] = {}


def _brute_force(
    instance: Instance, objective: str, allow_eviction: bool = True, verify_skips: Counter | None = None
) -> float:
    """Optimum by Dijkstra over engine states; every transition is judged by the semantic core.

    From each state: idle until the next arrival, or run any batch (any evictions of requests
    holding KV, any 1..unprocessed tokens for any subset of arrived unfinished requests) that
    ``EngineState.check`` accepts. Edge cost: the objective's growth over the edge's time.

    A candidate whose totals (summed from the state's public counters) break a batch-wide budget by the core's
    own rule (``EngineState.breaks_limits``: tokens over C, prefill and refill tokens over P, holders over
    max_running, KV blocks over M) is not even built:
    every batch the core rejected in the suite's slowest searches broke one of these, and building, pushing
    and wording (the full check) those rejections was most of the time. Skipping is no verdict of legality:
    every batch kept is still judged by the core, and the kept edges are pushed and popped in the same order
    as before (only the skipped ones, each rejected when popped, are gone). ``verify_skips`` builds each
    skipped candidate, asserts that the core rejects it too and counts the rules it breaks there
    (tests/test_brute.py).

    A batch is checked and applied when its edge leaves the heap, not when it enters: the pops are the same,
    in the same order (ticks still increase with every push), but the many edges that cost more than the
    optimum are never checked nor applied (most of the time went there).
    """
    state0 = EngineState(instance, instance_cost_model(instance))
    n, arrival = state0.n, state0.arrival
    block_size = state0.block_size

    def blocks(tokens: int) -> int:
        return -(-tokens // block_size)

    a_max = float(arrival.max())
    # Requests equal in every field but the id are interchangeable (the rules and the objectives never read
    # an id): states that differ only by a permutation of such twins have the same optimum from there on,
    # so the key lists each set of twins' (generated, KV, refilling) sorted.
    by_id = {r.id: r for r in instance.requests}
    twins: dict[Request, list[int]] = {}
    for pos, rid in enumerate(state0.ids):
        twins.setdefault(dataclasses.replace(by_id[rid], id=""), []).append(pos)
    groups = [g for g in twins.values() if len(g) > 1]

    def key_of(s: EngineState, t: float) -> tuple:
        key = (s.generated.tobytes(), s.kv.tobytes(), s.refilling.tobytes(), min(t, a_max))
        if not groups:
            return key
        twin_states = [
            sorted((int(s.generated[i]), int(s.kv[i]), bool(s.refilling[i])) for i in g) for g in groups
        ]
        generated, kv, refilling = s.generated.copy(), s.kv.copy(), s.refilling.copy()
        for g, states in zip(groups, twin_states, strict=True):
            for i, (gen, held, refill) in zip(g, states, strict=True):
                generated[i], kv[i], refilling[i] = gen, held, refill
        return (generated.tobytes(), kv.tobytes(), refilling.tobytes(), min(t, a_max))

    tick = itertools.count()
    heap = [(0.0, next(tick), 0.0, state0, None)]
    seen: dict[tuple, float] = {}
    while heap:
        dist, _, t, s, batch = heapq.heappop(heap)
        if batch is not None:  # the edge from s that runs ``batch``: taken only if the core accepts it
            # EngineState.__copy__: every array copied; the parent stays as it was. check_and_apply is
            # check then apply (the validator's step), applying with the reads of the core's quick path.
            s = copy.copy(s)
            if s.check_and_apply(batch)[0]:
                continue
        if s.all_done:
            return dist
        key = key_of(s, t)
        if seen.get(key, np.inf) <= dist:
            continue
        seen[key] = dist
        waiting = {"total-latency": ~s.done, "sum-ttft": s.generated == 0}.get(objective)

        grown: dict[tuple[float, float], float] = {}

        def cost(t0: float, t1: float, waiting=waiting, grown=grown) -> float:
            # Batches from one state often end at the same time (unit time: all): each growth computed once.
            if waiting is None:
                return t1 - t0
            if (t0, t1) not in grown:
                grown[t0, t1] = float(np.clip(t1 - np.maximum(t0, arrival[waiting]), 0, None).sum())
            return grown[t0, t1]

        later = arrival[arrival > t + 1e-9]
        if later.size:
            heapq.heappush(
                heap, (dist + cost(t, float(later.min())), next(tick), float(later.min()), s, None)
            )
        kv = s.kv.tolist()
        holders = [i for i in range(n) if kv[i] > 0]
        decoding = (s.phase_of(np.arange(n)) == Phase.DECODE).tolist()
        ev_sets = [()]
        if allow_eviction:
            ev_sets = [e for r in range(len(holders) + 1) for e in itertools.combinations(holders, r)]
        for ev in ev_sets:
            # Per request, each token count with what it adds to the batch's totals: (tokens, prefill
            # tokens, new holders, grown blocks). An evicted request is not processed, so the others keep
            # their phases and KV.
            opts = [
                [(0, 0, 0, 0)]
                if (s.done[i] or arrival[i] > t + 1e-9 or i in ev)
                else [
                    (k, 0 if decoding[i] else k, int(k > 0 and kv[i] == 0), blocks(kv[i] + k) - blocks(kv[i]))
                    for k in range(int(s.prompt[i] + s.generated[i] - kv[i]) + 1)
                ]
                for i in range(n)
            ]
            # The requests holding KV and the KV blocks held once ``ev`` is evicted.
            holding = s.num_holding - len(ev)
            held_blocks = s.kv_blocks - sum(blocks(kv[i]) for i in ev)
            for items in itertools.product(*opts):
                toks = [k for k, _, _, _ in items]
                req = [i for i in range(n) if toks[i]]
                if not req:
                    continue
                tokens, prefill, new, grown = map(sum, zip(*items, strict=True))
                if s.breaks_limits(tokens, prefill, holding + new, held_blocks + grown):
                    if verify_skips is not None:
                        skipped = s.make_batch(t, req, [toks[i] for i in req], list(ev))
                        violations = s.check(skipped)
                        assert violations, f"skipped a batch the core accepts: {skipped}"
                        verify_skips.update({v.rule for v in violations})
                    continue
                b = s.make_batch(t, req, [toks[i] for i in req], list(ev))
                d = dist + cost(t, b.end)
                if not np.isfinite(d):
                    # Only an illegal batch has a NaN or infinite end (a NaN would break the heap's order);
                    # every other edge is checked by the core when it leaves the heap.
                    continue
                heapq.heappush(heap, (d, next(tick), b.end, s, b))
    return np.inf


def contiguous_brute_force(instance: Instance, objective: str) -> float:
    """Optimum over the time-indexed class (each request served without a break) by enumerating
    every vector of start slots up to the sequential horizon; each schedule judged by the core."""
    from kvsched.csp.objectives import OBJECTIVES
    from kvsched.csp.timeindexed import TimeIndexed
    from kvsched.schedule.core import ScheduleError
    from kvsched.schedule.validate import replay

    ti = TimeIndexed(instance, objective)
    span = int(ti.output.sum()) + 1
    best = np.inf
    for starts in itertools.product(*[range(int(e), int(e) + span) for e in ti.earliest]):
        try:
            schedule = ti.schedule_of(np.array(starts))
        except ScheduleError:
            continue
        best = min(best, OBJECTIVES[objective](replay(instance, schedule)))
    return best
