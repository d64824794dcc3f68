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
batch never helps, so lower bounds are exact at an optimum. Time is counted in
model units of ``scale`` seconds, the power of ten nearest below ``a0 + a1``
(a millisecond for the shipped coefficients), so that the back ends' absolute
tolerances stay far below a batch.

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
rows of :func:`~kvsched.csp.batchindexed.tokens.clique_sets` allow at most one of a set of tokens
that pairwise exceed M. On ShareGPT draws they lift the LP bound by about 4%
where one long prompt blocks the others.

*Dominance* (:attr:`BatchIndexed.normal_form`: unit time, no C and no P; keeps
an optimum, and :meth:`BatchIndexed.normalised` maps any schedule to one that
satisfies it, completing nobody later): a request processes tokens only in the
batches where it generates (all of them at once), and with evictions allowed a
request that sits a batch out holds no KV (evicting it is free: its refill rides
in the batch where it next generates, one slot whatever it processes). Then
``mb + c`` is exactly the weight of the token generated.

Where every request also arrives at once, the solve driver
(:mod:`kvsched.csp.formulations.batch`) solves the *token-indexed* model instead (:mod:`kvsched.csp.tokenindexed`): the same class
(the normal form loses no optimum) with the ``z`` alone, per-request deadlines
from LP bounds of the instance without each request, and the LP bound reported
beside the solver's. It proves the ShareGPT ÷ 40 draws of 6-15 requests that
this model left open at 14-20% (``benchmarks/solve.py --part batch``).

Symmetry: identical requests (same I, O and arrival) complete in index order
(``d[i,j] >= d[i',j]``, A4.2 #7); the warm start is relabelled to match.

``holes`` re-opens one of seed 003's holes (A4.2), for the tests that show each
fix is needed; see :data:`HOLES`.

Modules: :mod:`.data` (instance data, horizon), :mod:`.schedules` (warm starts,
normal form), :mod:`.variables`, :mod:`.builder` (one method per constraint
family, and the objective), :mod:`.durations` (infermax-linear batch time),
:mod:`.tokens` (token rows, cliques, dominance), :mod:`.codec` (the built model,
schedule <-> vector).
"""

from kvsched.csp.batchindexed.codec import BatchModel
from kvsched.csp.batchindexed.data import GRID_TOL, HOLES, SNAP_TOL, WARM_POLICIES, BatchData, Horizon
from kvsched.csp.batchindexed.expr import Lin, lin_sum, term
from kvsched.csp.batchindexed.model import BatchIndexed
from kvsched.csp.batchindexed.variables import Variables

__all__ = [
    "GRID_TOL",
    "HOLES",
    "SNAP_TOL",
    "WARM_POLICIES",
    "BatchData",
    "BatchIndexed",
    "BatchModel",
    "Horizon",
    "Lin",
    "Variables",
    "lin_sum",
    "term",
]
