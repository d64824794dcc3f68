"""Mean-busy-time bounds (Goemans 1996; Queyranne 1993) under the unit time model.

The argument (docs/bounds.md, ``shared/notes/005`` Sec. 3.1)
-----------------------------------------------------------
Under unit time every batch lasts one slot, so batches starting at s_1 < s_2 <
... are at least one slot apart and ``floor(s_k)`` are distinct integers (the
*slots*); a batch may hold request j only if ``s_k >= a_j``, so its slot is
``>= floor(a_j)``. Let ``t_u`` be the slot in which request j generates its
u-th token (u = 1..O). That batch holds at least ``w_u = I + u - 1`` KV tokens
of j (rounded up to blocks), the later tokens need distinct later slots, so
``C_j >= t_u + (O - u) + 1`` for every u. Any convex combination of these holds
too: with weights ``w_u / A_j`` (``A_j = sum_u w_u``)::

    C_j >= MB_j + delta_j,   MB_j = sum_u w_u t_u / A_j,   delta_j = sum_u w_u (O - u + 1) / A_j.

Per slot the held KV is at most M, so the ``w_u`` placed in each slot sum to at
most M. Dropping the chain order and letting work split freely gives a
transportation problem, ``min sum_j MB_j``, whose optimum (exchange argument:
moving work of a job with smaller A earlier never hurts) fills the slots in
smallest-A order, preemptively at release dates ``floor(a_j)``. Chunked
prefills, pauses, evictions and refills only add KV to slots, so the bound holds
for every legal schedule.

The same argument works for any per-slot resource and for mixtures of them:
the token budget C (request j processes at least its I prompt tokens in slots
``<= t_1`` and one token in each ``t_u``, u >= 2), the prefill budget P (its I
prompt tokens, all in slots ``<= t_1``), and ``lambda``-combinations whose
per-slot load ``sum_r lambda_r * used_r / cap_r`` is at most 1.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from kvsched.instances.model import Instance
from kvsched.stop import Deadline

#: Shares of (memory, token budget, prefill budget) tried for the mixed machine: the pure
#: resources and an even mixture (the bound holds for each; the portfolio keeps the largest).
MIXTURES = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (0.5, 0.5, 0.0))


def _slotted_integral(x: np.ndarray) -> np.ndarray:
    """G(x) = integral of floor(s) ds from 0 to x (x >= 0): the slot index averaged over machine time."""
    q = np.floor(x)
    return q * (q - 1.0) / 2.0 + q * (x - q)


def _continuous_integral(x: np.ndarray) -> np.ndarray:
    return x * x / 2.0


def _slotted_scalar(x: float) -> float:
    q = math.floor(x)
    return q * (q - 1.0) / 2.0 + q * (x - q)


def _continuous_scalar(x: float) -> float:
    return x * x / 2.0


def preemptive_mean_busy(
    work: np.ndarray, release: np.ndarray, *, slotted: bool, deadline: Deadline | None = None
) -> np.ndarray:
    """Each job's mean busy time in the preemptive smallest-work-first schedule on a unit-rate machine.

    This schedule minimises ``sum_j MB_j`` over all preemptive schedules with
    release dates (Goemans: preemptive WSPT with weights 1 and processing times
    ``work``; static priority, preemption only at releases), in O(n log n).

    Parameters
    ----------
    work
        Processing time of each job (> 0; a job of work 0 gets ``MB = release``).
    release
        Release dates (integers when ``slotted``).
    slotted
        Machine time ``[t, t + 1)`` is slot t and work there counts at t (the
        slot's start) rather than at its own position.
    deadline
        Checked every few thousand events; :class:`~kvsched.stop.DeadlineReached` once it has passed.
    """
    out = release.astype(np.float64).copy()
    idx = np.flatnonzero(work > 0)
    if not idx.size:
        return out
    # Times count from the first release (a whole slot when slotted, where floor(v + o) = floor(v) + o): the
    # integrals below difference squares of times, and of absolute times near 1e6 that left the seconds bound
    # at 0.0147 s for a request whose first token takes 0.0058 s (arrival 1e6 + 1).
    origin = float(np.floor(release[idx].min()) if slotted else release[idx].min())
    w, r = work[idx], release[idx] - origin
    if np.all(r == r[0]):  # everything at once: consecutive intervals in smallest-work order
        integral = _slotted_integral if slotted else _continuous_integral
        order = np.argsort(w, kind="stable")
        ends = r[0] + np.cumsum(w[order])
        starts = ends - w[order]
        mean = np.empty(idx.size)
        mean[order] = (integral(ends) - integral(starts)) / w[order]
        out[idx] = mean + origin
        return out
    g = _slotted_scalar if slotted else _continuous_scalar
    acc, _ = _preemptive(w, r, g, by_remaining=False, deadline=deadline)
    out[idx] = acc / w + origin
    return out


def srpt_completions(work: np.ndarray, release: np.ndarray, deadline: Deadline | None = None) -> np.ndarray:
    """Completion times of preemptive shortest-remaining-work-first on a unit-rate machine, sorted.

    SRPT completes at least as many jobs by every time as any preemptive schedule
    with these release dates (Schrage 1968), so its k-th completion is a lower
    bound on the k-th completion of every such schedule.
    """
    if np.all(release == release[0]):
        return release[0] + np.cumsum(np.sort(work))
    _, done = _preemptive(work, release, _continuous_scalar, by_remaining=True, deadline=deadline)
    return np.sort(done)


def mean_busy_dual(area: np.ndarray, release: np.ndarray, capacity: float, horizon: int) -> np.ndarray:
    """The mean-busy-time LP's capacity prices at the slot midpoints ``t + 0.5``, ``t < horizon``.

    The LP: jobs of area ``A_j`` released at ``r_j`` on a divisible machine of ``capacity`` area per
    unit of time; a unit of j's area at time t costs ``t / A_j`` (so a job's cost is its mean busy
    time); minimise the sum. The preemptive smallest-area-first schedule solves it (Goemans), and its
    dual prices follow by complementary slackness, backwards over the schedule's pieces: ``y`` is 0
    where the machine idles and at the end of each busy period, and on a piece of job j it is
    ``v_j - t / A_j``, with ``v_j = y(C_j) + C_j / A_j`` fixed at j's completion (``y`` continuous
    there: the next piece starts when j ends). So ``y`` falls by ``1 / capacity`` over each job's
    work: about the busy period's later completions over the capacity.

    Any ``y >= 0`` is a valid multiplier of a Lagrangian bound; these are the ones under which the
    chain Lagrangian (:mod:`kvsched.csp.bounds.chain`, whose relaxation contains this LP's
    constraints) starts at about the mean-busy-time bound.
    """
    area = np.asarray(area, dtype=np.float64)
    out = np.zeros(horizon)
    live = np.flatnonzero(area > 0)
    if not live.size or horizon <= 0:
        return out
    pieces: list[tuple[int, float, float]] = []
    a, rel = area[live], np.asarray(release, dtype=np.float64)[live]
    _preemptive(a / capacity, rel, _continuous_scalar, by_remaining=False, pieces=pieces)
    job = np.array([p[0] for p in pieces], dtype=np.int64)
    start = np.array([p[1] for p in pieces])
    end = np.array([p[2] for p in pieces])
    value = np.full(a.size, np.nan)
    right, after = 0.0, math.inf  # y just after the current piece; where the next piece starts
    for p in range(len(pieces) - 1, -1, -1):
        k = job[p]
        if end[p] < after - 1e-9:
            right = 0.0  # the machine idles after this piece: a busy period ends here
        if np.isnan(value[k]):  # k's last piece ends at its completion
            value[k] = right + end[p] / a[k]
        right, after = value[k] - start[p] / a[k], start[p]
    mid = np.arange(horizon) + 0.5
    at = np.searchsorted(start, mid, side="right") - 1
    inside = (at >= 0) & (mid < end[np.maximum(at, 0)])
    k = job[np.maximum(at, 0)]
    out[inside] = np.maximum(0.0, value[k] - mid / a[k])[inside]
    return out


def _preemptive(
    work: np.ndarray,
    release: np.ndarray,
    g,
    *,
    by_remaining: bool,
    deadline: Deadline | None = None,
    pieces: list[tuple[int, float, float]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One preemptive schedule (event loop over releases): per job the integral of ``g``'s
    derivative over its pieces, and its completion time. Priority: the job's work, or its
    remaining work when ``by_remaining``; ties by release. ``pieces`` (if given) receives each
    piece of machine time as (job, start, end), in time order."""
    order = np.lexsort((work, release))
    rel = release[order].tolist()
    wk = work[order].tolist()
    n = len(rel)
    acc = [0.0] * n
    done = [0.0] * n
    heap: list[tuple[float, int, float]] = []
    t = rel[0]
    i = 0
    push, pop = heapq.heappush, heapq.heappop
    events = 0
    while i < n or heap:
        events += 1
        if deadline is not None and not events & 4095:
            deadline.check()
        if not heap:
            t = max(t, rel[i])
        while i < n and rel[i] <= t:
            push(heap, (wk[i], i, wk[i]))
            i += 1
        key, k, rem = pop(heap)
        nxt = rel[i] if i < n else math.inf
        end = t + rem
        if end <= nxt:
            acc[k] += g(end) - g(t)
            done[k] = end
            if pieces is not None:
                pieces.append((int(order[k]), t, end))
            t = end
        else:
            acc[k] += g(nxt) - g(t)
            rem -= nxt - t
            push(heap, (rem if by_remaining else key, k, rem))
            if pieces is not None and nxt > t:
                pieces.append((int(order[k]), t, nxt))
            t = nxt
    out_acc, out_done = np.empty(n), np.empty(n)
    out_acc[order] = acc
    out_done[order] = done
    return out_acc, out_done


@dataclass(frozen=True, slots=True)
class RequestArrays:
    """The per-request quantities every unit-time MBT bound uses (in slots and tokens)."""

    arrival: np.ndarray  # in slots (a / slot)
    prompt: np.ndarray
    output: np.ndarray
    area: np.ndarray  # A_j = sum_u w_u, w_u = I + u - 1 rounded up to blocks
    area_tail: np.ndarray  # sum_u w_u (O - u + 1)
    first_kv: np.ndarray  # w_1
    capacity: float  # M in tokens of whole blocks
    alone: np.ndarray  # completion alone, in slots: a + max(1, ceil(I / min(C, P))) + O - 1

    @classmethod
    def of(cls, instance: Instance, slot: float = 1.0) -> RequestArrays:
        lim = instance.limits
        reqs = instance.requests
        prompt = np.array([r.prompt for r in reqs], dtype=np.float64)
        output = np.array([r.output for r in reqs], dtype=np.float64)
        arrival = np.array([r.arrival for r in reqs], dtype=np.float64) / slot
        block = lim.block_size
        if block == 1:  # closed forms: sum_{u=1}^{O} (I + u - 1) and sum_u (I + u - 1)(O - u + 1)
            area = output * prompt + output * (output - 1) / 2
            o = output
            area_tail = prompt * o * (o + 1) / 2 + (o - 1) * o * (o + 1) / 6
            first_kv = prompt
        else:  # w(S) = S rounded up to blocks, summed over S = I .. I + O - 1 by prefix sums over S
            top = int((prompt + output).max())
            grid = np.arange(top + 1, dtype=np.float64)
            w = np.ceil(grid / block) * block
            cum_w = np.concatenate([[0.0], np.cumsum(w)])
            cum_sw = np.concatenate([[0.0], np.cumsum(grid * w)])
            lo, hi = prompt.astype(np.int64), (prompt + output).astype(np.int64)  # S in [lo, hi)
            area = cum_w[hi] - cum_w[lo]
            # token u has S = I + u - 1 and weight O - u + 1 = I + O - S
            area_tail = (prompt + output) * area - (cum_sw[hi] - cum_sw[lo])
            first_kv = np.ceil(prompt / block) * block
        chunk = min(
            (c for c in (lim.max_batch_tokens, lim.max_prefill_tokens) if c is not None), default=math.inf
        )
        alone = arrival + np.maximum(1.0, np.ceil(prompt / chunk)) + output - 1
        return cls(arrival, prompt, output, area, area_tail, first_kv, float(lim.kv_blocks * block), alone)


@dataclass(frozen=True, slots=True)
class MachineJobs:
    """Jobs on the mixed machine of capacity 1 per slot: load, weighted tail, release slot."""

    load: np.ndarray
    tail: np.ndarray  # delta_j * load_j: sum over pieces of load x tail
    release: np.ndarray


def completion_jobs(req: RequestArrays, mix: tuple[float, float, float], caps: tuple) -> MachineJobs | None:
    """The machine jobs whose mean busy time plus delta bounds each completion (None if a share has no resource)."""
    lam_m, lam_c, lam_p = mix
    _, c_cap, p_cap = caps
    if (lam_c and c_cap is None) or (lam_p and p_cap is None):
        return None
    i, o = req.prompt, req.output
    load = lam_m * req.area / req.capacity
    tail = lam_m * req.area_tail / req.capacity
    if lam_c:
        # I prompt tokens (tail O each) and one token at each of t_2..t_O (tail O - u + 1).
        load = load + lam_c * (i + o - 1) / c_cap
        tail = tail + lam_c * (i * o + o * (o - 1) / 2) / c_cap
    if lam_p:
        load = load + lam_p * i / p_cap
        tail = tail + lam_p * i * o / p_cap
    return MachineJobs(load, tail, np.floor(req.arrival))


def first_token_jobs(req: RequestArrays, mix: tuple[float, float, float], caps: tuple) -> MachineJobs | None:
    """Jobs bounding each first-token time: w_1 at t_1 and the I prompt tokens in slots <= t_1 (tail 1)."""
    lam_m, lam_c, lam_p = mix
    _, c_cap, p_cap = caps
    if (lam_c and c_cap is None) or (lam_p and p_cap is None):
        return None
    load = lam_m * req.first_kv / req.capacity
    if lam_c:
        load = load + lam_c * req.prompt / c_cap
    if lam_p:
        load = load + lam_p * req.prompt / p_cap
    return MachineJobs(load, load.copy(), np.floor(req.arrival))


def mbt_sum(jobs: MachineJobs, deadline: Deadline | None = None) -> float:
    """``sum_j (MB_j + delta_j)`` with MB from the slotted preemptive smallest-load-first schedule."""
    mean = preemptive_mean_busy(jobs.load, jobs.release, slotted=True, deadline=deadline)
    delta = np.divide(jobs.tail, jobs.load, out=np.ones_like(jobs.load), where=jobs.load > 0)
    return float((mean + delta).sum())


def slotted_area(jobs: MachineJobs, deadline: Deadline | None = None) -> np.ndarray:
    """Sorted lower bounds on the completions, in slots: SRPT's completions on the mixed machine, rounded up.

    Request j completes at ``C_j >= floor(s) + 1`` where s is the start of its last batch, and its whole
    load lies in slots up to ``floor(s)``: on the relaxed machine it is done by the integer ``floor(s) + 1``.
    SRPT completes at least as many jobs by every time, so the k-th smallest ``floor(s) + 1`` is at
    least SRPT's k-th completion, rounded up.
    """
    return _ceil(srpt_completions(jobs.load, jobs.release, deadline))


def _ceil(x: np.ndarray) -> np.ndarray:
    # Float sums that should land on an integer may overshoot it by a few ulps: never round those up a slot.
    return np.ceil(x - 1e-9 * np.maximum(1.0, np.abs(x)))


def slotted_makespan(jobs: MachineJobs) -> float:
    """Makespan bound in slots: ``max_r r + ceil(sum of loads released at or after r)``."""
    order = np.argsort(-jobs.release, kind="stable")
    rel = jobs.release[order]
    suffix = np.cumsum(jobs.load[order])
    return float(np.max(rel + _ceil(suffix)))


def budgets(instance: Instance) -> tuple[float, float | None, float | None]:
    lim = instance.limits
    return (float(lim.kv_blocks * lim.block_size), lim.max_batch_tokens, lim.max_prefill_tokens)
