"""Seed 002's schedulers: WAIT (§4, Algorithm 1) and Nested WAIT (§5, Algorithm 2).

Ao, Luo, Simchi-Levi and Wang (seed 002; digest ``shared/notes/002.md`` §3-4)
serve request *types* in stage-aligned pipelines sized by the fluid model of
:mod:`kvsched.heuristics.fluid` (read its docstring for the mapping of the
paper's (l, l') and KV ``l + s`` onto our (I, O = l' + 1) and KV held during
a batch: a paper stage s is a request that has generated s tokens).

WAIT (known output lengths)
---------------------------
Every type j has an integer threshold ``n_j``. A type is *eligible* when at
least ``n_j`` of its requests wait for prefill (stage 0); every eligible type
then advances ``min(n_j, count)`` requests from **every** stage (the prefill
queue included), in arrival order; ineligible types are frozen with their KV
kept (the "wait"). Every stage of a type so holds at most ``n_j`` requests and,
started empty, resident KV never exceeds ``M^pi = sum_j n_j S_j`` (the lifetime
KV mass S of :func:`~kvsched.heuristics.fluid.kv_mass`): WAIT never evicts when
``M^pi <= M``. Types are the distinct (I, O) pairs (``types="io"``) or the
``cls`` field (``types="cls"``, lengths per request, the fluid at the class
means); WAIT knows each request's type at arrival, hence its true O
(``uses_true_output``).

Nested WAIT (unknown output lengths)
------------------------------------
Output lengths ``O_1 < ... < O_m`` (types) cut the stages into nested
segments: segment k holds stages ``O_{k-1} .. O_k - 1`` (``O_0 = 0``), so a
request that has generated ``O_k`` tokens without finishing sits in the *entry
queue* of segment k + 1 (on the GPU, holding ``I + O_k - 1`` KV: the paper's
``l + l'_k``); segment 1's entry queue is the prefill queue. With ``K`` the
largest k such that every segment 1..k has at least ``n_k`` requests in its
entry queue (the prefix rule), every segment k <= K advances ``min(n_k,
count)`` requests from each of its stages; the rest wait. Only ``generated``
and ``done`` are read at run time. Requests longer than ``O_m`` stay in
segment m. The design (lengths, rates) is given (``design="given"``), taken
from the instance's ``predicted_output`` (``"predicted"``), or from its true
output distribution (``"outputs"``, default: an offline statistic, as the
paper's bins come from the data set; the view then exposes true lengths, but
the scheduler never reads a request's own length).

Thresholds
----------
``thresholds="fluid"`` (default): ``n = ceil(c * lambda)`` (WAIT) or
``n_k = ceil(c Lambda_k (1 + eps)^{k-1})`` (Nested, ``Lambda_k`` the rate of
types >= k, the margin making Eq. (12)'s ratio conditions strict), with
``c = Delta T* (1 + margin)``, the equilibrium per-stage count, when the fluid
is stable and it fits the limits; otherwise (overload, or ``M* > M``) the
largest ``c`` whose batch fits M (plus, for Nested, Theorem 2's safety buffer
(14) when ``buffer=True``), C and ``max_running``. ``"paper"``: §6.1's
``n_j = B rho_j / (l'_j + 1)`` (per-stage proportional to ``lambda_j / O_j``);
``"code"``: the authors' Vidur fork, ``n_j = B lambda_j / sum_i lambda_i O_i``
(per-stage proportional to ``lambda_j``, as the fluid), both floored, at least
1; ``B`` is ``batch_size`` or the instance's ``max_running``. ``given``
overrides all of these.

Arrival rates are ``rates`` or estimated per type as count over arrival span
(a burst, every request at once, uses the counts as relative rates).

§7 extensions
-------------
* Segment design (§7.2): :func:`design_segments` groups the types into L
  consecutive equal-count segments and picks the L that minimises Eq. (17)'s
  memory requirement (the paper plots it, U-shaped, but states no rule: our
  reading); ``NestedWAIT(segments="auto")`` uses it.
* Time-varying rates (§7.1, §8.1): :class:`AdaptiveWAIT` and
  :class:`AdaptiveNestedWAIT` re-solve the thresholds from rates re-estimated
  over the last arrivals, or from known piecewise-constant rates (the paper's
  "re-solving the fluid equilibrium"; the estimator is ours).

Engine mapping and what differs from the paper
----------------------------------------------
* Eq. (1)'s ``(d0, d1)`` come from the instance's time model when it is of
  that form (:func:`~kvsched.heuristics.fluid.eq1_coefficients`), else from a
  two-point probe of the cost model (decode batches), unless given.
* **Drain rule** (the paper has none; digest §7 item 18): once every request
  has arrived, the entry thresholds are dropped and every type / segment
  advances ``min(n, count)`` per stage, so a finite run finishes.
* **Safety net**: a batch that would break M, C, P or ``max_running`` (possible
  for Nested WAIT, or for thresholds that do not fit) is cut LIFO: requests not
  holding KV (new admissions, refills) are dropped latest-arrived first, then
  running requests by most recent admission; for memory they are *evicted*
  (the paper's LIFO eviction). Our eviction is recompute: the request keeps its
  tokens and refills ``I + G`` before decoding on, which Eq. (1) charges like a
  decode (the paper restarts it from stage 0 as a new arrival). A refilling
  request stays at its stage and is picked after the running ones.
* Prompts and refills are processed whole, except one longer than C or P,
  which goes in chunks of that size (the paper has no token budget; a chunked
  prompt spends several batches at stage 0).

Modules: :mod:`~kvsched.heuristics.wait.thresholds` (Eq. (1), the fluid
thresholds, Theorem 2's buffer), :mod:`~kvsched.heuristics.wait.gated` (the
stage-gated selection and its LIFO safety net, WAIT),
:mod:`~kvsched.heuristics.wait.nested` (Nested WAIT, §7.2's segment design),
:mod:`~kvsched.heuristics.wait.adaptive` (§7.1 / §8.1) and
:mod:`~kvsched.heuristics.wait.specs` (the registry entries).
"""

from kvsched.heuristics.wait.adaptive import AdaptiveNestedWAIT, AdaptiveWAIT
from kvsched.heuristics.wait.gated import WAIT
from kvsched.heuristics.wait.nested import NestedWAIT, SegmentChoice, design_segments, segment_groups
from kvsched.heuristics.wait.specs import SEED002_EXTENSIONS, SEED002_POLICIES
from kvsched.heuristics.wait.thresholds import (
    NestedDesign,
    boundary_theta,
    eq1_of,
    nested_design,
    wait_thresholds,
)

__all__ = [
    "SEED002_EXTENSIONS",
    "SEED002_POLICIES",
    "WAIT",
    "AdaptiveNestedWAIT",
    "AdaptiveWAIT",
    "NestedDesign",
    "NestedWAIT",
    "SegmentChoice",
    "boundary_theta",
    "design_segments",
    "eq1_of",
    "nested_design",
    "segment_groups",
    "wait_thresholds",
]
