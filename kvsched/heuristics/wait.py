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
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, get_args

import numpy as np

from kvsched.costmodel import make_cost_model
from kvsched.costmodel.base import BatchView
from kvsched.errors import InputError
from kvsched.heuristics.base import Decision, SchedulerView
from kvsched.heuristics.fluid import eq1_coefficients, fluid_equilibrium, instance_types, kv_mass
from kvsched.heuristics.spec import PolicySpec
from kvsched.instances.model import Instance, Limits, TimeModel

ThresholdMode = Literal["fluid", "paper", "code"]
TypeKey = Literal["io", "cls"]
Design = Literal["outputs", "predicted", "given"]


def _check_choice(name: str, value: Any, choices: Any) -> None:
    allowed = get_args(choices)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def eq1_of(time_model: TimeModel) -> tuple[float, float]:
    """Eq. (1)'s (d0, d1) for a time model: exact when it is of that form, else a two-point probe.

    The probe times a batch of 64 decodes with no context and one with 1024 KV
    tokens each: ``d1`` is the slope per KV token, ``d0`` the rest.
    """
    try:
        return eq1_coefficients(time_model)
    except InputError:
        pass
    model = make_cost_model(time_model.name, dict(time_model.params))
    n = 64
    phases = np.full(n, 1, dtype=np.int64)  # Phase.DECODE
    ones = np.ones(n, dtype=np.int64)
    t0 = model.batch_time(BatchView(ones, np.zeros(n, dtype=np.int64), phases))
    t1 = model.batch_time(BatchView(ones, np.full(n, 1024, dtype=np.int64), phases))
    d1 = max((t1 - t0) / (n * 1024), 0.0)
    d0 = max(t0 - d1 * n, 1e-12)
    return float(d0), float(d1)


# ============================================================================ thresholds


@dataclass(frozen=True, slots=True)
class _Budget:
    """Per-batch limits a full stage-aligned batch must respect (tokens of memory mass)."""

    memory: float
    tokens: float
    running: float

    @classmethod
    def of(cls, limits: Limits) -> _Budget:
        inf = float("inf")
        tok = [c for c in (limits.max_batch_tokens, limits.max_prefill_tokens) if c is not None]
        return cls(
            float(limits.kv_blocks * limits.block_size),
            float(min(tok)) if tok else inf,
            float(limits.max_running) if limits.max_running is not None else inf,
        )


def wait_thresholds(
    prompt: Sequence[int],
    output: Sequence[int],
    rates: Sequence[float],
    d0: float,
    d1: float,
    limits: Limits,
    *,
    mode: ThresholdMode = "fluid",
    margin: float = 0.0,
    batch_size: int | None = None,
    overload: bool = False,
    strict: bool = True,
) -> np.ndarray:
    """WAIT's per-stage thresholds ``n_j`` (see the module docstring).

    ``overload=True`` (a burst: every request at once) skips the equilibrium;
    ``rates`` are then only relative weights (e.g. the counts per type).

    Raises
    ------
    InputError
        When even one request per stage of every type does not fit the limits
        (fluid mode; with ``strict=False`` all ones are returned instead), or
        ``B`` is missing (paper/code modes).
    """
    _check_choice("thresholds", mode, ThresholdMode)
    I = np.asarray(prompt, dtype=np.int64)  # noqa: E741 -- the README's symbol
    O = np.asarray(output, dtype=np.int64)  # noqa: E741
    lam = np.asarray(rates, dtype=float)
    if mode != "fluid":
        B = batch_size if batch_size is not None else limits.max_running
        if B is None:
            raise InputError(f"thresholds={mode!r} needs batch_size or the instance's max_running")
        share = lam / lam.sum()
        raw = B * share / O if mode == "paper" else B * lam / float(lam @ O)
        return np.maximum(1, np.floor(raw + 1e-9)).astype(np.int64)
    budget = _Budget.of(limits)
    mass = kv_mass(I, O, limits.block_size).astype(float)
    tokens = (I + O - 1).astype(float)

    def fits(n: np.ndarray) -> bool:
        return bool(n @ mass <= budget.memory and n @ tokens <= budget.tokens and n @ O <= budget.running)

    if not overload:
        eq = fluid_equilibrium(lam, I, O, d0, d1)
        if eq.stable:
            n = np.maximum(1, np.ceil(eq.per_stage * (1.0 + margin) - 1e-9)).astype(np.int64)
            if fits(n):
                return n
    # Overload (or M* > M): the largest c with floor(c * lambda) fitting every limit.
    lam = lam / lam.max()
    c_hi = min(budget.memory / (lam @ mass), budget.tokens / (lam @ tokens), budget.running / (lam @ O))
    n = np.maximum(1, np.floor(c_hi * lam + 1e-9)).astype(np.int64)
    while not fits(n) and n.max() > 1:  # the max(1, .) floor can overshoot: shrink the largest
        n[np.argmax(n * mass)] -= 1
    if not fits(n) and strict:
        raise InputError(
            f"WAIT: one request per stage of every type needs {int(n @ mass)} KV tokens, "
            f"{int(n @ tokens)} tokens and {int(n @ O)} running requests a batch, over the limits "
            f"(M = {budget.memory:g}, C = {budget.tokens:g}, max_running = {budget.running:g})"
        )
    return n


def boundary_theta(n_prev: float, n_k: float, p: float) -> float:
    """Lemma 8 / Eq. (20): the root ``theta > 0`` of ``e^{-theta n_k} (1 - p + p e^theta)^{n_prev} = 1``.

    ``inf`` when the boundary queue cannot build up (``n_k >= n_prev`` or ``p = 0``);
    ``0`` when the drift ``n_k - n_prev p`` is not negative (no buffer suffices).
    """
    if p <= 0 or n_k >= n_prev:
        return math.inf
    if n_k - n_prev * p <= 0:
        return 0.0

    def g(th: float) -> float:
        return -th * n_k + n_prev * math.log1p(p * math.expm1(th))

    lo, hi = 0.0, 1.0
    while g(hi) < 0:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if g(mid) < 0:
            lo = mid
        else:
            hi = mid
    return hi


@dataclass(frozen=True, slots=True)
class NestedDesign:
    """Nested WAIT's segments and thresholds.

    Parameters
    ----------
    ends
        ``O_1 < ... < O_m``: segment k holds stages ``ends[k-1] .. ends[k] - 1``.
    rates
        Per-type arrival rates (type k ends at ``ends[k]``).
    thresholds
        ``n_k`` per segment.
    memory
        ``M^pi = sum_k n_k sum_{s in seg k} blocks(I + s)`` (exact; tokens).
    buffer
        Theorem 2's extra memory (14): ``sum_{k>=2} (I + O_{k-1} - 1)(n_k + ln(m B / delta) / theta_k)``
        (``inf`` when a boundary drift is not negative).
    """

    ends: np.ndarray
    rates: np.ndarray
    thresholds: np.ndarray
    memory: float
    buffer: float


def nested_design(
    ends: Sequence[int],
    rates: Sequence[float],
    prompt: int,
    d0: float,
    d1: float,
    limits: Limits,
    *,
    mode: ThresholdMode = "fluid",
    margin: float = 0.0,
    eps: float = 0.05,
    batch_size: int | None = None,
    buffer: bool = True,
    delta: float = 0.1,
    horizon: int = 10_000,
    overload: bool = False,
    strict: bool = True,
) -> NestedDesign:
    """Nested WAIT's thresholds for types ending at ``ends`` with common prompt ``prompt``.

    Fluid mode takes ``n_k = ceil(c Lambda_k (1 + eps)^{k-1})`` with ``c`` the
    equilibrium ``Delta T* (1 + margin)`` if the batch plus (with ``buffer``) the
    safety buffer of Eq. (14) (overflow probability ``delta`` over ``horizon``
    batches) fits the limits, else the largest ``c`` that fits; if no ``c`` fits
    with the buffer, the buffer is dropped; if one request a stage does not fit
    either, ``strict`` raises, else all thresholds are 1 (the policy's LIFO
    safety net then evicts as needed). Paper/code modes: ``n_k`` from §6
    (``proportional to Lambda_k``) with ``B`` (see :func:`wait_thresholds`).
    """
    _check_choice("thresholds", mode, ThresholdMode)
    e = np.asarray(ends, dtype=np.int64)
    lam = np.asarray(rates, dtype=float)
    if e.size == 0 or (np.diff(e) <= 0).any() or e[0] < 1 or lam.shape != e.shape:
        raise InputError("nested WAIT: ends must be increasing positive lengths, one rate each")
    starts = np.concatenate([[0], e[:-1]])
    b = limits.block_size
    seg_mass = np.array(
        [b * float((-(-(prompt + np.arange(s, t)) // b)).sum()) for s, t in zip(starts, e, strict=True)],
        dtype=float,
    )
    seg_tokens = np.array([prompt + (t - s) - 1 for s, t in zip(starts, e, strict=True)], dtype=float)
    seg_len = (e - starts).astype(float)
    boundary_kv = np.array([b * -(-(prompt + s - 1) // b) for s in starts], dtype=float)
    tail = np.cumsum(lam[::-1])[::-1]  # Lambda_k
    budget = _Budget.of(limits)
    m = e.size

    def buf(n: np.ndarray) -> float:
        total = 0.0
        for k in range(1, m):
            th = boundary_theta(n[k - 1], n[k], tail[k] / tail[k - 1])
            if th == 0.0:
                return math.inf
            total += boundary_kv[k] * (n[k] + (math.log(m * horizon / delta) / th if th < math.inf else 0.0))
        return total

    def fits(n: np.ndarray, with_buffer: bool) -> bool:
        mem = float(n @ seg_mass) + (buf(n) if with_buffer else 0.0)
        return bool(
            mem <= budget.memory and n @ seg_tokens <= budget.tokens and n @ seg_len <= budget.running
        )

    def design(n: np.ndarray) -> NestedDesign:
        return NestedDesign(e, lam, n, float(n @ seg_mass), buf(n))

    if mode != "fluid":
        B = batch_size if batch_size is not None else limits.max_running
        if B is None:
            raise InputError(f"thresholds={mode!r} needs batch_size or the instance's max_running")
        n = np.maximum(1, np.floor(B * tail / float(tail @ seg_len) + 1e-9)).astype(np.int64)
        return design(n)
    shape = tail * (1.0 + eps) ** np.arange(m)

    def n_of(c: float) -> np.ndarray:
        return np.maximum(1, np.ceil(c * shape - 1e-9)).astype(np.int64)

    if not overload:
        per_type_prompt = np.full(m, prompt)
        eq = fluid_equilibrium(lam, per_type_prompt, e, d0, d1)
        if eq.stable:
            c = eq.iteration_time * (1.0 + margin)
            for with_buffer in (True, False) if buffer else (False,):
                if fits(n_of(c), with_buffer):
                    return design(n_of(c))
    # Overload (or too big): bisection on the largest threshold c * max(shape).
    for with_buffer in (True, False) if buffer else (False,):
        if not fits(n_of(0.0), with_buffer):
            continue
        lo, hi = 0.0, budget.memory / float(seg_mass.min()) + 1.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if fits(n_of(mid / shape.max()), with_buffer):
                lo = mid
            else:
                hi = mid
        return design(n_of(lo / shape.max()))
    if not strict:
        return design(np.ones(m, dtype=np.int64))
    raise InputError(
        f"nested WAIT: one request per stage of every segment needs {int(seg_mass.sum())} KV tokens "
        f"and {int(seg_len.sum())} running requests a batch, over the limits"
    )


# ============================================================================ policies


class _StageGated:
    """What WAIT and Nested WAIT share: per-group stage-aligned selection and the LIFO safety net.

    A subclass gives every active request a *group* (a type, or a segment) and
    says which groups are eligible; a group advances ``min(n_g, count)`` requests
    from each of its stages.
    """

    name: str
    uses_true_output: bool
    thresholds_: np.ndarray

    def _setup(self, instance: Instance) -> None:
        lim = instance.limits
        caps = [c for c in (lim.max_batch_tokens, lim.max_prefill_tokens) if c is not None]
        cap = min(caps) if caps else None
        self._prompt = np.array([r.prompt for r in instance.requests], dtype=np.int64)
        self._chunk = cap  # the longest prefill or refill chunk
        self._limits = lim
        self._block = lim.block_size
        self._capacity = lim.kv_blocks
        n = len(instance)
        arrival = np.array([r.arrival for r in instance.requests])
        self._rank = np.empty(n, dtype=np.int64)
        self._rank[np.argsort(arrival, kind="stable")] = np.arange(n)
        self._stamp = np.full(n, -1, dtype=np.int64)  # batch of the last (re)admission
        self._batches = 0
        self.evictions = 0

    # subclass hooks ------------------------------------------------------
    def _groups(self, act: np.ndarray, stage: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _entry(self, group: np.ndarray, stage: np.ndarray) -> np.ndarray:
        """Whether each request is in its group's entry queue."""
        raise NotImplementedError

    def _eligible(self, entry_counts: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    # ------------------------------------------------------------------------
    def next_batch(self, view: SchedulerView) -> Decision | None:
        act = view.active()
        if act.size == 0:
            return None
        stage = view.generated[act]
        group = self._groups(act, stage)
        G = self.thresholds_.size
        if view.next_arrival() is None:  # drain rule: every request is in, thresholds are dropped
            eligible = np.bincount(group, minlength=G) > 0
        else:
            entry = np.bincount(group[self._entry(group, stage)], minlength=G)
            eligible = self._eligible(entry)
        keep = eligible[group]
        if not keep.any():
            return None
        act, stage, group = act[keep], stage[keep], group[keep]
        holding = view.kv[act] > 0
        # Within a (group, stage): running requests first, then by arrival.
        order = np.lexsort((self._rank[act], ~holding, stage, group))
        act, stage, group = act[order], stage[order], group[order]
        new = np.ones(act.size, dtype=bool)
        new[1:] = (group[1:] != group[:-1]) | (stage[1:] != stage[:-1])
        starts = np.flatnonzero(new)
        within = np.arange(act.size) - np.repeat(starts, np.diff(np.append(starts, act.size)))
        sel = act[within < self.thresholds_[group]]
        return self._fit(view, sel)

    def _fit(self, view: SchedulerView, sel: np.ndarray) -> Decision | None:
        """Cut ``sel`` LIFO until the batch fits M, C, P and max_running (evicting for memory)."""
        b = self._block
        kv = view.kv
        tok = np.asarray(view.unprocessed(sel), dtype=np.int64)
        if self._chunk is not None:
            tok = np.minimum(tok, self._chunk)  # a prompt or refill over C or P goes in chunks
        lim = self._limits
        inf = float("inf")
        c_cap = lim.max_batch_tokens if lim.max_batch_tokens is not None else inf
        p_cap = lim.max_prefill_tokens if lim.max_prefill_tokens is not None else inf
        r_cap = lim.max_running if lim.max_running is not None else inf
        holds = kv[sel] > 0
        fresh = ~holds | (view.generated[sel] == 0) | view.refilling[sel]  # prefill/refill items
        in_batch = dict(zip(sel.tolist(), range(sel.size), strict=True))
        alive = np.ones(sel.size, dtype=bool)
        running_all = np.flatnonzero(kv > 0)
        held_blocks = int((-(-kv[running_all] // b)).sum())
        during = -(-(kv[sel] + tok) // b) - (-(-kv[sel] // b))  # extra blocks of the batch's items
        blocks = held_blocks + int(during.sum())
        tokens = int(tok.sum())
        prefill = int(tok[fresh].sum())
        running = running_all.size + int((~holds).sum())
        # LIFO: items not holding KV by arrival (latest first), then running ones by admission.
        order_new = [i for i in np.argsort(-self._rank[sel], kind="stable").tolist() if not holds[i]]
        evicted: list[int] = []
        k_new = 0

        def drop(i: int) -> None:
            nonlocal blocks, tokens, prefill, running
            alive[i] = False
            blocks -= int(during[i])
            tokens -= int(tok[i])
            if fresh[i]:
                prefill -= int(tok[i])
            if not holds[i]:
                running -= 1

        while (
            tokens > c_cap or prefill > p_cap or running > r_cap or blocks > self._capacity
        ) and k_new < len(order_new):
            drop(order_new[k_new])
            k_new += 1
        if tokens > c_cap or prefill > p_cap or blocks > self._capacity:
            victims = running_all[np.argsort(-self._stamp[running_all], kind="stable")].tolist()
            for r in victims:
                if not (tokens > c_cap or prefill > p_cap or blocks > self._capacity):
                    break
                i = in_batch.get(r)
                if blocks > self._capacity:  # memory: evict (LIFO by admission)
                    if i is not None and alive[i]:
                        drop(i)
                    evicted.append(r)
                    blocks -= int(-(-kv[r] // b))
                    running -= 1
                elif i is not None and alive[i]:  # a budget: pause the running request
                    drop(i)
        sel, tok = sel[alive], tok[alive]
        if sel.size == 0:
            return None
        admitted = sel[kv[sel] == 0]
        self._stamp[admitted] = self._batches
        self._batches += 1
        self.evictions += len(evicted)
        return Decision(sel.tolist(), tok.tolist(), evicted)


class WAIT(_StageGated):
    """WAIT: seed 002 §4, Algorithm 1 (known output lengths; see the module docstring).

    Parameters
    ----------
    name
        Registry name.
    types
        ``"io"``: one type per distinct (I, O); ``"cls"``: one per ``cls`` value.
    thresholds
        ``"fluid"``, ``"paper"`` or ``"code"`` (module docstring).
    given
        Explicit per-type thresholds (types in :func:`~kvsched.heuristics.fluid.instance_types` order).
    rates
        Per-type arrival rates (same order); estimated from the instance when ``None``.
    margin
        Fluid mode: thresholds ``ceil(lambda_j Delta T* (1 + margin))``; > 0 gives Theorem 1's strict regime.
    batch_size
        ``B`` for the paper/code formulas (default: the instance's ``max_running``).
    d0, d1
        Eq. (1)'s coefficients; from the instance's time model when ``None``.
    """

    uses_true_output = True

    def __init__(
        self,
        name: str = "wait",
        *,
        types: TypeKey = "io",
        thresholds: ThresholdMode = "fluid",
        given: Sequence[int] | None = None,
        rates: Sequence[float] | None = None,
        margin: float = 0.0,
        batch_size: int | None = None,
        d0: float | None = None,
        d1: float | None = None,
    ) -> None:
        _check_choice("types", types, TypeKey)
        _check_choice("thresholds", thresholds, ThresholdMode)
        if margin < 0:
            raise ValueError(f"margin must be >= 0; got {margin}")
        self.name = name
        self.types = types
        self.thresholds = thresholds
        self.given = tuple(int(v) for v in given) if given is not None else None
        self.rates = tuple(float(v) for v in rates) if rates is not None else None
        self.margin = float(margin)
        self.batch_size = batch_size
        self.d0, self.d1 = d0, d1

    @property
    def params(self) -> Mapping[str, Any]:
        return {
            "types": self.types,
            "thresholds": self.thresholds,
            "given": self.given,
            "rates": self.rates,
            "margin": self.margin,
            "batch_size": self.batch_size,
            "d0": self.d0,
            "d1": self.d1,
        }

    def __repr__(self) -> str:
        return f"WAIT({self.name!r}, thresholds={self.thresholds!r})"

    def reset(self, instance: Instance) -> None:
        self._setup(instance)
        t = instance_types(instance, self.types)
        self.types_ = t
        self._type = t.of
        m = t.prompt.size
        d0, d1 = eq1_of(instance.time_model)
        d0 = self.d0 if self.d0 is not None else d0
        d1 = self.d1 if self.d1 is not None else d1
        rates = np.asarray(self.rates, dtype=float) if self.rates is not None else t.rates
        if rates.size != m:
            raise InputError(f"policy {self.name!r}: {rates.size} rates for {m} request types")
        burst = not np.isfinite(rates).all()  # every request at once: overload, counts as weights
        weights = t.count.astype(float) if burst else rates
        if self.given is not None:
            if len(self.given) != m or min(self.given) < 1:
                raise InputError(f"policy {self.name!r}: given needs {m} thresholds >= 1")
            n = np.array(self.given, dtype=np.int64)
        else:
            n = wait_thresholds(
                t.prompt, t.output, weights, d0, d1, instance.limits, mode=self.thresholds,
                margin=self.margin, batch_size=self.batch_size, overload=burst, strict=False,
            )  # fmt: skip
        mass = kv_mass(t.prompt, t.output, instance.limits.block_size)
        # M^pi: the KV of a full batch; above M (too many types for one request a stage, or
        # paper/code thresholds) the LIFO safety net keeps the run legal, evicting if needed.
        self.memory_ = int(n @ mass)
        self.thresholds_ = n
        self.rates_ = rates
        self.eq1_ = (d0, d1)

    def _groups(self, act: np.ndarray, stage: np.ndarray) -> np.ndarray:
        return self._type[act]

    def _entry(self, group: np.ndarray, stage: np.ndarray) -> np.ndarray:
        return stage == 0

    def _eligible(self, entry_counts: np.ndarray) -> np.ndarray:
        return entry_counts >= self.thresholds_


class NestedWAIT(_StageGated):
    """Nested WAIT: seed 002 §5, Algorithm 2 (unknown output lengths; see the module docstring).

    Parameters
    ----------
    name
        Registry name.
    design
        Where the segment ends and rates come from: ``"outputs"`` (the
        instance's output distribution; hindsight at design time only),
        ``"predicted"`` (``predicted_output``) or ``"given"`` (``ends`` and
        ``rates``).
    segments
        At most this many segments when the design is read from an instance:
        distinct lengths if few enough, else equal-width bins up to the longest
        (the paper's 10 bins of 50). ``"auto"``: §7.2's segment design
        (:func:`design_segments`): the distinct lengths are the types, grouped
        into the number of consecutive equal-count segments that minimises
        Eq. (17)'s memory requirement; in overload (no fluid equilibrium, so
        Eq. (16) cannot hold) or for a burst it falls back to 10.
    ends, rates
        Segment ends ``O_1 < ... < O_m`` and per-type rates, for ``design="given"``.
    thresholds, given, margin, batch_size, d0, d1
        As :class:`WAIT` (``given``: per segment).
    eps
        Geometric margin of the fluid thresholds (strict Eq. (12)).
    buffer, delta, horizon
        Reserve Theorem 2's safety buffer (14) for overflow probability
        ``delta`` over ``horizon`` batches when sizing fluid thresholds.
    """

    def __init__(
        self,
        name: str = "nested-wait",
        *,
        design: Design = "outputs",
        segments: int | Literal["auto"] = 10,
        ends: Sequence[int] | None = None,
        rates: Sequence[float] | None = None,
        thresholds: ThresholdMode = "fluid",
        given: Sequence[int] | None = None,
        margin: float = 0.0,
        eps: float = 0.05,
        buffer: bool = True,
        delta: float = 0.1,
        horizon: int = 10_000,
        batch_size: int | None = None,
        d0: float | None = None,
        d1: float | None = None,
    ) -> None:
        _check_choice("design", design, Design)
        _check_choice("thresholds", thresholds, ThresholdMode)
        if design == "given" and (ends is None or rates is None):
            raise ValueError("design='given' needs ends and rates")
        if isinstance(segments, str) and segments != "auto":
            segments = int(segments)  # from the command line
        if (segments != "auto" and segments < 1) or not 0 < delta < 1 or eps < 0 or margin < 0:
            raise ValueError("need segments >= 1 or 'auto', 0 < delta < 1, eps >= 0 and margin >= 0")
        self.name = name
        self.design = design
        self.segments: int | Literal["auto"] = segments if segments == "auto" else int(segments)
        self.ends = tuple(int(v) for v in ends) if ends is not None else None
        self.rates = tuple(float(v) for v in rates) if rates is not None else None
        self.thresholds = thresholds
        self.given = tuple(int(v) for v in given) if given is not None else None
        self.margin, self.eps = float(margin), float(eps)
        self.buffer, self.delta, self.horizon = bool(buffer), float(delta), int(horizon)
        self.batch_size = batch_size
        self.d0, self.d1 = d0, d1
        self.uses_true_output = design == "outputs"

    @property
    def params(self) -> Mapping[str, Any]:
        keys = ("design", "segments", "ends", "rates", "thresholds", "given", "margin", "eps")
        keys += ("buffer", "delta", "horizon", "batch_size", "d0", "d1")
        return {k: getattr(self, k) for k in keys}

    def __repr__(self) -> str:
        return f"NestedWAIT({self.name!r}, design={self.design!r})"

    def _read_design(
        self, instance: Instance, prompt: int = 1, d0: float = 1.0, d1: float = 0.0
    ) -> tuple[np.ndarray, np.ndarray]:
        self.segment_choice_: SegmentChoice | None = None
        if self.design == "given":
            return np.array(self.ends), np.array(self.rates)
        if self.design == "predicted":
            if any(r.predicted_output is None for r in instance.requests):
                raise InputError(
                    f"policy {self.name!r}: design='predicted' needs predicted_output everywhere"
                )
            lengths = np.array([r.predicted_output for r in instance.requests], dtype=np.int64)
        else:
            lengths = np.array([r.output for r in instance.requests], dtype=np.int64)
        uniq, per_length = np.unique(lengths, return_counts=True)
        arrivals = np.array([r.arrival for r in instance.requests])
        span = float(arrivals.max() - arrivals.min())
        count = self.segments
        if count == "auto":
            count = 10  # the fallback: §6's 10 bins
            if span > 0:
                choice = design_segments(
                    uniq, per_length / span, prompt, d0, d1, instance.limits.block_size,
                    eps=self.eps, delta=self.delta, horizon=self.horizon,
                )  # fmt: skip
                if choice is not None:
                    self.segment_choice_ = choice
                    return choice.ends, choice.rates
        if uniq.size <= count:
            ends = uniq
        else:
            width = -(-int(uniq.max()) // count)
            ends = np.unique(np.minimum(width * np.arange(1, count + 1), uniq.max()))
        # A length joins the first bin ending at or after it.
        kind = np.searchsorted(ends, lengths, side="left")
        counts = np.bincount(np.minimum(kind, ends.size - 1), minlength=ends.size).astype(float)
        keep = counts > 0
        ends, counts = ends[keep], counts[keep]
        return ends, (counts / span if span > 0 else counts * math.inf)

    def reset(self, instance: Instance) -> None:
        self._setup(instance)
        d0, d1 = eq1_of(instance.time_model)
        d0 = self.d0 if self.d0 is not None else d0
        d1 = self.d1 if self.d1 is not None else d1
        prompt = round(float(self._prompt.mean()))
        ends, rates = self._read_design(instance, prompt, d0, d1)
        if self.given is not None:
            if len(self.given) != ends.size or min(self.given) < 1:
                raise InputError(f"policy {self.name!r}: given needs {ends.size} thresholds >= 1")
            design = NestedDesign(ends, rates, np.array(self.given, dtype=np.int64), math.nan, math.nan)
        else:
            burst = not np.isfinite(rates).all()  # every request at once: overload, counts as weights
            weights = np.asarray(self._burst_counts(instance, ends), dtype=float) if burst else rates
            design = nested_design(
                ends, weights, prompt, d0, d1, self._limits, mode=self.thresholds, margin=self.margin,
                eps=self.eps, batch_size=self.batch_size, buffer=self.buffer, delta=self.delta,
                horizon=self.horizon, overload=burst, strict=False,
            )  # fmt: skip
        self.design_ = design
        self.thresholds_ = design.thresholds
        self._starts = np.concatenate([[0], design.ends[:-1]])
        self.eq1_ = (d0, d1)

    def _burst_counts(self, instance: Instance, ends: np.ndarray) -> np.ndarray:
        if self.design == "given":
            return np.asarray(self.rates, dtype=float)
        src = [r.output if self.design == "outputs" else r.predicted_output for r in instance.requests]
        kind = np.minimum(np.searchsorted(ends, np.array(src), side="left"), ends.size - 1)
        return np.bincount(kind, minlength=ends.size)

    def _groups(self, act: np.ndarray, stage: np.ndarray) -> np.ndarray:
        return np.searchsorted(self._starts, stage, side="right") - 1

    def _entry(self, group: np.ndarray, stage: np.ndarray) -> np.ndarray:
        return stage == self._starts[group]

    def _eligible(self, entry_counts: np.ndarray) -> np.ndarray:
        ok = entry_counts >= self.thresholds_
        return np.cumprod(ok).astype(bool)  # the prefix rule


# ============================================================================ §7 extensions


def segment_groups(m: int, count: int) -> list[np.ndarray]:
    """§7.2's partition of types ``0 .. m-1`` (sorted by length) into ``count`` consecutive segments.

    The paper takes ``Delta L = m / L`` types a segment (types 1 .. Delta L, Delta L + 1 ..
    2 Delta L, ...), assuming L divides m; otherwise (our reading) the sizes differ by
    at most one, the longer segments first (:func:`numpy.array_split`).
    """
    if not 1 <= count <= m:
        raise ValueError(f"need 1 <= segments <= {m} types; got {count}")
    return np.array_split(np.arange(m), count)


@dataclass(frozen=True, slots=True)
class SegmentChoice:
    """The outcome of §7.2's segment design (:func:`design_segments`).

    Parameters
    ----------
    count
        The chosen number of segments L.
    ends, rates
        Its segments: the longest output of each, and the aggregated rate ``lambda'_k``.
    memory
        Eq. (17)'s terms per candidate L = 1, 2, ... (rows): the batch memory
        ``M^pi`` (Term 1), the boundary queues ``sum_k (l + l'_{k-1}) n_k`` (Term 2) and the
        safety buffer ``sum_k (l + l'_{k-1}) ln(L B / delta) / theta_k`` (Term 3); ``inf``
        where Eq. (16) cannot hold (an unstable fluid, or a boundary with no negative drift).
    """

    count: int
    ends: np.ndarray
    rates: np.ndarray
    memory: np.ndarray

    @property
    def total(self) -> np.ndarray:
        """Eq. (17)'s requirement per candidate L (the sum of the three terms)."""
        return self.memory.sum(axis=1)


def design_segments(
    lengths: Sequence[int],
    rates: Sequence[float],
    prompt: int,
    d0: float,
    d1: float,
    block_size: int = 1,
    *,
    max_segments: int = 64,
    eps: float = 0.05,
    delta: float = 0.1,
    horizon: int = 10_000,
) -> SegmentChoice | None:
    """§7.2's segment design: how many segments Nested WAIT should group its types into.

    Seed 002 §7.2 groups the m types (output lengths ``l'_1 < ... < l'_m``) into L
    consecutive equal-count segments (:func:`segment_groups`), each with the
    aggregated rate ``lambda'_k`` and a threshold satisfying Eq. (16), and plots
    Eq. (17)'s memory requirement against L (Figures 15-18): U-shaped, "too few
    segments waste memory by over-provisioning for heterogeneous types, ... too
    many ... increase overhead from maintaining separate queues". The paper names
    no selection rule; **our reading** takes the L (up to ``max_segments``; ties:
    the smallest) that minimises that requirement, with thresholds as
    :func:`nested_design` sizes them at the fluid equilibrium (``n_k = ceil(Delta T*
    Lambda_k (1 + eps)^(k-1))``, which meets Eq. (16) strictly) and the memory
    computed exactly rather than with the printed ``k Delta L / 2`` midpoints
    (digest ``002.md`` §7 item 9). Memory limits play no part: the requirement is
    what the design *needs*.

    Returns ``None`` when no L gives a finite requirement (overload: no equilibrium).
    """
    order = np.argsort(np.asarray(lengths), kind="stable")
    lens = np.asarray(lengths, dtype=np.int64)[order]
    lam = np.asarray(rates, dtype=float)[order]
    if lens.size == 0 or (np.diff(lens) <= 0).any() or lam.shape != lens.shape:
        raise InputError("segment design: lengths must be distinct, one rate each")
    unbounded = Limits(kv_capacity=2**62 // block_size * block_size, block_size=block_size)
    top = min(lens.size, max_segments)
    memory = np.full((top, 3), math.inf)
    for count in range(1, top + 1):
        groups = segment_groups(lens.size, count)
        ends = np.array([lens[g[-1]] for g in groups])
        seg = np.array([lam[g].sum() for g in groups])
        if not fluid_equilibrium(seg, np.full(count, prompt), ends, d0, d1).stable:
            continue
        d = nested_design(ends, seg, prompt, d0, d1, unbounded, eps=eps, delta=delta, horizon=horizon)
        if not math.isfinite(d.buffer):
            continue
        starts = np.concatenate([[0], ends[:-1]])
        boundary = block_size * -(-(prompt + starts[1:] - 1) // block_size)
        queues = float(boundary @ d.thresholds[1:])
        memory[count - 1] = (d.memory, queues, d.buffer - queues)
    total = memory.sum(axis=1)
    if not np.isfinite(total).any():
        return None
    best = int(np.argmin(total)) + 1
    groups = segment_groups(lens.size, best)
    return SegmentChoice(
        best,
        np.array([lens[g[-1]] for g in groups]),
        np.array([lam[g].sum() for g in groups]),
        memory,
    )


class _RateTracker:
    """Arrival rates per type, for §7.1's time-varying rates (see :class:`AdaptiveWAIT`).

    Estimated at ``now`` from the last ``window`` arrivals (at most): type j's count
    among them over ``now`` minus the oldest one's arrival, so a lull lowers the
    estimate even before the next arrival. Or, with ``schedule`` (piecewise-constant
    known rates, ``(start, rates)`` pairs), the entry in force at ``now``.
    """

    def __init__(
        self,
        arrival: np.ndarray,
        kind: np.ndarray,
        m: int,
        window: int,
        min_arrivals: int,
        schedule: Sequence[tuple[float, Sequence[float]]] | None,
    ) -> None:
        order = np.argsort(arrival, kind="stable")
        self._arrival = arrival[order]
        self._kind = kind[order]
        self._m = m
        self._window = window
        self._min = min_arrivals
        self._schedule = None
        if schedule is not None:
            starts = [float(t) for t, _ in schedule]
            table = [np.asarray(r, dtype=float) for _, r in schedule]
            if any(r.shape != (m,) for r in table) or sorted(starts) != starts:
                raise InputError(f"rate schedule: start times must increase and give {m} rates each")
            self._schedule = (starts, table)

    def rates(self, now: float, arrived: int) -> np.ndarray | None:
        """The rates at ``now`` with ``arrived`` requests in (``None``: too few to tell)."""
        if self._schedule is not None:
            starts, table = self._schedule
            k = int(np.searchsorted(starts, now, side="right")) - 1
            return table[max(k, 0)]
        lo = max(arrived - self._window, 0)
        span = now - float(self._arrival[lo]) if arrived > 0 else 0.0
        if arrived - lo < self._min or span <= 0:
            return None
        return np.bincount(self._kind[lo:arrived], minlength=self._m) / span


class _Adaptive:
    """What the adaptive WAIT policies share: the rate estimate and when it calls for new thresholds.

    A subclass's ``reset`` sets ``_tracker``, ``rates_`` and ``thresholds_``; its
    ``_resolve(rates)`` returns new thresholds for ``rates`` (and keeps any design).
    """

    def _init_adaptive(
        self,
        window: int,
        min_arrivals: int,
        tolerance: float,
        schedule: Sequence[tuple[float, Sequence[float]]] | None,
    ) -> None:
        if window < 1 or min_arrivals < 1 or tolerance < 0:
            raise ValueError("need window >= 1, min_arrivals >= 1 and tolerance >= 0")
        self.window, self.min_arrivals, self.tolerance = int(window), int(min_arrivals), float(tolerance)
        self.schedule = tuple((float(t), tuple(map(float, r))) for t, r in schedule) if schedule else None

    @property
    def params(self) -> Mapping[str, Any]:
        own = {"window": self.window, "min_arrivals": self.min_arrivals, "tolerance": self.tolerance}
        return {**super().params, **own, "schedule": self.schedule}  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, window={self.window})"  # type: ignore[attr-defined]

    def _estimate(self, view: SchedulerView) -> np.ndarray | None:
        """The tracker's rates, as the subclass reads them (per type or per segment), or None."""
        return self._tracker.rates(view.now, view.num_arrived)

    def _adapt(self, view: SchedulerView) -> None:
        if view.next_arrival() is None:
            return  # drain: a window with no more arrivals would shrink the per-stage caps to 1
        rates = self._estimate(view)
        if rates is None or rates.sum() <= 0:
            return
        cur = self.rates_
        if np.isfinite(cur).all() and np.abs(rates - cur).sum() <= self.tolerance * cur.sum():
            return
        self.rates_ = rates
        n = self._resolve(rates)
        if not np.array_equal(n, self.thresholds_):
            self.thresholds_ = n
            self.threshold_history_.append((float(view.now), tuple(int(v) for v in n)))

    def next_batch(self, view: SchedulerView) -> Decision | None:
        self._adapt(view)
        return super().next_batch(view)  # type: ignore[misc]


class AdaptiveWAIT(_Adaptive, WAIT):
    """WAIT under time-varying arrival rates: seed 002 §7.1 and §8.1.

    §7.1 keeps Algorithm 1 and asks the threshold conditions (15) to hold at every
    instant with the accumulated arrivals over each iteration window; its proof
    (App. D) sizes thresholds for the *worst-case* rate. §8.1: "our algorithm can be
    directly adapted to scenarios with moderate variations in arrival rates ... by
    re-solving the fluid equilibrium". We implement §8.1's recipe (our reading of
    how to apply §7.1 online; the paper gives no estimator): before each batch the
    per-type rates are re-estimated (:class:`_RateTracker`, the last ``window``
    arrivals, or a known piecewise-constant ``schedule``) and, when they moved by
    more than ``tolerance`` (L1, relative), the thresholds are re-solved exactly as
    :class:`WAIT` sizes them (the fluid equilibrium, or the largest that fit M when
    overloaded). The first thresholds are WAIT's (from ``rates`` or the instance).
    A drop in a threshold leaves extra requests at a stage waiting (KV kept); a rise
    admits more. ``threshold_history_`` records ``(time, thresholds)`` at each change.

    Parameters
    ----------
    window
        Arrivals the rate estimate looks back over.
    min_arrivals
        Fewer arrivals in the window keep the current thresholds.
    tolerance
        Relative L1 change of the rates that triggers a re-solve.
    schedule
        Known piecewise-constant rates: ``(start time, per-type rates)`` pairs
        (types in :func:`~kvsched.heuristics.fluid.instance_types` order), instead of estimates.
    types, thresholds, rates, margin, batch_size, d0, d1
        As :class:`WAIT` (no ``given``: fixed thresholds do not adapt).
    """

    def __init__(
        self,
        name: str = "wait-adaptive",
        *,
        window: int = 200,
        min_arrivals: int = 20,
        tolerance: float = 0.1,
        schedule: Sequence[tuple[float, Sequence[float]]] | None = None,
        types: TypeKey = "io",
        thresholds: ThresholdMode = "fluid",
        rates: Sequence[float] | None = None,
        margin: float = 0.0,
        batch_size: int | None = None,
        d0: float | None = None,
        d1: float | None = None,
    ) -> None:
        self._init_adaptive(window, min_arrivals, tolerance, schedule)
        super().__init__(
            name, types=types, thresholds=thresholds, rates=rates, margin=margin, batch_size=batch_size,
            d0=d0, d1=d1,
        )  # fmt: skip

    def reset(self, instance: Instance) -> None:
        super().reset(instance)
        arrival = np.array([r.arrival for r in instance.requests])
        m = self.thresholds_.size
        self._tracker = _RateTracker(arrival, self._type, m, self.window, self.min_arrivals, self.schedule)
        self._limits_all = instance.limits
        self.threshold_history_: list[tuple[float, tuple[int, ...]]] = [(0.0, tuple(self.thresholds_))]

    def _resolve(self, rates: np.ndarray) -> np.ndarray:
        t = self.types_
        d0, d1 = self.eq1_
        return wait_thresholds(
            t.prompt, t.output, rates, d0, d1, self._limits_all, mode=self.thresholds, margin=self.margin,
            batch_size=self.batch_size, strict=False,
        )  # fmt: skip


class AdaptiveNestedWAIT(_Adaptive, NestedWAIT):
    """Nested WAIT under time-varying arrival rates: seed 002 §7.1 and §8.1.

    As :class:`AdaptiveWAIT`, with one difference: Nested WAIT does not know a
    request's type at arrival, so only the *total* rate is re-estimated (the last
    ``window`` arrivals), and the design's type mix (its continuation probabilities
    ``p_k``) is kept: the segment rates are the design's, scaled to the estimate,
    and the thresholds are re-sized by :func:`nested_design` (our reading; §7.1's
    conditions (15) are on accumulated per-type arrivals, which an online scheduler
    cannot count before the types reveal themselves). ``schedule`` gives known
    piecewise-constant per-segment rates instead (one per segment of the design).
    """

    def __init__(
        self,
        name: str = "nested-wait-adaptive",
        *,
        window: int = 200,
        min_arrivals: int = 20,
        tolerance: float = 0.1,
        schedule: Sequence[tuple[float, Sequence[float]]] | None = None,
        design: Design = "outputs",
        segments: int | Literal["auto"] = 10,
        ends: Sequence[int] | None = None,
        rates: Sequence[float] | None = None,
        thresholds: ThresholdMode = "fluid",
        margin: float = 0.0,
        eps: float = 0.05,
        buffer: bool = True,
        delta: float = 0.1,
        horizon: int = 10_000,
        batch_size: int | None = None,
        d0: float | None = None,
        d1: float | None = None,
    ) -> None:
        self._init_adaptive(window, min_arrivals, tolerance, schedule)
        super().__init__(
            name, design=design, segments=segments, ends=ends, rates=rates, thresholds=thresholds,
            margin=margin, eps=eps, buffer=buffer, delta=delta, horizon=horizon, batch_size=batch_size,
            d0=d0, d1=d1,
        )  # fmt: skip

    def reset(self, instance: Instance) -> None:
        super().reset(instance)
        arrival = np.array([r.arrival for r in instance.requests])
        m = self.thresholds_.size
        kind = np.zeros(arrival.size, dtype=np.int64)  # one stream: the total rate
        if self.schedule is not None:
            self._tracker = _RateTracker(arrival, kind, m, self.window, self.min_arrivals, self.schedule)
        else:
            self._tracker = _RateTracker(arrival, kind, 1, self.window, self.min_arrivals, None)
        rates = self.design_.rates
        self._mix = rates / rates.sum() if np.isfinite(rates).all() and rates.sum() > 0 else None
        self._prompt_mean = round(float(self._prompt.mean()))
        self.rates_ = rates
        self.threshold_history_: list[tuple[float, tuple[int, ...]]] = [(0.0, tuple(self.thresholds_))]

    def _estimate(self, view: SchedulerView) -> np.ndarray | None:
        est = self._tracker.rates(view.now, view.num_arrived)
        if est is None or self.schedule is not None:
            return est
        # One stream (the total rate), split by the design's mix.
        return None if self._mix is None else self._mix * float(est[0])

    def _resolve(self, rates: np.ndarray) -> np.ndarray:
        d0, d1 = self.eq1_
        design = nested_design(
            self.design_.ends, rates, self._prompt_mean, d0, d1, self._limits, mode=self.thresholds,
            margin=self.margin, eps=self.eps, batch_size=self.batch_size, buffer=self.buffer,
            delta=self.delta, horizon=self.horizon, strict=False,
        )  # fmt: skip
        if not np.array_equal(design.thresholds, self.thresholds_):
            self.design_ = design
        return design.thresholds


# ============================================================================ registry entries

_SOURCE = "seed 002"

#: Seed 002's policies, to merge into :data:`kvsched.heuristics.registry.POLICIES`.
SEED002_POLICIES: dict[str, PolicySpec] = {
    "wait": PolicySpec(
        "wait",
        WAIT,
        "WAIT (known output lengths): one type per distinct (I, O); a type runs only when >= n_j of its "
        "requests wait for prefill, and then advances min(n_j, count) requests from every stage; other "
        "types pause with KV kept. Thresholds from the fluid equilibrium (n_j = ceil(lambda_j dT*)), or the "
        "largest that fit M when overloaded; 'paper' / 'code' give §6.1's formulas. Rates estimated from "
        "the instance; Eq. (1) (d0, d1) from its time model. Once every request has arrived the thresholds "
        "are dropped (drain; not in the paper). Hindsight: needs each request's true O (its type).",
        _SOURCE + " §4, Algorithm 1; §3 fluid model",
        MappingProxyType({"types": "io", "thresholds": "fluid", "margin": 0.0}),
    ),
    "nested-wait": PolicySpec(
        "nested-wait",
        NestedWAIT,
        "Nested WAIT (unknown output lengths): output-length bins (<= 10; distinct lengths or equal-width "
        "bins) cut the stages into nested segments; segments 1..K run, K the longest prefix whose entry "
        "queues hold >= n_k, each advancing min(n_k, count) requests per stage. n_k proportional to the "
        "tail rates Lambda_k (1 + eps)^(k-1), sized from the fluid equilibrium plus Theorem 2's safety "
        "buffer. Overflow evicts LIFO by admission (recompute). Drain rule as WAIT. The design reads the "
        "instance's output distribution (design=outputs, hindsight at design time only); "
        "design=predicted/given do not.",
        _SOURCE + " §5, Algorithm 2, Theorem 2",
        MappingProxyType({"design": "outputs", "segments": 10, "thresholds": "fluid", "eps": 0.05}),
    ),
}

#: Seed 002 §7's extensions, merged into the registry next to :data:`SEED002_POLICIES`.
SEED002_EXTENSIONS: dict[str, PolicySpec] = {
    "wait-adaptive": PolicySpec(
        "wait-adaptive",
        AdaptiveWAIT,
        "WAIT for time-varying arrival rates: before each batch the per-type rates are re-estimated from "
        "the last `window` arrivals (or read from a known piecewise-constant `schedule`) and, when they "
        "moved by more than `tolerance`, the thresholds are re-solved from the fluid equilibrium as in "
        "wait (the paper's 're-solving the fluid equilibrium'; the estimator is ours). Hindsight: needs "
        "each request's true O (its type), as wait.",
        _SOURCE + " §7.1, §8.1; §4 Algorithm 1",
        MappingProxyType({"types": "io", "thresholds": "fluid", "window": 200, "tolerance": 0.1}),
    ),
    "nested-wait-adaptive": PolicySpec(
        "nested-wait-adaptive",
        AdaptiveNestedWAIT,
        "Nested WAIT for time-varying arrival rates: the total arrival rate is re-estimated from the last "
        "`window` arrivals, the segment rates are the design's mix scaled to it, and the thresholds are "
        "re-sized as in nested-wait when the rates moved by more than `tolerance` (types are unknown at "
        "arrival, so the mix is not re-estimated; our reading). Design as nested-wait (segments=auto: "
        "§7.2's segment design).",
        _SOURCE + " §7.1, §8.1; §5 Algorithm 2",
        MappingProxyType(
            {"design": "outputs", "segments": 10, "thresholds": "fluid", "eps": 0.05, "window": 200}
        ),
    ),
}

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
