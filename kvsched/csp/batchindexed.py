"""The batch-indexed formulation: chunked prefill, eviction and arrivals (seed 003 Sec. 5, corrected).

Schedule class: **every legal schedule** of an instance with ``block_size`` 1,
under the ``unit`` or ``infermax-linear`` cost model: any chunking, pauses,
evictions (preemption by recompute; switch off with ``allow_eviction=False``),
hybrid batches and idling until arrivals. Its optimum is the true hindsight
optimum, not the optimum of a restricted class.

Variables (request i, batch j = 1..J; index 0 is the initial state, fixed)
-------------------------------------------------------------------------
``c[i,j]`` tokens processed; ``g`` generates a token; ``G`` tokens generated
after j (S = I + G); ``d`` done after j; ``e`` evicted just before j; ``mb``
KV held before j once evictions applied; ``m`` KV held after j (after the
completion release); ``u_j`` batch j is non-empty. With ``a = I + G[j-1] - mb``
the unprocessed tokens:

* ``c <= a``; ``g = 1 => c = a`` and ``g = 0 => c <= a - 1`` (both directions:
  the invariant ``S - m >= 1`` of every unfinished request, seed 003 A4.2 #2);
* ``G[j] = G[j-1] + g``, ``O d <= G <= O - 1 + d``, ``G[J] = O``;
* ``d[j-1] => c = 0, g = 0``; ``d[j] = 0 => m = mb + c`` and ``d[j] = 1 => m = 0``
  (the KV is released after the batch that completes, A4.2 #1);
* ``e => mb = 0, c = 0`` (the core forbids evicting and processing in one batch),
  ``e = 0 => mb = m[j-1]``, ``e <= m[j-1]`` (only requests holding KV), ``e <= u_j``;
* KV **during** the batch: ``sum_i (mb + c) <= M`` (held plus appended, before
  completions release); ``sum_i c <= C u_j``, ``u_j <= sum_i c``, ``u_j >= u_{j+1}``
  (empty batches last); ``max_running``: ``mb + c <= U eta``, ``sum_i eta <= R``;
* phase (when P binds or the cost model has phase terms): decode ``delta`` iff
  the item is present, the request generated before (``H = [G >= 1]``) and is
  not refilling; refilling ``rho[j] = (e[j] and H[j-1]) or (rho[j-1] and not
  g[j-1])`` exactly as the core derives it (A4.2 #4), and
  ``sum_i (c - delta) <= P``;
* time: start ``tau_j``, end ``E_j = tau_j + dur_j``, ``tau_{j+1} >= E_j``
  (idling allowed, A4.2 #6); ``alpha[i,j] => tau_j >= arrival_i`` and
  ``c <= cap alpha`` (arrived by the batch's *start*).

Durations are linear in the variables: ``unit`` gives ``dur_j = u_j``.
``infermax-linear`` gives ``a0 u + a1 sum c + b0 v + b1 sum w + p0 z + p1 sum Q +
p2 sum Y + p3 sum pi`` with ``pi = x - delta`` (prefill/refill item),
``w = delta mb`` (McCormick, exact for a binary times a bounded integer),
``Y >= pi mb``, batch flags ``v >= delta``, ``z >= pi``, and
``Q = c^2 + 2 mb c - delta (1 + 2 mb)``: ``c`` is binary-expanded,
``c = sum_b 2^b beta_b``, and ``c (c + 2 mb) = sum_b 2^b beta_b (c + 2 mb)``, each
product bounded below (A4.3); every cost coefficient is >= 0 and a longer
batch never helps, so lower bounds are exact at an optimum.

Objectives, in the cost model's time unit (slots for ``unit``): total latency
``sum_i (F_i - arrival_i)`` with ``d[i,j-1] = 0 => F_i >= E_j`` (request i is
unfinished when batch j starts, so it completes no earlier than batch j ends);
makespan ``E_J``; sum of TTFT with ``H[i,j-1] = 0 => T1_i >= E_j``. When every
request arrives at once under unit time, idling never helps and the batches run
back to back: then ``F_i - arrival = sum_j (1 - d[i,j-1])`` with no time
variables at all. (Throughput, tokens per second, is fixed work over the
makespan: minimising the makespan maximises it.)

Horizon (A4.2 #5)
-----------------
The heuristic's batch count is *not* a bound for a better schedule (a better
one may use more, smaller batches). Every batch lasts at least ``t_min`` (1 slot
under unit time) and batches do not overlap, so J is derived from an upper bound
UB on the objective (the best heuristic schedule's, replayed):

* makespan: every batch lies in ``[min arrival, UB]``: ``J <= (UB - a_min) / t_min``;
* total latency: a batch serving request i lies in ``[a_i, F_i]``, so the batches
  cover at most ``sum_i (F_i - a_i) <= UB`` time. Also ``F_i <= UB + sum_k a_k -
  sum_{k != i} F_k``, and the others' completions sum to at least both
  ``sum_{k != i} (a_k + lb_k)`` (``lb_k`` the isolated service time) and the sum
  of the n - 1 smallest entries of the sorted-completion bound (isolated service
  and KV area, as in :mod:`kvsched.csp.bounds`). That deadline bounds every
  request's completion, hence J and, per request, the batch by which it is done
  (``d`` fixed to 1 from there, ``G >= O - (deadline batch - j)``);
* sum of TTFT: the same deadline argument for first tokens bounds the batches up
  to the last first token; after it, any remaining work can be finished in at
  most ``sum_i (I_i + O_i - 1)`` more batches (without eviction every batch
  processes at least one new token; with eviction, keep one request, evict the
  rest and serve them one at a time), and what happens after the last first
  token does not change the objective.

J is at least the warm start's batch count (it has objective UB). Empty batches
are last (``u_j >= u_{j+1}``) and by then every request is done, so the KV row
is ``sum_i (mb + c) <= M u_j``.

``build(cuts="light"|"full")`` adds valid inequalities (per-request token work
and KV area, the combinatorial objective bound, cumulative work and area against
generated tokens). They tighten the bound on hard instances but slowed every
instance we proved optimal, so they are off by default.

Strengthening (on by default)
-----------------------------
*Token rows*, valid for every legal schedule: ``z[i,k,j]`` = request i has
generated k tokens by batch j (``G = sum_k z``, ``d = z[i,O,j]``, ``z`` grows
with j, one token per batch). A request generating its k-th token holds
``I + k - 1`` KV during that batch, so those weights fit in M, and the clique
rows of :meth:`BatchIndexed.clique_sets` allow at most one of a set of tokens
that pairwise exceed M. On ShareGPT draws they lift the LP bound by about 4%
where one long prompt blocks the others.

*Dominance* (:attr:`BatchIndexed.normal_form`: unit time, no C and no P; keeps
an optimum, and :meth:`BatchIndexed.normalised` maps any schedule to one that
satisfies it, completing nobody later): a request processes tokens only in the
batches where it generates (all of them at once), and with evictions allowed a
request that sits a batch out holds no KV (evicting it is free: its refill rides
in the batch where it next generates, one slot whatever it processes). Then
``mb + c`` is exactly the weight of the token generated.

Where every request also arrives at once, :func:`solve_batch` solves the
*token-indexed* model instead (:mod:`kvsched.csp.tokenindexed`): the same class
(the normal form loses no optimum) with the ``z`` alone, per-request deadlines
from LP bounds of the instance without each request, and the LP bound reported
beside the solver's. It proves the ShareGPT ÷ 40 draws of 6-15 requests that
this model left open at 14-20% (``benchmarks/solve.py --part batch``).

Symmetry: identical requests (same I, O and arrival) complete in index order
(``d[i,j] >= d[i',j]``, A4.2 #7); the warm start is relabelled to match.

``holes`` re-opens one of seed 003's holes (A4.2), for the tests that show each
fix is needed; see :data:`HOLES`.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from kvsched.costmodel import InfermaxLinear, UnitCost
from kvsched.csp.model import INF, LinearModel
from kvsched.csp.objectives import objective_function
from kvsched.errors import InputError, KvschedError
from kvsched.instances.model import Instance
from kvsched.schedule.core import EngineState
from kvsched.schedule.ir import Batch, Schedule
from kvsched.schedule.validate import instance_cost_model, replay

#: Tolerance when snapping decoded batch starts onto the previous end or an arrival.
SNAP_TOL = 1e-6
GRID_TOL = 1e-9

#: Heuristic policies tried for the warm start (the best legal one is used).
WARM_POLICIES = (
    "vllm",
    "vllm-ef",
    "vllm-hy",
    "sarathi",
    "sarathi-ef",
    "sarathi-pc",
    "sarathi-pc-ef",
    "rank-o",
    "rank-i",
)

#: The holes of seed 003's CSP (notes A4.2) that ``holes=`` can re-open, for tests.
HOLES = {
    "no-release": "A4.2 #1: a finished request keeps its KV unless 'evicted' (no release on completion)",
    "free-token": "A4.2 #2: g = 1 does not require c = S - m (a token without processing)",
    "stalled-token": "A4.2 #2: g = 0 does not require c <= S - m - 1 (S - m may reach 0)",
    "phase-label": "A4.2 #4: decode = 'generated and one token left', no refill state",
    "no-idle": "A4.2 #6: a batch starts when the previous one ends (no idling)",
    "arrival-at-end": "A4.2 #6: a request may run in a batch that ends, not starts, after its arrival",
}

_PHASE_COEFS = ("b0", "b1", "p0", "p1", "p2", "p3")


class _Lin:
    """A small linear expression: ``sum coef * x[var] + const``."""

    __slots__ = ("k", "t")

    def __init__(self, t: dict[int, float] | None = None, k: float = 0.0) -> None:
        self.t = dict(t) if t else {}
        self.k = float(k)

    def __add__(self, other: _Lin | float) -> _Lin:
        out = _Lin(self.t, self.k)
        if isinstance(other, _Lin):
            for v, c in other.t.items():
                out.t[v] = out.t.get(v, 0.0) + c
            out.k += other.k
        else:
            out.k += float(other)
        return out

    __radd__ = __add__

    def __neg__(self) -> _Lin:
        return _Lin({v: -c for v, c in self.t.items()}, -self.k)

    def __sub__(self, other: _Lin | float) -> _Lin:
        return self + (-other)

    def __rsub__(self, other: float) -> _Lin:
        return (-self) + other

    def __mul__(self, s: float) -> _Lin:
        return _Lin({v: c * s for v, c in self.t.items()}, self.k * s)

    __rmul__ = __mul__


def _v(var: int, coef: float = 1.0) -> _Lin:
    return _Lin({var: coef})


def _sum(exprs: Iterable[_Lin]) -> _Lin:
    out = _Lin()
    for e in exprs:
        for v, c in e.t.items():
            out.t[v] = out.t.get(v, 0.0) + c
        out.k += e.k
    return out


class BatchIndexed:
    """Build, warm-start and decode the batch-indexed model of one instance.

    Parameters
    ----------
    instance
        ``block_size`` 1; the ``unit`` or ``infermax-linear`` cost model.
    objective
        ``total-latency``, ``makespan`` or ``sum-ttft``.
    allow_eviction
        Whether schedules may evict (``False``: the eviction-free class).
    holes
        Names from :data:`HOLES` to re-open (tests only: the model is then wrong).
    """

    OBJECTIVES = ("total-latency", "makespan", "sum-ttft")

    def __init__(
        self,
        instance: Instance,
        objective: str = "total-latency",
        *,
        allow_eviction: bool = True,
        holes: Iterable[str] = (),
    ) -> None:
        if objective not in self.OBJECTIVES:
            raise InputError(
                f"--objective: the batch-indexed formulation supports {', '.join(self.OBJECTIVES)}"
            )
        self.holes = frozenset(holes)
        unknown = self.holes - set(HOLES)
        if unknown:
            raise InputError(f"unknown hole(s) {sorted(unknown)} (known: {', '.join(HOLES)})")
        cost = instance_cost_model(instance)
        if isinstance(cost, UnitCost):
            self.unit, self.scale, self.coef = True, float(cost.slot), None
        elif isinstance(cost, InfermaxLinear):
            self.unit, self.scale, self.coef = False, 1.0, cost.coefficients()
        else:
            raise InputError(
                "the batch-indexed formulation needs the unit or infermax-linear cost model "
                f"(batch time linear in the schedule), not {cost.name!r}"
            )
        lim = instance.limits
        if lim.block_size != 1:
            raise InputError(
                f"the batch-indexed formulation models KV per token: block_size must be 1, not "
                f"{lim.block_size} (paged rounding is not modelled)"
            )
        if len(instance) == 0:
            raise InputError("the instance has no requests")
        instance.check_feasible()
        if lim.max_running is not None and lim.max_running < 1:
            raise InputError("max_running must be at least 1")
        for cap, what in (
            (lim.max_batch_tokens, "token budget C"),
            (lim.max_prefill_tokens, "prefill budget P"),
        ):
            if cap is not None and cap < 1:
                raise InputError(f"the {what} must be at least 1 token")
        self.instance = instance
        self.cost = cost
        self.objective = objective
        self.allow_eviction = allow_eviction
        self.measure = objective_function(objective)
        reqs = instance.requests
        self.n = len(reqs)
        self.prompt = np.array([r.prompt for r in reqs], dtype=np.int64)
        self.output = np.array([r.output for r in reqs], dtype=np.int64)
        self.peak = self.prompt + self.output - 1
        self.arrival = np.array([r.arrival for r in reqs], dtype=np.float64) / self.scale
        self.a_min = float(self.arrival.min())
        self.offline = bool(np.all(np.abs(self.arrival - self.a_min) <= GRID_TOL))
        self.integral_time = self.unit and bool(
            np.all(np.abs(self.arrival - np.round(self.arrival)) <= GRID_TOL)
        )
        if self.integral_time:
            self.arrival = np.round(self.arrival)
            self.a_min = float(self.arrival.min())
        self.kv_cap = lim.kv_capacity
        self.tok_cap = lim.max_batch_tokens
        self.pre_cap = lim.max_prefill_tokens
        self.run_cap = lim.max_running
        inf = 10**18
        chunk = min(self.tok_cap or inf, self.pre_cap or inf)
        self.cap = np.minimum(self.peak, min(self.tok_cap or inf, max(1, self.pre_cap or inf)))
        # Batches a request needs alone: ceil(I / chunk) to its first token, O - 1 more to complete.
        self.first_batches = -(-self.prompt // min(chunk, int(self.prompt.max())))
        self.min_batches = self.first_batches + self.output - 1
        self.tok_total = int(min(self.tok_cap or inf, int(self.cap.sum())))
        phase_cost = not self.unit and any(self.coef[k] > 0 for k in _PHASE_COEFS)
        p_binds = self.pre_cap is not None and self.pre_cap < self.tok_total
        self.need_phase = phase_cost or p_binds
        self.exact_phase = phase_cost
        self.track_refill = self.need_phase and allow_eviction and "phase-label" not in self.holes
        self.timed = not (self.unit and self.offline) or bool(self.holes & {"no-idle", "arrival-at-end"})
        self.t_min = self._min_batch_time()
        # Dominance (see "Strengthening" in the module docstring): under unit time without token or
        # prefill budgets, chunks that produce no token and KV held by paused requests never help.
        self.normal_form = self.unit and self.tok_cap is None and self.pre_cap is None and not self.holes
        self.left_shift = self.normal_form and allow_eviction and not self.timed and self.run_cap is None
        self.horizon_batches: int | None = None
        self.time_bound: float | None = None

    # ------------------------------------------------------------- durations
    def _min_batch_time(self) -> float:
        """The shortest a non-empty batch can last (model units)."""
        if self.unit:
            return 1.0
        k = self.coef
        t = k["a0"] + k["a1"]
        if any(k[c] > 0 for c in _PHASE_COEFS):
            decode = k["b0"] + k["b1"] * float(self.prompt.min())
            prefill = k["p0"] + k["p1"] + k["p3"]
            t += min(decode, prefill)
        if t <= 0:
            raise InputError(
                "the batch-indexed formulation needs a positive minimum batch time (a0 + a1 > 0) to bound "
                "its horizon"
            )
        return t

    def _max_batch_time(self) -> float:
        if self.unit:
            return 1.0
        k = self.coef
        tok = float(self.tok_total)
        kv = float(self.kv_cap)
        return (
            k["a0"]
            + k["a1"] * tok
            + k["b0"]
            + k["b1"] * kv
            + k["p0"]
            + k["p1"] * (tok * tok + 2 * kv * tok)
            + k["p2"] * kv
            + k["p3"] * self.n
        )

    # ------------------------------------------------------------- objective
    def value(self, schedule: Schedule) -> float:
        """Objective of a legal ``schedule`` (replayed through the core), in model units."""
        return self.measure(replay(self.instance, schedule)) / self.scale

    # ---------------------------------------------------------------- horizon
    def _sorted_completion_bound(self) -> np.ndarray:
        """A vector L with sorted completion times >= L componentwise, for every legal schedule.

        Isolated service (a_i + batches alone x t_min) and KV area: the k smallest areas need at
        least ceil(area / M) batches of at least t_min each (seed 004's area argument; see
        :mod:`kvsched.csp.bounds`).
        """
        alone = np.sort(self.arrival + self.min_batches * self.t_min)
        o, p = self.output.astype(np.float64), self.prompt.astype(np.float64)
        area = o * p + o * (o - 1) / 2
        by_area = self.a_min + np.ceil(np.cumsum(np.sort(area)) / self.kv_cap - 1e-9) * self.t_min
        return np.maximum(alone, by_area)

    def horizon(self, upper_bound: float) -> tuple[int, float]:
        """Batches J and a time bound such that some optimal schedule fits, given an objective
        upper bound (model units); also per-request deadlines. See the module docstring."""
        a, t_min, n = self.arrival, self.t_min, self.n
        ub = float(upper_bound)
        tol = 1e-9
        self._last_done = self._last_first = None
        if self.objective == "makespan":
            deadline = np.full(n, ub)
            end = ub
            batches = math.floor((ub - self.a_min) / t_min + tol)
        else:
            ttft = self.objective == "sum-ttft"
            least = a + (self.first_batches if ttft else self.min_batches) * t_min  # earliest events
            others = least.sum() - least  # sum over k != i of the others' earliest events
            if not ttft and n > 1:
                others = np.maximum(others, float(np.sort(self._sorted_completion_bound())[: n - 1].sum()))
            # sum_i (event_i - a_i) <= UB, so event_i <= UB + sum_k a_k - sum_{k != i} event_k.
            deadline = ub + a.sum() - others
            end = float(deadline.max())
            batches = math.floor((end - self.a_min) / t_min + tol)
            if not ttft:
                # The batches lie in the union of the [a_i, F_i], of total length <= UB.
                batches = min(batches, math.floor(ub / t_min + tol))
        last = np.floor((deadline - self.a_min) / t_min + tol).astype(np.int64)
        if self.objective == "sum-ttft":
            self._last_first = last
            tail = int(self.peak.sum())
            batches += tail
            end += tail * self._max_batch_time()
        else:
            self._last_done = last
        self._deadline = deadline
        return max(1, batches), end

    # ------------------------------------------------------------ warm start
    def sequential_schedule(self) -> Schedule:
        """One request at a time, by arrival: prompt in chunks of min(C, P), then decodes. Always legal."""
        state = EngineState(self.instance, self.cost)
        lim = self.instance.limits
        chunk = min(c for c in (lim.max_batch_tokens, lim.max_prefill_tokens, 10**18) if c is not None)
        batches = []
        for i in np.lexsort((np.arange(self.n), self.arrival)):
            left = int(self.prompt[i])
            while not state.done[i]:
                tok = min(chunk, left) if left > 0 else 1
                left -= tok
                start = max(state.clock, float(self.instance.requests[i].arrival))
                b = state.make_batch(start, [int(i)], [tok])
                state.step(b)
                batches.append(b)
        return Schedule(tuple(batches), {"policy": "sequential"})

    def heuristic_schedule(self) -> Schedule:
        """The best legal schedule of the class among the warm-start policies and the sequential one."""
        from kvsched.heuristics import make_policy, simulate

        cands = [self.sequential_schedule()]
        for name in WARM_POLICIES:
            try:
                sched = simulate(self.instance, make_policy(name)).schedule
            except KvschedError:
                continue
            cands.append(sched)
        best, best_value = None, INF
        for sched in cands:
            if not self.in_class(sched):
                continue
            val = self.value(sched)
            if val < best_value - 1e-12:
                best, best_value = sched, val
        assert best is not None  # the sequential schedule is always in the class
        return self.retimed(best)

    def in_class(self, schedule: Schedule) -> bool:
        """Whether ``schedule`` is legal and (without eviction) evicts nothing."""
        try:
            replay(self.instance, schedule)
        except KvschedError:
            return False
        return self.allow_eviction or all(b.evicted.size == 0 for b in schedule.batches)

    def retimed(self, schedule: Schedule) -> Schedule:
        """``schedule`` with every batch started as early as its predecessor and its arrivals allow."""
        state = EngineState(self.instance, self.cost)
        arr = np.array([r.arrival for r in self.instance.requests])
        out = []
        for b in schedule.batches:
            start = max(state.clock, float(arr[b.requests].max()) if b.requests.size else state.clock)
            nb = state.make_batch(start, b.requests, b.tokens, b.evicted)
            state.step(nb)
            out.append(nb)
        return Schedule(tuple(out), dict(schedule.meta))

    def identical_groups(self) -> list[list[int]]:
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i in range(self.n):
            groups[(int(self.prompt[i]), int(self.output[i]), float(self.arrival[i]))].append(i)
        return [g for g in groups.values() if len(g) > 1]

    def canonical(self, schedule: Schedule) -> Schedule:
        """``schedule`` with identical requests relabelled so that they complete in index order."""
        st = replay(self.instance, schedule).state
        new_pos = np.arange(self.n)
        for group in self.identical_groups():
            order = sorted(group, key=lambda i: (st.completion[i], st.first_token[i], i))
            for pos, old in zip(group, order, strict=True):
                new_pos[old] = pos
        if np.array_equal(new_pos, np.arange(self.n)):
            return schedule
        batches = tuple(
            Batch.of(b.start, b.duration, new_pos[b.requests], b.tokens, b.phases, new_pos[b.evicted])
            for b in schedule.batches
        )
        return Schedule(batches, dict(schedule.meta))

    def token_batches(self, schedule: Schedule) -> list[list[int]]:
        """For each request, the (1-based) batches in which it generates its tokens, replayed."""
        state = EngineState(self.instance, self.cost)
        out: list[list[int]] = [[] for _ in range(self.n)]
        for j, b in enumerate(schedule.batches, start=1):
            before = state.generated.copy()
            state.step(b)
            for i in np.flatnonzero(state.generated > before):
                out[int(i)].append(j)
        return out

    def normal_times(self, schedule: Schedule) -> list[list[int]]:
        """Token batches of ``schedule`` in normal form (:attr:`normal_form` instances only).

        Batches in which no request generates are dropped; with
        :attr:`left_shift`, a request's next token moves into an earlier batch
        while it fits there (KV during the batch: the generated tokens' weights
        ``I + k - 1``), repeated to a fixed point; identical requests (same I, O
        and arrival) then take, for each k, their k-th token batches in sorted
        order, so the first of them is never behind. No request completes later
        (identical ones trade completions), so the objective does not grow; each
        batch keeps its multiset of (token index, weight) items, and loads only
        fall.
        """
        times = self.token_batches(schedule)
        weight = [self.prompt[i] + np.arange(self.output[i]) for i in range(self.n)]
        while True:
            used = sorted({j for t in times for j in t})
            renum = {j: pos for pos, j in enumerate(used, start=1)}
            times = [[renum[j] for j in t] for t in times]
            if not self.left_shift:
                break
            load = np.zeros(len(used) + 1, dtype=np.int64)
            for i, t in enumerate(times):
                np.add.at(load, t, weight[i])
            moved = False
            for j in range(1, len(used) + 1):
                for i, t in enumerate(times):
                    k = int(np.searchsorted(t, j))  # tokens generated before batch j
                    if k == len(t) or t[k] == j or load[j] + weight[i][k] > self.kv_cap:
                        continue
                    load[t[k]] -= weight[i][k]
                    load[j] += weight[i][k]
                    t[k] = j
                    moved = True
            if not moved:
                break
        for group in self.identical_groups():
            for k in range(int(self.output[group[0]])):
                for i, j in zip(group, sorted(times[i][k] for i in group), strict=True):
                    times[i][k] = j
        return times

    def schedule_of_tokens(self, times: list[list[int]], meta: dict | None = None) -> Schedule:
        """The normal-form schedule in which request i generates its k-th token in batch ``times[i][k-1]``.

        Each request processes all its unprocessed tokens in the batches where
        it generates and nothing else; with evictions allowed, every request
        that sits a batch out while holding KV is evicted in it. Batches start
        as early as the previous end and their arrivals allow. Stepped through
        the core (raises ScheduleError if illegal, e.g. over M).
        """
        state = EngineState(self.instance, self.cost)
        arr = np.array([r.arrival for r in self.instance.requests])
        running: dict[int, list[int]] = defaultdict(list)
        for i, t in enumerate(times):
            for j in t:
                running[j].append(i)
        batches = []
        for j in sorted(running):
            run = np.array(running[j], dtype=np.int64)
            held = np.flatnonzero(state.kv > 0)
            ev = [int(i) for i in held if i not in running[j]] if self.allow_eviction else []
            start = max(state.clock, float(arr[run].max()))
            b = state.make_batch(start, run, state.unprocessed(run), ev)
            state.step(b)
            batches.append(b)
        return Schedule(tuple(batches), dict(meta or {}))

    def normalised(self, schedule: Schedule) -> Schedule:
        """``schedule`` in the normal form that the dominance rows keep (see :meth:`normal_times`)."""
        return self.schedule_of_tokens(self.normal_times(schedule), schedule.meta)

    # ------------------------------------------------------------------ build
    def build(
        self,
        upper_bound: float,
        hint: Schedule | None = None,
        *,
        horizon: int | None = None,
        symmetry: bool = True,
        cuts: bool | str = False,
        strengthen: bool = True,
        dominance: bool = True,
    ) -> LinearModel:
        """The model for schedules with objective <= ``upper_bound`` (model units).

        ``hint`` (a legal schedule of the class) becomes the full warm-start
        vector. ``horizon`` overrides the number of batches J (tests only: a J
        below the derived one may cut off every optimum). ``strengthen`` adds the
        token-indexed rows (valid for every legal schedule); ``dominance`` the
        normal-form rows where they apply (they keep an optimum, not every
        schedule: the hint is normalised to satisfy them).
        """
        J, t_ub = self.horizon(upper_bound)
        self.strengthen = strengthen and not self.holes  # a re-opened hole must stay open
        self.dominance = dominance and self.normal_form
        if hint is not None:
            hint = self.retimed(hint)
            if self.dominance:
                hint = self.normalised(hint)
            hint = self.canonical(hint)
            J = max(J, len(hint.batches))
            t_ub = max(t_ub, hint.makespan / self.scale)
        if horizon is not None:
            J = int(horizon)
        if self.integral_time:
            t_ub = math.floor(t_ub + 1e-9)
        self.horizon_batches, self.time_bound = J, t_ub
        self.symmetry = symmetry
        self.cuts = cuts
        m = LinearModel(name=f"batch-indexed {self.objective}")
        self._m = m
        self._build(m, J, t_ub)
        if hint is not None:
            m.hint = self.vector_of(hint)
        return m

    # Row helpers --------------------------------------------------------
    def _row(self, e: _Lin, lo: float, hi: float, name: str) -> None:
        items = [(v, c) for v, c in e.t.items() if c != 0]
        if not items:
            if e.k < lo - 1e-9 or e.k > hi + 1e-9:
                raise AssertionError(f"constant row {name} is violated ({e.k} not in [{lo}, {hi}])")
            return
        lo2 = -INF if lo == -INF else lo - e.k
        hi2 = INF if hi == INF else hi - e.k
        self._m.add_row([v for v, _ in items], [c for _, c in items], lo2, hi2, name)

    def _ind(self, var: int, value: int, e: _Lin, lo: float, hi: float, name: str) -> None:
        m = self._m
        if m.lb[var] == m.ub[var]:  # a fixed indicator: the row always or never applies
            if int(m.lb[var]) == value:
                self._row(e, lo, hi, name)
            return
        items = [(v, c) for v, c in e.t.items() if c != 0]
        if not items:
            if e.k < lo - 1e-9 or e.k > hi + 1e-9:  # the indicator must take the other value
                if value == 1:
                    m.ub[var] = 0.0
                else:
                    m.lb[var] = 1.0
            return
        lo2 = -INF if lo == -INF else lo - e.k
        hi2 = INF if hi == INF else hi - e.k
        m.add_indicator(var, value, [v for v, _ in items], [c for _, c in items], lo2, hi2, name)

    def _build(self, m: LinearModel, J: int, t_ub: float) -> None:
        n, holes = self.n, self.holes
        self._prods: dict[int, dict] = {}
        prompt, out, U, cap = self.prompt, self.output, self.peak, self.cap
        evict = self.allow_eviction
        integer_time = self.integral_time
        R = range(n)
        JJ = range(J + 1)
        var = m.add_var

        def fixed(name: str, value: float) -> int:
            return var(name, value, value)

        # --------------------------------------------------------- variables
        G = [[0] * (J + 1) for _ in R]
        d = [[0] * (J + 1) for _ in R]
        kv = [[0] * (J + 1) for _ in R]
        c = [[0] * (J + 1) for _ in R]
        g = [[0] * (J + 1) for _ in R]
        e = [[0] * (J + 1) for _ in R]
        mb = [[0] * (J + 1) for _ in R]
        H = [[0] * (J + 1) for _ in R]
        rho = [[0] * (J + 1) for _ in R]
        delta = [[0] * (J + 1) for _ in R]
        x = [[0] * (J + 1) for _ in R]
        alpha: list[list[int] | None] = [None] * n
        eta: list[list[int] | None] = [None] * n
        cuts = self.cuts
        need_h = self.need_phase or self.objective == "sum-ttft" or cuts
        self._need_h = need_h
        no_release = "no-release" in holes
        last_done = self._last_done if self._last_done is not None else np.full(n, J)
        last_first = self._last_first
        for i in R:
            o, b0 = int(out[i]), int(self.first_batches[i])
            done_from = int(self.min_batches[i])
            for j in JJ:
                if j == 0:
                    G[i][0], d[i][0], kv[i][0] = (
                        fixed(f"G[{i},0]", 0),
                        fixed(f"d[{i},0]", 0),
                        fixed(f"m[{i},0]", 0),
                    )
                    c[i][0], g[i][0] = fixed(f"c[{i},0]", 0), fixed(f"g[{i},0]", 0)
                    if need_h:
                        H[i][0] = fixed(f"H[{i},0]", 0)
                    if self.track_refill:
                        rho[i][0] = fixed(f"rho[{i},0]", 0)
                    continue
                lo = min(o, max(0, o - (J - j), o - (last_done[i] - j)))  # O - G tokens take O - G batches
                if last_first is not None and j >= last_first[i]:
                    lo = max(lo, 1)
                hi = min(o, max(0, j - b0 + 1))
                if lo > hi:
                    raise InputError(
                        f"horizon of {J} batches is too short for request {self.instance.requests[i].id!r}"
                    )
                G[i][j] = var(f"G[{i},{j}]", lo, hi)
                d[i][j] = var(
                    f"d[{i},{j}]", 1 if j >= min(J, last_done[i]) else 0, 1 if j >= done_from else 0
                )
                kv_hi = 0 if (j == J and not no_release) else int(U[i])
                kv[i][j] = var(f"m[{i},{j}]", 0, kv_hi)
                c[i][j] = var(f"c[{i},{j}]", 0, int(cap[i]))
                g[i][j] = var(f"g[{i},{j}]", 0, 1 if j >= b0 else 0)
                if evict and j >= 2:
                    e[i][j] = var(f"e[{i},{j}]", 0, 1)
                    mb[i][j] = var(f"mb[{i},{j}]", 0, int(U[i]))
                else:
                    e[i][j] = -1  # no eviction variable
                    mb[i][j] = kv[i][j - 1]
                if need_h:
                    H[i][j] = var(f"H[{i},{j}]", 1 if lo >= 1 else 0, 1 if hi >= 1 else 0)
                if self.need_phase:
                    delta[i][j] = var(f"delta[{i},{j}]", 0, 1 if j >= b0 + 1 else 0)
                    if self.exact_phase:
                        x[i][j] = var(f"x[{i},{j}]", 0, 1)
                if self.track_refill:
                    rho[i][j] = var(f"rho[{i},{j}]", 0, 1 if (j >= 2 and j >= b0 + 1) else 0)
            if self.timed and self.arrival[i] > self.a_min + GRID_TOL:
                alpha[i] = [0] + [var(f"alpha[{i},{j}]", 0, 1) for j in range(1, J + 1)]
            if self.run_cap is not None:
                eta[i] = [0] + [var(f"eta[{i},{j}]", 0, 1) for j in range(1, J + 1)]
        u = [0] + [var(f"u[{j}]", 0, 1) for j in range(1, J + 1)]
        tau: list[int] = [0] * (J + 1)
        end: list[int] = [0] * (J + 1)
        if self.timed:
            for j in range(1, J + 1):
                tau[j] = var(f"tau[{j}]", self.a_min, t_ub, integer=integer_time)
                end[j] = var(f"E[{j}]", self.a_min, t_ub, integer=integer_time)

        def lin(v: int) -> _Lin:
            return _v(v)

        # --------------------------------------------------- request dynamics
        for i in R:
            o, ii, uu, cc = int(out[i]), int(prompt[i]), int(U[i]), int(cap[i])
            for j in range(1, J + 1):
                tag = f"{i},{j}"
                C_, g_, Gp, Gc = lin(c[i][j]), lin(g[i][j]), lin(G[i][j - 1]), lin(G[i][j])
                mp, dp, dc = lin(kv[i][j - 1]), lin(d[i][j - 1]), lin(d[i][j])
                mbe = lin(mb[i][j])
                a = ii + Gp - mbe  # unprocessed tokens once evictions applied
                self._row(C_ - a, -INF, 0, f"tok[{tag}]")
                if "free-token" not in holes:
                    self._ind(g[i][j], 1, C_ - a, 0, INF, f"full[{tag}]")
                if "stalled-token" not in holes:
                    self._ind(g[i][j], 0, C_ - a, -INF, -1, f"left[{tag}]")
                self._row(Gc - Gp - g_, 0, 0, f"gen[{tag}]")
                self._row(o * dc - Gc, -INF, 0, f"done-[{tag}]")
                self._row(Gc - dc, -INF, o - 1, f"done+[{tag}]")
                self._row(dc - dp, 0, INF, f"dmono[{tag}]")
                self._row(C_ + cc * dp, -INF, cc, f"fin-c[{tag}]")
                self._row(g_ + dp, -INF, 1, f"fin-g[{tag}]")
                # KV after the batch: appended, then released if it completed.
                if no_release:
                    self._row(lin(kv[i][j]) - mbe - C_, 0, 0, f"kv[{tag}]")
                else:
                    self._ind(d[i][j], 0, lin(kv[i][j]) - mbe - C_, 0, 0, f"kv[{tag}]")
                    self._row(lin(kv[i][j]) + uu * dc, -INF, uu, f"release[{tag}]")
                if e[i][j] >= 0:
                    ev = lin(e[i][j])
                    self._row(mbe - mp, -INF, 0, f"ev-keep-[{tag}]")
                    self._row(mbe - mp + uu * ev, 0, INF, f"ev-keep+[{tag}]")
                    self._row(mbe + uu * ev, -INF, uu, f"ev-drop[{tag}]")
                    self._row(C_ + cc * ev, -INF, cc, f"ev-idle[{tag}]")
                    self._row(ev - mp, -INF, 0, f"ev-held[{tag}]")
                    self._row(ev - lin(u[j]), -INF, 0, f"ev-batch[{tag}]")
                # Phase.
                if need_h:
                    self._row(lin(H[i][j]) - Gc, -INF, 0, f"H-[{tag}]")
                    self._row(Gc - o * lin(H[i][j]), -INF, 0, f"H+[{tag}]")
                if self.need_phase:
                    dl, hp = lin(delta[i][j]), lin(H[i][j - 1])
                    item = lin(x[i][j]) if self.exact_phase else C_
                    self._row(dl - item, -INF, 0, f"dec-item[{tag}]")
                    self._row(dl - hp, -INF, 0, f"dec-gen[{tag}]")
                    if self.exact_phase:
                        xx = lin(x[i][j])
                        self._row(xx - C_, -INF, 0, f"x-[{tag}]")
                        self._row(C_ - cc * xx, -INF, 0, f"x+[{tag}]")
                    if self.track_refill:
                        rr, rp = lin(rho[i][j]), lin(rho[i][j - 1])
                        ev = lin(e[i][j]) if e[i][j] >= 0 else _Lin()
                        gp = lin(g[i][j - 1])
                        self._row(dl + rr, -INF, 1, f"dec-refill[{tag}]")
                        self._row(rr - ev - hp, -1, INF, f"rho-ev[{tag}]")
                        self._row(rr - rp + gp, 0, INF, f"rho-keep[{tag}]")
                        self._row(rr - ev - rp, -INF, 0, f"rho-up1[{tag}]")
                        self._row(rr - ev + gp, -INF, 1, f"rho-up2[{tag}]")
                        self._row(rr - hp, -INF, 0, f"rho-up3[{tag}]")
                        if self.exact_phase:
                            self._row(dl - lin(x[i][j]) - hp + rr, -1, INF, f"dec-exact[{tag}]")
                    else:
                        if "phase-label" in holes:
                            # The notes' [R] rule: decode iff generated before and one token left.
                            self._ind(delta[i][j], 1, a, -INF, 1, f"dec-one[{tag}]")
                        if self.exact_phase:
                            self._row(dl - lin(x[i][j]) - hp, -1, INF, f"dec-exact[{tag}]")
                # Arrival: only once arrived by the batch's start.
                if alpha[i] is not None:
                    al = alpha[i][j]
                    self._row(C_ - cc * lin(al), -INF, 0, f"arr[{tag}]")
                    at = lin(end[j]) if "arrival-at-end" in holes else lin(tau[j])
                    self._ind(al, 1, at, float(self.arrival[i]), INF, f"arrived[{tag}]")
                    if j < J:
                        self._row(lin(al) - lin(alpha[i][j + 1]), -INF, 0, f"arr-mono[{tag}]")
                if eta[i] is not None:
                    self._row(mbe + C_ - uu * lin(eta[i][j]), -INF, 0, f"running[{tag}]")

        # ---------------------------------------------------------- batches
        durations: list[_Lin] = [_Lin()]
        for j in range(1, J + 1):
            toks = _sum(lin(c[i][j]) for i in R)
            held = _sum(lin(mb[i][j]) + lin(c[i][j]) for i in R)
            self._row(held - self.kv_cap * lin(u[j]), -INF, 0, f"kvcap[{j}]")
            self._row(toks - self.tok_total * lin(u[j]), -INF, 0, f"C[{j}]")
            self._row(toks - lin(u[j]), 0, INF, f"nonempty[{j}]")
            if j < J:
                self._row(lin(u[j + 1]) - lin(u[j]), -INF, 0, f"u-mono[{j}]")
            if self.run_cap is not None:
                self._row(_sum(lin(eta[i][j]) for i in R), -INF, self.run_cap, f"R[{j}]")
            if self.need_phase and self.pre_cap is not None:
                pre = toks - _sum(lin(delta[i][j]) for i in R)
                self._row(pre, -INF, self.pre_cap, f"P[{j}]")
            durations.append(lin(u[j]) if self.unit else self._duration(m, j, c, mb, delta, x, u))
        self._durations = durations

        # ------------------------------------------------------------- time
        if self.timed:
            for j in range(1, J + 1):
                self._row(lin(end[j]) - lin(tau[j]) - durations[j], 0, 0, f"end[{j}]")
                if j < J:
                    gap_hi = 0 if "no-idle" in holes else INF
                    self._row(lin(tau[j + 1]) - lin(end[j]), 0, gap_hi, f"order[{j}]")
            if "no-idle" in holes:
                self._row(lin(tau[1]), self.a_min, self.a_min, "start")

        # -------------------------------------------------------- objective
        obj = self.objective
        if not self.timed:
            if obj == "makespan":
                for j in range(1, J + 1):
                    m.obj[u[j]] = 1.0
                m.obj_offset = self.a_min
            else:
                flag = d if obj == "total-latency" else H
                for i in R:
                    for j in range(0, J):
                        m.obj[flag[i][j]] -= 1.0
                m.obj_offset = float(n * J)
        elif obj == "makespan":
            m.obj[end[J]] = 1.0
        else:
            flag = d if obj == "total-latency" else H
            least = self.min_batches if obj == "total-latency" else self.first_batches
            fin = []
            for i in R:
                lo = float(self.arrival[i]) + float(least[i]) * self.t_min
                if integer_time:
                    lo = math.ceil(lo - 1e-9)
                hi = min(t_ub, float(self._deadline[i]))
                if integer_time:
                    hi = math.floor(hi + 1e-9)
                f = var(f"F[{i}]", min(lo, hi), hi, integer=integer_time, obj=1.0)
                fin.append(f)
                m.obj_offset -= float(self.arrival[i])
                for j in range(1, J + 1):
                    self._ind(flag[i][j - 1], 0, lin(f) - lin(end[j]), 0, INF, f"F[{i},{j}]")
            self._fin = fin

        # ------------------------------------------------------ valid cuts
        zs: list[list[int]] = [[] for _ in R]
        self._zs = zs
        if cuts:
            for i in R:
                ii = int(prompt[i])
                area = int(out[i]) * ii + int(out[i]) * (int(out[i]) - 1) // 2
                # Work: every one of the I + O - 1 tokens is processed at least once; by the end of
                # batch j all of I + G - 1 have been (G >= 1). KV area: at its k-th generation a
                # request holds I + k - 1 tokens during the batch.
                self._row(_sum(lin(c[i][j]) for j in range(1, J + 1)), int(U[i]), INF, f"work[{i}]")
                self._row(
                    _sum(lin(mb[i][j]) + lin(c[i][j]) for j in range(1, J + 1)), area, INF, f"area[{i}]"
                )
                if cuts != "full":
                    continue
                done_tok = _Lin()
                o = int(out[i])
                ts = sorted({0, o // 4, o // 2, (3 * o) // 4, o - 1})
                prev_z = None
                for j in range(1, J + 1):
                    done_tok = done_tok + lin(c[i][j])
                    self._row(done_tok - lin(G[i][j]) - (ii - 1) * lin(H[i][j]), 0, INF, f"cum[{i},{j}]")
                    # Z = KV area held up to batch j >= area of the tokens generated so far (convex in G).
                    z = var(f"Z[{i},{j}]", 0, J * int(U[i]))
                    zprev = lin(prev_z) if prev_z is not None else _Lin()
                    self._row(lin(z) - zprev - lin(mb[i][j]) - lin(c[i][j]), 0, 0, f"Z[{i},{j}]")
                    self._row(lin(z) - area * lin(d[i][j]), 0, INF, f"Zd[{i},{j}]")
                    for t in ts:
                        self._row(
                            lin(z) - (ii + t) * lin(G[i][j]), -(t * (t + 1)) / 2, INF, f"ZG[{i},{j},{t}]"
                        )
                    prev_z = z
                    zs[i].append(z)
            if self.unit:
                from kvsched.csp.bounds import lower_bounds

                lb = lower_bounds(self.instance).for_objective(self.objective) / self.scale
                objective_expr = _Lin({k: v for k, v in enumerate(m.obj) if v != 0}, m.obj_offset)
                self._row(objective_expr, lb, INF, "objective-bound")

        # --------------------------------------------------------- symmetry
        if self.symmetry:
            for group in self.identical_groups():
                for i, k in itertools.pairwise(group):
                    for j in range(1, J):
                        self._row(lin(d[i][j]) - lin(d[k][j]), 0, INF, f"sym[{i},{k},{j}]")

        self._zvars: list[tuple[int, int, int, int]] = []
        if self.strengthen:
            self._token_rows(m, J, G, d, c, g, e, mb, kv, u)

        self._vars = dict(
            G=G,
            d=d,
            m=kv,
            c=c,
            g=g,
            e=e,
            mb=mb,
            H=H,
            rho=rho,
            delta=delta,
            x=x,
            alpha=alpha,
            eta=eta,
            u=u,
            tau=tau,
            E=end,
        )
        self._J = J

    def clique_sets(self) -> list[dict[int, int]]:
        """Maximal sets of (request, first token index) whose tokens pairwise exceed M together.

        A request generating its k-th token holds ``w = I + k - 1`` KV during that
        batch, in every legal schedule. For a threshold ``t <= M / 2`` and a
        request ``a``, the tokens of ``a`` with ``w >= t`` and the tokens of the
        others with ``w > M - t`` pairwise exceed M, and ``a`` generates at most
        one token per batch: at most one of them per batch. Each set maps a
        request to the first token index in it (its later tokens weigh more).
        """
        n, cap = self.n, int(self.kv_cap)
        weights = sorted({int(self.prompt[i]) + k for i in range(n) for k in range(int(self.output[i]))})
        sets: set[tuple[int | None, ...]] = set()
        for t in [w for w in weights if 2 * w <= cap] + [cap // 2 + cap % 2]:
            for a in range(n):
                first = []
                for i in range(n):
                    k = max(1, (t if i == a else cap - t + 1) - int(self.prompt[i]) + 1)
                    first.append(k if k <= self.output[i] else None)
                if sum(k is not None for k in first) >= 2:
                    sets.add(tuple(first))

        def covers(a: tuple, b: tuple) -> bool:
            return all(y is None or (x is not None and x <= y) for x, y in zip(a, b, strict=True))

        maximal = [b for b in sets if not any(a != b and covers(a, b) for a in sets)]
        return [{i: k for i, k in enumerate(b) if k is not None} for b in sorted(maximal, key=str)]

    def _token_rows(self, m: LinearModel, J: int, G, d, c, g, e, mb, kv, u) -> None:
        """Token-indexed strengthening: ``z[i,k,j]`` = request i has generated k tokens by batch j.

        Valid for every legal schedule: ``G = sum_k z``, ``z`` grows with j, at
        most one token per batch (``z[i,k,j] <= z[i,k-1,j-1]``), ``d = z[i,O,j]``;
        the tokens generated in batch j weigh ``I + k - 1`` each and fit in M
        (their KV is held during the batch), with the clique rows of
        :meth:`clique_sets`. With :attr:`dominance`, the normal form: a request's
        KV during batch j is exactly the weight of the token it generates there
        (0 when it generates none).
        """
        R = range(self.n)
        prompt, out = self.prompt, self.output

        def lin(v: int) -> _Lin:
            return _v(v)

        # zl[i][k][j]: z as an expression (a constant where G's bounds decide it).
        zl: list[list[list[_Lin]]] = []
        for i in R:
            o = int(out[i])
            rows = [[_Lin()] * (J + 1) for _ in range(o + 1)]
            for j in range(1, J + 1):
                glo, ghi = m.lb[G[i][j]], m.ub[G[i][j]]
                for k in range(1, o + 1):
                    if k <= glo:
                        rows[k][j] = _Lin(k=1.0)
                    elif k > ghi:
                        rows[k][j] = _Lin()
                    else:
                        var = m.add_var(f"z[{i},{k},{j}]", 0, 1)
                        self._zvars.append((var, i, k, j))
                        rows[k][j] = lin(var)
            zl.append(rows)
        gen: list[list[_Lin]] = [[_Lin()] * (J + 1) for _ in R]  # weighted token generated in batch j
        for i in R:
            o, z = int(out[i]), zl[i]
            for j in range(1, J + 1):
                self._row(lin(G[i][j]) - _sum(z[k][j] for k in range(1, o + 1)), 0, 0, f"zG[{i},{j}]")
                self._row(lin(d[i][j]) - z[o][j], 0, 0, f"zd[{i},{j}]")
                for k in range(1, o + 1):
                    if j >= 2:
                        self._row(z[k][j - 1] - z[k][j], -INF, 0, f"zmono[{i},{k},{j}]")
                    if k >= 2:
                        self._row(z[k][j] - z[k - 1][j - 1], -INF, 0, f"zprec[{i},{k},{j}]")
                gen[i][j] = _sum((z[k][j] - z[k][j - 1]) * float(prompt[i] + k - 1) for k in range(1, o + 1))
        cliques = self.clique_sets()
        for j in range(1, J + 1):
            self._row(_sum(gen[i][j] for i in R) - self.kv_cap * lin(u[j]), -INF, 0, f"zkv[{j}]")
            for q, members in enumerate(cliques):
                row = _sum(
                    zl[i][k][j] - zl[i][k][j - 1]
                    for i, k0 in members.items()
                    for k in range(k0, int(out[i]) + 1)
                )
                self._row(row, -INF, 1, f"clique[{q},{j}]")
        if not self.dominance:
            return
        evict = self.allow_eviction
        for i in R:
            cc = int(self.cap[i])
            for j in range(1, J + 1):
                tag = f"{i},{j}"
                # A chunk that produces no token can wait for the batch that does (no budgets, unit time).
                self._row(lin(c[i][j]) - cc * lin(g[i][j]), -INF, 0, f"nf-chunk[{tag}]")
                if evict:
                    # A paused request is evicted (refilling costs nothing under unit time without budgets),
                    # so it holds exactly the KV of the token it generates, if any.
                    self._row(lin(mb[i][j]) + lin(c[i][j]) - gen[i][j], 0, 0, f"nf-kv[{tag}]")
                    if e[i][j] >= 0:  # and a request that generates is not evicted first (no gain)
                        self._row(lin(e[i][j]) + lin(g[i][j]), -INF, 1, f"nf-keep[{tag}]")
                    o = int(out[i])
                    done_now = zl[i][o][j] - zl[i][o][j - 1]
                    self._row(
                        lin(kv[i][j]) - gen[i][j] + float(self.peak[i]) * done_now, 0, 0, f"nf-m[{tag}]"
                    )

    def _duration(self, m: LinearModel, j: int, c, mb, delta, x, u) -> _Lin:
        """The infermax-linear duration of batch j as a linear expression (lower-bounded products)."""
        k = self.coef
        R = range(self.n)
        dur = k["a0"] * _v(u[j]) + k["a1"] * _sum(_v(c[i][j]) for i in R)
        if not self.exact_phase:
            return dur
        prods = self._prods.setdefault(j, {})
        need_w = k["b1"] > 0 or k["p1"] > 0
        if k["b0"] > 0:
            v = m.add_var(f"v[{j}]", 0, 1)
            prods["v"] = v
            for i in R:
                self._row(_v(v) - _v(delta[i][j]), 0, INF, f"v[{i},{j}]")
            dur = dur + k["b0"] * _v(v)
        if k["p0"] > 0:
            z = m.add_var(f"z[{j}]", 0, 1)
            prods["z"] = z
            for i in R:
                self._row(_v(z) - _v(x[i][j]) + _v(delta[i][j]), 0, INF, f"z[{i},{j}]")
            dur = dur + k["p0"] * _v(z)
        for i in R:
            uu, cc = int(self.peak[i]), int(self.cap[i])
            dl, xx, mbe, cv = _v(delta[i][j]), _v(x[i][j]), _v(mb[i][j]), _v(c[i][j])
            if need_w:
                w = m.add_var(f"w[{i},{j}]", 0, uu)
                prods[("w", i)] = w
                self._row(_v(w) - mbe, -INF, 0, f"w1[{i},{j}]")
                self._row(_v(w) - uu * dl, -INF, 0, f"w2[{i},{j}]")
                self._row(_v(w) - mbe - uu * dl, -uu, INF, f"w3[{i},{j}]")
                dur = dur + k["b1"] * _v(w)
            if k["p2"] > 0:
                y = m.add_var(f"Y[{i},{j}]", 0, uu)
                prods[("Y", i)] = y
                self._row(_v(y) - mbe - uu * xx + uu * dl, -uu, INF, f"Y[{i},{j}]")
                dur = dur + k["p2"] * _v(y)
            if k["p1"] > 0:
                nbits = max(1, cc.bit_length())
                bits = [m.add_var(f"beta[{i},{j},{b}]", 0, 1) for b in range(nbits)]
                self._row(cv - _sum(_v(bv, 2**b) for b, bv in enumerate(bits)), 0, 0, f"bits[{i},{j}]")
                big = cc + 2 * uu
                ells = []
                for b, bv in enumerate(bits):
                    ell = m.add_var(f"ell[{i},{j},{b}]", 0, big)
                    ells.append(ell)
                    self._row(_v(ell) - cv - 2 * mbe - big * _v(bv), -big, INF, f"ell[{i},{j},{b}]")
                prods[("bits", i)] = (bits, ells)
                q = _sum(_v(ell, 2**b) for b, ell in enumerate(ells)) - dl - 2 * _v(prods[("w", i)])
                dur = dur + k["p1"] * q
            if k["p3"] > 0:
                dur = dur + k["p3"] * (xx - dl)
        return dur

    # ---------------------------------------------------- solution vectors
    def vector_of(self, schedule: Schedule, *, check: bool = True) -> np.ndarray:
        """The full assignment of the last built model that represents ``schedule``.

        ``schedule`` is replayed through the core and every variable
        (auxiliaries included) is set from the replayed state. ``check=False``
        applies batches without checking them (tests: the vector a model would
        give an *illegal* schedule).
        """
        m, V, J = self._m, self._vars, self._J
        if "no-release" in self.holes:
            raise InputError("no vector for a legal schedule in the no-release model (it keeps finished KV)")
        if len(schedule.batches) > J:
            raise InputError(f"the schedule has {len(schedule.batches)} batches, more than the horizon {J}")
        x = np.array(m.lb, dtype=np.float64)  # fixed variables keep their value
        state = EngineState(self.instance, self.cost)
        n, R = self.n, range(self.n)
        Gp = np.zeros(n, dtype=np.int64)
        zacc = np.zeros(n, dtype=np.int64)
        prev_end = self.a_min
        durs = []
        for j in range(1, J + 1):
            kv_prev = state.kv.copy()
            refill_prev = state.refilling.copy()
            if j <= len(schedule.batches):
                b = schedule.batches[j - 1]
                ev = np.zeros(n, dtype=bool)
                ev[b.evicted] = True
                cvec = np.zeros(n, dtype=np.int64)
                cvec[b.requests] = b.tokens
                start, dur = b.start / self.scale, b.duration / self.scale
                if check:
                    state.step(b)
                else:
                    state.apply(b)
                nonempty = 1
            else:
                ev = np.zeros(n, dtype=bool)
                cvec = np.zeros(n, dtype=np.int64)
                start, dur, nonempty = prev_end, 0.0, 0
            mbv = np.where(ev, 0, kv_prev)
            refilling = np.where(ev, Gp > 0, refill_prev)  # the core's flag once evictions applied
            G = state.generated.copy()
            gv = G - Gp
            H_prev = Gp >= 1
            item = cvec >= 1
            if "phase-label" in self.holes:  # the notes' rule: generated before, one token left
                dec = item & H_prev & (self.prompt + Gp - mbv == 1)
            else:
                dec = item & H_prev & ~refilling
            x[V["u"][j]] = nonempty
            for i in R:
                x[V["c"][i][j]] = cvec[i]
                x[V["g"][i][j]] = gv[i]
                x[V["G"][i][j]] = G[i]
                x[V["d"][i][j]] = float(state.done[i])
                x[V["m"][i][j]] = state.kv[i]
                if V["e"][i][j] >= 0:
                    x[V["e"][i][j]] = float(ev[i])
                    x[V["mb"][i][j]] = mbv[i]
                if self._need_h:
                    x[V["H"][i][j]] = float(G[i] >= 1)
                if self.need_phase:
                    x[V["delta"][i][j]] = float(dec[i])
                    if self.exact_phase:
                        x[V["x"][i][j]] = float(item[i])
                if self.track_refill:
                    x[V["rho"][i][j]] = float(refilling[i])
                if V["alpha"][i] is not None:
                    x[V["alpha"][i][j]] = float(self.arrival[i] <= start + 1e-9)
                if V["eta"][i] is not None:
                    x[V["eta"][i][j]] = float(mbv[i] + cvec[i] >= 1)
            if self.timed:
                x[V["tau"][j]] = start
                x[V["E"][j]] = start + dur
            if not self.unit and self.exact_phase:
                self._products_values(x, j, cvec, mbv, dec, item)
            zacc = zacc + mbv + cvec
            for i in R:
                if self._zs[i]:
                    x[self._zs[i][j - 1]] = zacc[i]
            durs.append(dur)
            prev_end = start + dur
            Gp = G
        for var, i, k, j in self._zvars:
            x[var] = float(x[V["G"][i][j]] >= k)
        if self.timed and self.objective != "makespan":
            st = state
            when = st.completion if self.objective == "total-latency" else st.first_token
            for i in R:
                x[self._fin[i]] = when[i] / self.scale
        return x

    def _products_values(self, x, j, cvec, mbv, dec, item) -> None:
        prods = self._prods.get(j, {})
        if "v" in prods:
            x[prods["v"]] = float(dec.any())
        if "z" in prods:
            x[prods["z"]] = float((item & ~dec).any())
        for i in range(self.n):
            if ("w", i) in prods:
                x[prods[("w", i)]] = mbv[i] * float(dec[i])
            if ("Y", i) in prods:
                x[prods[("Y", i)]] = mbv[i] * float(item[i] and not dec[i])
            if ("bits", i) in prods:
                bits, ells = prods[("bits", i)]
                for b, (bv, ell) in enumerate(zip(bits, ells, strict=True)):
                    on = (int(cvec[i]) >> b) & 1
                    x[bv] = on
                    x[ell] = on * (cvec[i] + 2 * mbv[i])

    # ------------------------------------------------------------------ decode
    def schedule_from(self, sol: np.ndarray) -> Schedule:
        """Decode a solution vector of the last built model into batches, stepped through the core.

        Starts come from the model's ``tau`` (nudged onto the previous end or an
        item's arrival when within :data:`SNAP_TOL`); under unit time with
        simultaneous arrivals the batches run back to back. Phases and
        durations are the core's. Raises ScheduleError if the core rejects a batch.
        """
        V, J = self._vars, self._J
        state = EngineState(self.instance, self.cost)
        arrival = np.array([r.arrival for r in self.instance.requests])
        batches = []
        clock = self.a_min * self.scale
        for j in range(1, J + 1):
            cvec = np.array([round(sol[V["c"][i][j]]) for i in range(self.n)], dtype=np.int64)
            ev = [i for i in range(self.n) if V["e"][i][j] >= 0 and round(sol[V["e"][i][j]]) == 1]
            req = np.flatnonzero(cvec >= 1)
            if req.size == 0 and not ev:
                continue
            if self.timed:
                tau = float(sol[V["tau"][j]])
                start = (round(tau) if self.integral_time else tau) * self.scale
                tol = SNAP_TOL * max(1.0, abs(start))
                if state.num_batches and state.clock - tol <= start < state.clock:
                    start = state.clock
                if req.size:
                    latest = float(arrival[req].max())
                    if latest - tol <= start < latest:
                        start = latest
            else:
                start = clock
            batch = state.make_batch(start, req, cvec[req], ev)
            state.step(batch)
            batches.append(batch)
            clock = batch.end
        return Schedule(tuple(batches), {"formulation": "batch-indexed"})
